"""``python -m lightning_grpo fit --config configs/debug/tiny.yaml``: the ``lightning-grpo`` command line."""

from lightning_grpo.cli import main

if __name__ == "__main__":
    main()
