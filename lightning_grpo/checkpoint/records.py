"""What a checkpoint was trained on, and clear errors for checkpoints that cannot be resumed.

A GRPO checkpoint holds the LoRA adapter, not the base weights, so resuming is only right on the base model, LoRA
shape and tokenizer it was trained with. :func:`describe_policy` records those (the base model's name, a
fingerprint of its weights' names, shapes and dtypes plus a small sample of their values, the LoRA rank, alpha and
adapted modules, the vocabulary size); :func:`check_same_policy` refuses a checkpoint whose record differs, naming
the setting and both values. :class:`CheckedCheckpointIO` turns a file that cannot be read into an error that names
it. docs/troubleshooting.md lists the messages and their fixes.
"""

from __future__ import annotations

import hashlib
import math
import pickle
import zipfile
from pathlib import Path
from typing import Any

from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.strategies import Strategy
from peft import PeftModel
from torch.nn import Module
from transformers import PreTrainedTokenizerBase

from lightning_grpo.policy.finite import check_finite

__all__ = [
    "CHECKPOINT_KEY",
    "CheckedCheckpointIO",
    "CheckpointMismatchError",
    "CheckpointWriteError",
    "UnreadableCheckpointError",
    "check_same_policy",
    "describe_policy",
    "install_checked_io",
    "keep_adapter_only",
]

#: Key of this package's record in a Lightning checkpoint.
CHECKPOINT_KEY = "lightning_grpo"
_SAMPLE_VALUES = 4  # values read from the start of each base weight for the fingerprint
_SAMPLE_TOLERANCE = 1e-3  # relative: re-computed warm-ups or other BLAS builds may differ in the last bits


class UnreadableCheckpointError(RuntimeError):
    """A checkpoint file that cannot be read: empty, truncated, damaged or not a checkpoint."""


class CheckpointWriteError(OSError):
    """A checkpoint that could not be written (a full disk, a file size limit); the previous one is left intact."""


class CheckpointMismatchError(ValueError):
    """A checkpoint trained on another base model, LoRA shape or tokenizer than the run resuming it."""


def describe_policy(policy: PeftModel, tokenizer: PreTrainedTokenizerBase, model: Any) -> dict[str, Any]:
    """What the adapter is trained on, as plain values (checkpoints load with ``torch.load(weights_only=True)``).

    Args:
        policy: The policy, before any sharding.
        tokenizer: Its tokenizer.
        model: The ``model`` argument of the module (a name or path, or a model object).

    Returns:
        ``base_model`` (name, path or class), ``base_weights`` (hash of names, shapes and dtypes), ``base_sample``
        (a few values per weight), ``lora_r``, ``lora_alpha``, ``target_modules`` (adapted module names) and
        ``vocab_size``.
    """
    lora = policy.peft_config[policy.active_adapter]
    base = {_base_name(name): param for name, param in policy.named_parameters() if "lora_" not in name}
    layout = hashlib.sha256()
    sample: list[float] = []
    for name in sorted(base):
        param = base[name]
        layout.update(f"{name}:{tuple(param.shape)}:{param.dtype};".encode())
        if param.device.type != "meta":
            sample.extend(param.detach().reshape(-1)[:_SAMPLE_VALUES].float().cpu().tolist())
    adapted = {
        name.split(".lora_A")[0].rsplit(".", 1)[-1] for name, _ in policy.named_parameters() if ".lora_A" in name
    }
    return {
        "base_model": _model_name(model),
        "base_weights": layout.hexdigest()[:16],
        "base_sample": sample,
        "lora_r": int(lora.r),
        "lora_alpha": float(lora.lora_alpha),
        "target_modules": sorted(adapted),
        "vocab_size": len(tokenizer),
    }


def check_same_policy(saved: dict[str, Any] | None, current: dict[str, Any], path: str | Path | None) -> None:
    """Refuse to resume an adapter on another base model, LoRA shape or tokenizer than it was trained with.

    Args:
        saved: The checkpoint's :func:`describe_policy` record (``None`` for checkpoints written before it existed:
            nothing to compare).
        current: This run's record.
        path: The checkpoint, for the message.

    Raises:
        CheckpointMismatchError: Naming each setting that differs, with the checkpoint's value and this run's.
    """
    if not saved:
        return
    differences = [
        f"  {setting}: checkpoint {saved.get(key)!r}, this run {current[key]!r}"
        for setting, key in (
            ("policy.lora_r", "lora_r"),
            ("policy.lora_alpha", "lora_alpha"),
            ("policy.target_modules", "target_modules"),
            ("tokenizer (vocabulary size)", "vocab_size"),
        )
        if saved.get(key) != current[key]
    ]
    if saved.get("base_weights") != current["base_weights"]:
        differences.append(_model_difference(saved, current, "weight names, shapes or dtypes differ"))
    elif not _same_sample(saved.get("base_sample", []), current["base_sample"]):
        differences.append(_model_difference(saved, current, "same shapes, different weight values"))
    if differences:
        raise CheckpointMismatchError(
            f"cannot resume from checkpoint {path}: it was trained on another policy than this run builds\n"
            + "\n".join(differences)
            + "\nResume with the settings the checkpoint was trained with, or start a new run without a checkpoint."
        )


class CheckedCheckpointIO(CheckpointIO):
    """Wraps a strategy's ``CheckpointIO`` so that a checkpoint which cannot be read gets an error naming the file.

    Saving and removing are the wrapped plugin's; loading translates torch's errors for empty, truncated or damaged
    files (a bare ``EOFError``, "PytorchStreamReader failed reading zip archive", an unpickling error) into
    :class:`UnreadableCheckpointError`.

    Args:
        checkpoint_io: The plugin to wrap.
    """

    def __init__(self, checkpoint_io: CheckpointIO) -> None:
        self.checkpoint_io = checkpoint_io

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Save with the wrapped plugin, into a temporary file renamed over ``path`` once complete (local paths).

        Raises:
            CheckpointWriteError: The write failed (e.g. ``[Errno 27] File too large``, ``[Errno 28] No space left``):
                the message names the file and the previous checkpoint, which is intact.
        """
        local = isinstance(path, str | Path) and "://" not in str(path)
        target = Path(path)
        partial = target.with_name(f".{target.name}.partial") if local else target
        try:
            self.checkpoint_io.save_checkpoint(checkpoint, partial, storage_options=storage_options)
            if local:
                partial.replace(target)
        except OSError as error:
            if local:
                partial.unlink(missing_ok=True)
            raise CheckpointWriteError(error.errno, write_failed_message(target, error)) from error

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Load with the wrapped plugin; a file it cannot read raises :class:`UnreadableCheckpointError`."""
        try:
            return self.checkpoint_io.load_checkpoint(path, *args, **kwargs)
        except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, UnicodeDecodeError) as error:
            raise UnreadableCheckpointError(unreadable_message(path, error)) from None

    def remove_checkpoint(self, path: Any) -> None:
        """Remove with the wrapped plugin."""
        self.checkpoint_io.remove_checkpoint(path)

    def teardown(self) -> None:
        """Tear the wrapped plugin down."""
        self.checkpoint_io.teardown()


def install_checked_io(strategy: Strategy) -> None:
    """Wrap ``strategy.checkpoint_io`` in a :class:`CheckedCheckpointIO` (once)."""
    if not isinstance(strategy.checkpoint_io, CheckedCheckpointIO):
        strategy.checkpoint_io = CheckedCheckpointIO(strategy.checkpoint_io)


def write_failed_message(path: Path, error: OSError) -> str:
    """The message for a checkpoint that could not be written: the file, the reason, the checkpoint that is safe."""
    earlier = sorted(path.parent.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    if path.exists():  # a file rewritten at each save (last.ckpt): the write went to a temporary file
        safe = f"{path} still holds the previous checkpoint, intact: resume from it with --ckpt_path {path}"
    elif earlier:
        safe = f"the previous checkpoint {earlier[-1]} is intact: resume from it with --ckpt_path {earlier[-1]}"
    else:
        safe = "no earlier checkpoint was touched"
    reason = error.strerror or str(error)
    return (
        f"could not write checkpoint {path}: {reason} (errno {error.errno}); the disk may be full or a file size "
        f"limit reached. Nothing was written under that name, and {safe}. Free space and run again."
    )


def unreadable_message(path: Any, error: BaseException) -> str:
    """The message for a checkpoint file that torch cannot read; it never suggests ``weights_only=False``."""
    size = Path(path).stat().st_size if Path(path).is_file() else None
    if size == 0:
        reason = "the file is empty"
    elif isinstance(error, EOFError) or "central directory" in str(error) or "zip archive" in str(error):
        reason = "the file is truncated or is not a torch checkpoint"
    elif isinstance(error, pickle.UnpicklingError) or "weights_only" in str(error):
        reason = "the file is not a checkpoint written by Lightning (or it is damaged)"  # torch's text advises unsafe
    else:
        reason = f"{type(error).__name__}: {error}"
    return (
        f"cannot read checkpoint {path} ({size} bytes): {reason}. It may have been cut short by a full disk or a "
        "killed process: resume from an earlier checkpoint, or start without one."
    )


def _base_name(name: str) -> str:
    """A base weight's name without peft's wrapping, so it does not depend on which modules are adapted."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def _model_name(model: Any) -> str:
    if isinstance(model, str | Path):
        return str(model)
    name = getattr(model, "name_or_path", "") or getattr(getattr(model, "config", None), "_name_or_path", "")
    return name or type(model).__name__


def _model_difference(saved: dict[str, Any], current: dict[str, Any], why: str) -> str:
    return (
        f"  model (base weights: {why}): checkpoint {saved.get('base_model')!r} [{saved.get('base_weights')}], "
        f"this run {current['base_model']!r} [{current['base_weights']}]"
    )


def _same_sample(saved: list[float], current: list[float]) -> bool:
    if len(saved) != len(current):
        return False
    return all(math.isclose(a, b, rel_tol=_SAMPLE_TOLERANCE, abs_tol=1e-6) for a, b in zip(saved, current, strict=True))


def keep_adapter_only(checkpoint: dict[str, Any], module: Module, record: dict[str, Any]) -> None:
    """Drop the frozen base weights from a Lightning ``checkpoint`` (only ``module``'s trainable parameters stay)
    and store ``record`` (what the checkpoint was trained on) under :data:`CHECKPOINT_KEY`.

    Raises:
        NonFiniteError: An adapter weight holds a NaN or an infinity: the checkpoint is not written.
    """
    trainable = {name for name, param in module.named_parameters() if param.requires_grad}
    checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
    check_finite(checkpoint["state_dict"].items(), "write a checkpoint")  # the previous checkpoint stays the last
    checkpoint[CHECKPOINT_KEY] = record
