"""Lightning's lines that say nothing useful about a GRPO fit, dropped (installed on import).

* ``Seed set to <n>`` (the config, or the code, names the seed);
* ``GPU available: False, used: False`` and ``TPU available: False, using: 0 TPU cores``, when nothing is available
  (on a GPU machine both stay);
* the warning ``Total length of `list` across ranks is zero`` of a fit without validation data, and two that no
  user can act on: Lightning's own use of the deprecated ``LeafSpec``, and ``weights_only`` not being set when it
  writes a (full, resumable) checkpoint.
"""

from __future__ import annotations

import logging
import re
import warnings

__all__ = ["install"]

_NOTHING_AVAILABLE = re.compile(r"^(GPU available: False, used: False|TPU available: False, using: 0 TPU cores)$")


def _drop_seed(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Seed set to")


def _drop_weights_only(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("`weights_only` was not set")


def _drop_absent_devices(record: logging.LogRecord) -> bool:
    return not _NOTHING_AVAILABLE.match(record.getMessage())


def install() -> None:
    """Add the filters to Lightning's loggers and the warnings filter (idempotent)."""
    for name, drop in (
        ("lightning.fabric.utilities.seed", _drop_seed),
        ("lightning.pytorch.utilities.rank_zero", _drop_absent_devices),
        ("lightning.pytorch.trainer.connectors.checkpoint_connector", _drop_weights_only),
    ):
        logger = logging.getLogger(name)
        if drop not in logger.filters:
            logger.addFilter(drop)
    warnings.filterwarnings("ignore", message="Total length of `list` across ranks is zero")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
