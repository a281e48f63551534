"""The ``lightning-grpo`` command line (also ``python -m lightning_grpo``): :class:`GRPOCLI`, Lightning's
``LightningCLI`` for GRPO (:mod:`~lightning_grpo.cli.command`), its parser (:mod:`~lightning_grpo.cli.argument_parser`)
and what it checks before parsing (:mod:`~lightning_grpo.cli.argument_checks`) or building
(:mod:`~lightning_grpo.cli.config_checks`), the one-line errors of a bad setting (:mod:`~lightning_grpo.cli.errors`,
:mod:`~lightning_grpo.cli.misspelt_settings`, :mod:`~lightning_grpo.cli.moved_settings`,
:mod:`~lightning_grpo.cli.import_paths`), resuming a run (:mod:`~lightning_grpo.cli.resume`) and what a fit prints at
its end (:mod:`~lightning_grpo.cli.summary`)."""

from lightning_grpo.cli.command import GRPOCLI, main, parse_config
from lightning_grpo.cli.misspelt_settings import misspelt_setting

__all__ = ["GRPOCLI", "main", "misspelt_setting", "parse_config"]
