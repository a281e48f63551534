"""The non-finite guard of the update loop: a NaN or infinite loss, KL, ratio or gradient is never applied.

:func:`~lightning_grpo.iteration.update.run_updates` checks each mini-batch before its optimizer step. Every rank
agrees (one small all-reduce), so under DDP and FSDP2 all ranks skip or stop together. With
``GRPOConfig(faults=FaultConfig(on_nonfinite="stop"))`` (the default) the run stops with
:class:`~lightning_grpo.policy.NonFiniteError` naming the step and the quantity; with ``"skip"`` the rest of the GRPO
iteration is skipped with a warning, at most ``max_skipped_steps`` times in a run.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from lightning_grpo.iteration.context import IterationContext
from lightning_grpo.policy.finite import LIKELY_CAUSES, NonFiniteError

__all__ = [
    "QUANTITIES",
    "gradient_flag",
    "nonfinite_flags",
    "nonfinite_sampling",
    "step_is_finite",
    "step_is_finite_with_tokens",
]

#: The quantities checked, in the order of the flags.
QUANTITIES = ("loss", "policy loss", "KL", "ratio", "gradient norm")


def nonfinite_flags(loss: Tensor, metrics: dict[str, Tensor]) -> Tensor:
    """``(4,)`` flags, 1.0 where a micro-batch's loss, policy loss, KL or log-ratio (``approx_kl``) is not finite."""
    terms = [loss, metrics.get("pg_loss"), metrics.get("kl"), metrics.get("approx_kl")]
    return torch.stack([_bad(term, loss.device) for term in terms])


def gradient_flag(parameters: Iterable[nn.Parameter], device: torch.device) -> Tensor:
    """``(1,)``: 1.0 when a gradient of ``parameters`` (this rank's shard under FSDP2) holds a NaN or an infinity.

    One fused float32 norm per device over all gradients (a NaN or an infinity makes its norm non-finite), computed
    where the gradients are: no host sync, a few kernel launches rather than one per parameter.
    """
    grads: dict[torch.device, list[Tensor]] = {}
    for grad in (p.grad for p in parameters):
        if grad is not None:
            local = grad.to_local() if hasattr(grad, "to_local") else grad
            grads.setdefault(local.device, []).append(local)
    bad = torch.zeros((), dtype=torch.bool, device=device)
    for group in grads.values():
        wide = torch.float64 if any(g.dtype == torch.float64 for g in group) else torch.float32  # never narrowed
        norms = torch._foreach_norm(group, 2.0, dtype=wide)
        bad = bad | ~torch.stack(norms).isfinite().all().to(device)
    return bad.float().reshape(1)


def step_is_finite(context: IterationContext, flags: Tensor, *, on_nonfinite: str, max_skipped: int) -> bool:
    """Whether the optimizer may step: every flag is zero on every rank (a collective, one all-reduce).

    Otherwise the step is skipped (``False``, with a warning, recorded in ``context.skipped``) or, with
    ``on_nonfinite="stop"`` or once ``max_skipped`` steps were skipped, the run stops.

    Raises:
        NonFiniteError: Naming the step, the non-finite quantities and the likely causes.
    """
    return _decide(context, context.sum_across_ranks(flags.float()).tolist(), on_nonfinite, max_skipped)


def step_is_finite_with_tokens(
    context: IterationContext, flags: Tensor, num_tokens: Tensor, *, on_nonfinite: str, max_skipped: int
) -> tuple[bool, float]:
    """:func:`step_is_finite`, and the mini-batch's global loss-token count ``num_tokens`` (0-dim, already summed
    over ranks: the same on every rank) brought to the host in the same copy: still one host sync per step.

    Raises:
        NonFiniteError: As :func:`step_is_finite`.
    """
    total = context.sum_across_ranks(flags.float())
    *counts, tokens = torch.cat([total, num_tokens.detach().reshape(1).to(total)]).tolist()
    return _decide(context, counts, on_nonfinite, max_skipped), tokens


@contextmanager
def nonfinite_sampling(step: int) -> Iterator[None]:
    """Turn torch's sampling error on NaN or infinite probabilities (a weight that turned non-finite) into a
    :class:`~lightning_grpo.policy.NonFiniteError` naming the step.

    Whether ``torch.multinomial`` raises on a NaN row depends on the CPU's kernels; where it does not, the step's loss
    check stops the run instead.
    """
    try:
        yield
    except RuntimeError as error:
        if "probability tensor contains" not in str(error):
            raise
        raise NonFiniteError(
            f"step {step}: sampling met non-finite probabilities (NaN or infinity in the policy's logits); the run "
            f"stops: nothing non-finite was saved. {LIKELY_CAUSES}"
        ) from error


def _bad(term: Tensor | None, device: torch.device) -> Tensor:
    if term is None:
        return torch.zeros((), device=device)
    return (~torch.isfinite(term.detach().float())).any().float().to(device)


def _decide(context: IterationContext, counts: list[float], on_nonfinite: str, max_skipped: int) -> bool:
    """The guard's decision from the flags summed over ranks, on the host (see :func:`step_is_finite`)."""
    if not any(counts):
        return True
    names = ", ".join(name for name, count in zip(QUANTITIES, counts, strict=True) if count)
    what = f"step {context.global_step}: non-finite {names} (NaN or infinity); the update was not applied"
    if on_nonfinite == "skip" and len(context.skipped) < max_skipped:
        context.skipped.append(context.global_step)
        rank_zero_warn(f"{what} and the step is skipped ({len(context.skipped)} of {max_skipped}). {LIKELY_CAUSES}")
        return False
    skipped = f" after {len(context.skipped)} skipped step(s)" if context.skipped else ""
    raise NonFiniteError(f"{what}{skipped}, and the run stops: nothing non-finite was saved. {LIKELY_CAUSES}")
