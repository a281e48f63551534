"""``python -m lightning_grpo.demo``: the offline demo, as ``lightning-grpo demo`` runs it."""

from lightning_grpo.demo import main

if __name__ == "__main__":
    main(prog="python -m lightning_grpo.demo")
