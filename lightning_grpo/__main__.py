"""``python -m lightning_grpo fit --config configs/debug/tiny.yaml``: the ``lightning-grpo`` command line.

``python -m lightning_grpo demo`` runs the offline demo (:mod:`lightning_grpo.testing.demo`).
"""

from lightning_grpo.cli import main

if __name__ == "__main__":
    main()
