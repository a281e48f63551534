"""Non-finite values: the error a run stops with, and the check that keeps them out of checkpoints and adapters."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["LIKELY_CAUSES", "NonFiniteError", "check_finite"]

#: What usually makes a GRPO loss, ratio, KL or gradient non-finite; every message ends with it.
LIKELY_CAUSES = (
    "Likely causes: a learning rate too high for the adapter (lower optimizer.init_args.lr), half precision "
    "overflowing (try bf16 or float32), a reward of extreme magnitude, or a weight that was already NaN or infinite "
    "(resume from an earlier checkpoint). GRPOConfig(faults=FaultConfig(on_nonfinite='skip')) skips such steps "
    "instead, a few times."
)


class NonFiniteError(FloatingPointError):
    """A loss, KL, ratio, gradient norm or weight that is NaN or infinite; nothing was applied or written."""


def check_finite(tensors: Iterable[tuple[str, Tensor]], action: str) -> None:
    """Refuse ``action`` (``"write checkpoint x.ckpt"``) when any named tensor holds a NaN or an infinity.

    Example::

        >>> check_finite([("lora_A", torch.zeros(2))], "write the adapter")
        >>> check_finite([("lora_A", torch.tensor([0.0, float("nan")]))], "write the adapter")
        Traceback (most recent call last):
        ...
        lightning_grpo.policy.finite.NonFiniteError: refusing to write the adapter: 1 non-finite value(s) in lora_A. ...

    Raises:
        NonFiniteError: Naming the tensors and their counts of non-finite values, and the likely causes.
    """
    bad = {}
    for name, tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor shard: this rank's part
        if local.is_floating_point() or local.is_complex():
            count = int((~torch.isfinite(local.detach())).sum())
            if count:
                bad[name] = count
    if bad:
        listed = ", ".join(
            f"{name}" if len(bad) > 3 else f"{count} non-finite value(s) in {name}"
            for name, count in list(bad.items())[:3]
        )
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        total = f"{sum(bad.values())} non-finite value(s) in " if len(bad) > 3 else ""
        raise NonFiniteError(f"refusing to {action}: {total}{listed}{more}. {LIKELY_CAUSES}")
