"""One log-prob pass of the policy over a rollout's completions: the policy's own, or the reference's (the policy with
its adapter disabled), on the same path whether the policy is sharded or not."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from torch import nn

from lightning_grpo import distributed
from lightning_grpo.policy import reference_mode
from lightning_grpo.rollout import Rollout, TokenLogProbs, completion_logprobs
from lightning_grpo.rollout.packing import sharded_logprob_settings

__all__ = ["policy_logprobs"]


def policy_logprobs(
    policy: nn.Module, rollout: Rollout, settings: dict[str, Any], *, reference: bool, with_entropy: bool
) -> TokenLogProbs:
    """Per-token log-probs ``(N, T)`` of ``rollout``'s completions under ``policy``, or under its reference.

    Under FSDP2 every pass (old, reference, current) takes the same path (:func:`~lightning_grpo.rollout.packing.
    sharded_logprob_settings`). The reference is never compared with the sampler, so its pass computes no kept mass.

    Args:
        policy: The policy (a ``PeftModel``; its adapter is disabled for the reference).
        rollout: The completions.
        settings: Keyword settings of :func:`~lightning_grpo.rollout.completion_logprobs`
            (``GRPOModule.logprob_settings``).
        reference: The reference's log-probs instead of the policy's.
        with_entropy: Also the per-token entropy.
    """
    if distributed.is_sharded(policy):
        settings = sharded_logprob_settings(policy, settings)
    with reference_mode(policy) if reference else nullcontext():
        kept = not reference
        return completion_logprobs(policy, rollout, with_entropy=with_entropy, with_kept_mass=kept, **settings)
