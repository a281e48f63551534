"""Checkpoints and resuming: what a checkpoint was trained on, unreadable files, changed settings on resume.

:mod:`~lightning_grpo.checkpoint.records` records the policy a checkpoint holds the adapter of and refuses another;
:mod:`~lightning_grpo.checkpoint.resume` applies changed optimizer settings when a run resumes;
:mod:`~lightning_grpo.checkpoint.old_settings` reads an older checkpoint's ``grpo`` settings in today's names.
"""

from lightning_grpo.checkpoint.records import (
    CHECKPOINT_KEY,
    CheckedCheckpointIO,
    CheckpointMismatchError,
    CheckpointWriteError,
    UnreadableCheckpointError,
    check_same_policy,
    describe_policy,
    install_checked_io,
    keep_adapter_only,
)
from lightning_grpo.checkpoint.resume import check_resume, settings_of

__all__ = [
    "CHECKPOINT_KEY",
    "CheckedCheckpointIO",
    "CheckpointMismatchError",
    "CheckpointWriteError",
    "UnreadableCheckpointError",
    "check_resume",
    "check_same_policy",
    "describe_policy",
    "install_checked_io",
    "keep_adapter_only",
    "settings_of",
]
