"""The peers' normalisers, each a setting of its component, off by default (docs/coming-from.md).

Three components divide by another count than ours in verl 0.9.1 or TRL 1.16; a setting of each reproduces the peer:

* ``loss_kind: gmpo`` with ``loss_kind_args: {rows: all}`` (verl ``geo_mean``): the ``seq-mean-*`` aggregations
  count every row of the mini-batch, fully masked ones included, instead of the rows with loss tokens
  (``with_tokens``, the default).
* ``rollout_rejection`` with ``rollout_rejection_args: {normalise: kept}`` (verl ``rollout_rs``): the policy loss's
  normaliser counts the kept sequences' tokens and rows only, as verl's response mask without the rejected ones;
  ``all`` (the default) counts the rejected ones too.
* ``token_selection: top_entropy`` with ``token_selection_args: {entropy_over: selected}`` (TRL
  ``top_entropy_quantile``): the entropy bonus is the mean over the selected tokens instead of over all loss tokens
  (``loss_tokens``, the default).

The first two are factors on the aggregated policy loss, ``ours' normaliser / the peer's``, from counts over the whole
mini-batch summed over ranks (:func:`peer_normalisers`), so they are global like ``LossCounts``. The selection is
made per micro-batch from the entropies of its forward, so the third's count is the micro-batch's
(:func:`selected_entropy_scale`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from lightning_grpo.algorithms.aggregation import count_sequences
from lightning_grpo.algorithms.corrections import build_correction

__all__ = ["PeerNormalisers", "kept_rejection", "peer_normalisers", "selected_entropy_scale"]

Normaliser = Literal["tokens", "sequences", "none"]


@dataclass(frozen=True)
class PeerNormalisers:
    """The factor on the aggregated policy loss that swaps our normaliser for the peer's (global, 0-dim).

    Attributes:
        policy_scale: ``our count / the peer's count`` of the mini-batch over every rank (float64).
    """

    policy_scale: Tensor


def peer_normalisers(
    loss_mask: Tensor,
    settings: Any,
    corrections: Any,
    *,
    old_logprobs: Tensor | None,
    behaviour_logprobs: Tensor | None,
    sum_across_ranks: Callable[[Tensor], Tensor] | None = None,
) -> PeerNormalisers | None:
    """The policy loss's factor for the mini-batch ``loss_mask``; ``None`` when no peer setting is on.

    Args:
        loss_mask: ``(N, T)`` loss tokens of the mini-batch on this rank (or of one micro-batch: then its counts).
        settings: The loss settings (``GRPOConfig.objective``: ``loss_kind``, ``loss_kind_args``, ``loss_agg_mode``).
        corrections: The off-policy corrections (``GRPOConfig.corrections``), or ``None``.
        old_logprobs: ``(N, T)`` old log-probs, for the rejection; ``None`` with ``normalise: kept``: ``None`` is
            returned (the caller counts each micro-batch on its own).
        behaviour_logprobs: ``(N, T)`` the sampler's log-probs, for the rejection.
        sum_across_ranks: Sums the counts over ranks (one reduce); ``None``: this process only.

    Example::

        >>> from types import SimpleNamespace
        >>> args = {"rows": "all"}
        >>> gmpo = SimpleNamespace(loss_kind="gmpo", loss_kind_args=args, loss_agg_mode="seq-mean-token-mean")
        >>> mask = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])  # 4 rows, 3 with tokens
        >>> peer_normalisers(mask, gmpo, None, old_logprobs=None, behaviour_logprobs=None).policy_scale
        tensor(0.7500, dtype=torch.float64)
    """
    all_rows = settings.loss_kind == "gmpo" and (settings.loss_kind_args or {}).get("rows") == "all"
    rejection = kept_rejection(corrections)
    if not all_rows and rejection is None:
        return None
    mode = _normaliser(settings.loss_agg_mode)
    kept = loss_mask.to(torch.float64)
    if rejection is not None:
        if old_logprobs is None or behaviour_logprobs is None:
            return None
        behaviour = behaviour_logprobs.to(loss_mask.device)
        kept = kept * rejection.keep(old_logprobs.detach(), behaviour, loss_mask).to(kept)  # (N, T)
    local = torch.stack(
        [
            loss_mask.sum(),
            count_sequences(loss_mask),
            loss_mask.new_tensor(float(loss_mask.shape[0])),
            kept.sum(),
            count_sequences(kept),
        ]
    ).to(torch.float64)
    if sum_across_ranks is not None:
        local = sum_across_ranks(local)  # one reduce: every rank gets the same factor
    tokens, sequences, rows, kept_tokens, kept_sequences = local.unbind()
    ours, theirs = {
        "tokens": (tokens, kept_tokens),
        "sequences": (sequences, rows if all_rows else kept_sequences),
        "none": (tokens.new_tensor(1.0), tokens.new_tensor(1.0)),
    }[mode]
    return PeerNormalisers(ours.clamp(min=1) / theirs.clamp(min=1))


def selected_entropy_scale(selection: Any, selected: Tensor, loss_mask: Tensor) -> float | Tensor:
    """The factor on the selected tokens' entropy that makes the bonus their mean (``entropy_over: selected``).

    ``loss tokens / selected tokens`` of the micro-batch (the selection's own counts); 1 at ``loss_tokens``. Under
    ``token-mean`` the bonus is then the selected tokens' mean entropy, weighted by the micro-batch's share of the
    mini-batch's loss tokens: TRL's bonus on one micro-batch.

    Example::

        >>> from types import SimpleNamespace
        >>> selected = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
        >>> selected_entropy_scale(SimpleNamespace(entropy_over="selected"), selected, torch.ones(1, 4))
        tensor(2.)
    """
    if getattr(selection, "entropy_over", "loss_tokens") != "selected":
        return 1.0
    return loss_mask.to(selected.dtype).sum() / selected.sum().clamp(min=1)


def kept_rejection(corrections: Any) -> Any:
    """The rollout rejection of ``corrections`` when it counts the kept sequences (``normalise: kept``), else ``None``.

    It needs the old log-probs of the whole mini-batch before its first micro-batch: the old pass runs even for a
    rollout that serves one update (:func:`~lightning_grpo.iteration.update.sampling_logprobs`).
    """
    if corrections is None or corrections.rollout_rejection is None:
        return None
    rejection = build_correction("rollout_rejection", corrections.rollout_rejection, corrections.rollout_rejection_args)
    return rejection if getattr(rejection, "normalise", "all") == "kept" else None


def _normaliser(mode: str) -> Normaliser:
    """What ``mode`` divides the summed loss by."""
    if mode == "token-mean":
        return "tokens"
    return "sequences" if mode.startswith("seq-mean") else "none"
