"""The ``lightning-grpo`` command line (also ``python -m lightning_grpo``): :class:`GRPOCLI`, Lightning's
``LightningCLI`` for GRPO (:mod:`~lightning_grpo.cli.command`), the one-line errors of a bad setting
(:mod:`~lightning_grpo.cli.errors`) and what a fit prints at its end (:mod:`~lightning_grpo.cli.summary`)."""

from lightning_grpo.cli.command import GRPOCLI, main, misspelt_setting, parse_config

__all__ = ["GRPOCLI", "main", "misspelt_setting", "parse_config"]
