"""How far the sampler's log-probs are from the trainer's: the gap the rollout corrections correct.

A rollout engine (vLLM, another dtype or kernel) samples from ``π_behaviour``, close to, but not exactly, the
trainer's ``π_old``. With top-k, top-p or min-p it samples from ``π_behaviour`` renormalised over a kept set ``S``, and
records those log-probs; the trainer's log-prob on the same set is ``log π(y) - log π(S)`` (``log π(S)``: the kept log
mass, replayed from the sampler's margins, detached). :func:`lifted_behaviour` moves the sampler's log-probs onto the
trainer's full-vocabulary scale instead, ``log μ(y) + log π(S)``, so that every ratio ``π(y) / μ(y)`` taken against it
is the ratio on the kept set while the trainer's own log-probs (KL, entropy, gradient) stay over the whole vocabulary
(docs/math.md, "Truncated sampling"). :func:`rollout_agreement` measures ``|logprobs - behaviour logprobs|`` over the
loss tokens and the raw ratio's mean, before any cap or mask; the corrections themselves (truncated or masked importance
weights, rejection) are :mod:`~lightning_grpo.algorithms.corrections`' components
(``GRPOConfig.corrections.rollout_correction``, docs/vllm.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_grpo.algorithms.statistics import masked_mean

__all__ = ["lifted_behaviour", "rollout_agreement"]


def lifted_behaviour(behaviour_logprobs: Tensor | None, kept_log_mass: Tensor | None) -> Tensor | None:
    """The sampler's log-probs on the trainer's scale: ``behaviour + kept_log_mass`` (``(n, T)``, or unchanged when
    either is ``None``: no sampler log-probs, or nothing truncated).

    ``kept_log_mass`` must be of the same weights as the log-probs the result is compared with: then
    ``logprobs - lifted = (logprobs - kept_log_mass) - behaviour``, the log-ratio on the sampler's kept set.

    Example::

        >>> lifted_behaviour(torch.tensor([[-0.5]]), torch.tensor([[-0.2]]))  # kept mass e^-0.2 of the trainer's
        tensor([[-0.7000]])
    """
    if behaviour_logprobs is None or kept_log_mass is None:
        return behaviour_logprobs
    return behaviour_logprobs.to(kept_log_mass.device) + kept_log_mass.detach()


def rollout_agreement(logprobs: Tensor, behaviour_logprobs: Tensor | None, loss_mask: Tensor) -> dict[str, Tensor]:
    """``rollout_logprob_diff_mean``/``_max``: ``|logprobs - behaviour_logprobs|`` over the ``(n, T)`` loss tokens, and
    ``rollout_ratio_raw_mean``: the token mean of ``exp(logprobs - behaviour_logprobs)``, before any cap or mask (1 on
    a policy that has not changed, whatever the truncation: pass :func:`lifted_behaviour`'s values).

    Meaningful only while the training log-probs are those of the weights that sampled (before the step's first
    optimizer step); empty for a rollout without behaviour log-probs (``None``).

    Example::

        >>> logprobs, behaviour = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]])
        >>> {k: round(float(v), 4) for k, v in rollout_agreement(logprobs, behaviour, torch.ones(1, 2)).items()}
        {'rollout_logprob_diff_mean': 0.25, 'rollout_logprob_diff_max': 0.5, 'rollout_ratio_raw_mean': 1.3244}
    """
    if behaviour_logprobs is None:
        return {}
    log_ratio, mask = logprobs.detach() - behaviour_logprobs.to(logprobs.device), loss_mask.bool()  # (n, T)
    diff = log_ratio.abs()
    worst = torch.where(mask, diff, torch.zeros_like(diff)).amax() if diff.numel() else diff.new_zeros(())
    ratio = masked_mean(log_ratio.double().exp(), mask).float()
    return {
        "rollout_logprob_diff_mean": masked_mean(diff, mask),
        "rollout_logprob_diff_max": worst,
        "rollout_ratio_raw_mean": ratio,
    }
