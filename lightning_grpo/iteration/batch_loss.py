"""Phase 5 of a GRPO iteration, ``GRPOModule.compute_loss``: the loss of one micro-batch (:func:`batch_loss`).

The micro-batch's current log-probs, entropy and kept log mass, its
:class:`~lightning_grpo.iteration.types.UpdateBatch` (advantages, loss mask, old, reference and behaviour log-probs;
with ``old_logprobs: rollout`` the behaviour's lifted by the current kept log mass) and the mini-batch's global counts
(:class:`~lightning_grpo.iteration.types.LossCounts`) go to the pure
:func:`~lightning_grpo.algorithms.objective.grpo_loss`: ``policy loss + β·KL − c_ent·entropy``, each aggregated over
the global counts, so the loss depends on neither the micro-batch size nor the world size.
"""

from __future__ import annotations

from functools import partial

from torch import Tensor

from lightning_grpo.algorithms.importance import lifted_behaviour
from lightning_grpo.algorithms.objective import grpo_loss
from lightning_grpo.config import GRPOConfig
from lightning_grpo.iteration.types import LossCounts, UpdateBatch
from lightning_grpo.rollout import TokenLogProbs

__all__ = ["batch_loss"]


def batch_loss(
    current: TokenLogProbs,
    batch: UpdateBatch,
    counts: LossCounts,
    config: GRPOConfig,
    *,
    seed: int,
    entropy_coef: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of the micro-batch ``batch`` and its metrics (``pg_loss``, the clip fractions, ``entropy``, ``kl``...).

    Args:
        current: ``(n, T)`` the policy's log-probs and entropy on ``batch.rollout``, with gradient.
        batch: The micro-batch.
        counts: The mini-batch's global counts.
        config: The module's settings (``objective``, ``corrections``).
        seed: The iteration's seed, of the policy loss's random choices (``clip_cov``).
        entropy_coef: This iteration's entropy coefficient.
    """
    aggregate = partial(counts.aggregate, loss_mask=batch.loss_mask, mode=config.objective.loss_agg_mode)  # global
    old, old_mass, mass = batch.old_logprobs, batch.old_kept_log_mass, current.kept_log_mass
    if config.corrections.old_logprobs == "rollout" and old is not None:  # π_old = μ: lifted by the current mass
        old = lifted_behaviour(old, mass)
        old_mass = mass
    return grpo_loss(
        current.logprobs,
        current.entropy,
        batch.advantages,
        batch.loss_mask,
        config.objective,
        aggregate,
        corrections=config.corrections,
        old_logprobs=old,
        ref_logprobs=batch.ref_logprobs,
        behaviour_logprobs=batch.rollout.logprobs,
        at_sampling_weights=batch.at_sampling_weights,
        seed=seed,
        entropy_coef=entropy_coef,
        normalisers=counts.peer,
        kept_log_mass=mass,
        old_kept_log_mass=old_mass,
    )
