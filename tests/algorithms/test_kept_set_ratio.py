"""Issue 65 item 1, the trainer's side: every ratio against the sampler is on the sampler's kept set.

A sampler that truncates (top-k here) records ``log μ(y)`` over its kept set ``S``; the trainer's full-vocabulary
``log π(y)`` minus its kept log mass ``log π(S)`` is the same quantity. With the mass given, the raw ratio, the rollout
correction's weights and ``old_logprobs: rollout``'s PPO ratio are exactly 1 on an unchanged policy; without it they
carry ``π(S)`` (the field-wide bias of TRL issue 6789). The KL and the gradient stay the full-vocabulary ones.
"""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.algorithms import aggregate_loss
from lightning_grpo.algorithms.importance import lifted_behaviour
from lightning_grpo.algorithms.objective import grpo_loss
from lightning_grpo.config import CorrectionConfig, GRPOConfig
from lightning_grpo.iteration.batch_loss import batch_loss
from lightning_grpo.iteration.types import LossCounts, UpdateBatch
from lightning_grpo.rollout import Rollout, TokenLogProbs

F64 = torch.float64


def _truncated(seed: int, top_k: int = 5, n: int = 4, t: int = 6, v: int = 40):
    """Full log-probs of sampled tokens, the sampler's top-k log-probs and the kept log mass, from one set of logits."""
    gen = torch.Generator().manual_seed(seed)
    z = 2 * torch.randn(n, t, v, generator=gen, dtype=F64)
    kept = z >= z.topk(top_k, dim=-1).values[..., -1:]  # (n, t, v)
    probs = torch.softmax(z.masked_fill(~kept, float("-inf")), -1)
    tokens = torch.multinomial(probs.view(-1, v), 1, generator=gen).view(n, t)
    full = torch.log_softmax(z, -1).gather(-1, tokens[..., None]).squeeze(-1)
    behaviour = torch.log(probs).gather(-1, tokens[..., None]).squeeze(-1)
    mass = torch.logsumexp(z.masked_fill(~kept, float("-inf")), -1) - torch.logsumexp(z, -1)
    mask = torch.ones(n, t, dtype=F64)
    mask[1, 4:] = 0
    return full, behaviour, mass, mask


def _loss(cfg, logprobs, mask, **kwargs):
    aggregate = lambda values: aggregate_loss(values, mask, "token-mean")  # noqa: E731
    entropy = torch.zeros_like(logprobs)
    adv = torch.linspace(-1, 1, len(mask), dtype=F64)
    return grpo_loss(logprobs, entropy, adv, mask, cfg.objective, aggregate, corrections=cfg.corrections, **kwargs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_raw_ratio_is_one_on_the_kept_set_and_the_kept_mass_without(seed):
    full, behaviour, mass, mask = _truncated(seed)
    cfg = GRPOConfig()
    _, lifted = _loss(cfg, full, mask, behaviour_logprobs=behaviour, at_sampling_weights=True, kept_log_mass=mass)
    assert lifted["rollout_ratio_raw_mean"].item() == pytest.approx(1.0, abs=1e-6)
    assert lifted["rollout_logprob_diff_max"].item() < 1e-6
    _, plain = _loss(cfg, full, mask, behaviour_logprobs=behaviour, at_sampling_weights=True)
    expected = (mass.exp() * mask).sum() / mask.sum()  # the ratio's mean is the kept mass
    assert plain["rollout_ratio_raw_mean"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert expected.item() < 0.95  # top-5 of 40 keeps visibly less than all the mass: the test can fail


def test_the_rollout_correction_compares_the_old_kept_log_probs():
    full, behaviour, mass, mask = _truncated(3)
    cfg = GRPOConfig(corrections=CorrectionConfig(rollout_correction="token_mask", rollout_correction_args={"max": 2}))
    old = full + 0.01  # recomputed old log-probs (one more update ago): the old pass's mass goes with them
    _, metrics = _loss(cfg, full, mask, behaviour_logprobs=behaviour, old_logprobs=old, old_kept_log_mass=mass)
    assert metrics["rollout_is_weight_mean"].item() == pytest.approx(torch.tensor(0.01).exp().item(), rel=1e-6)
    _, biased = _loss(cfg, full, mask, behaviour_logprobs=behaviour, old_logprobs=old)
    assert biased["rollout_is_weight_mean"].item() < 0.95


def test_old_logprobs_rollout_ratio_is_one_and_keeps_the_full_vocabulary_gradient_and_kl():
    full, behaviour, mass, mask = _truncated(4)
    cfg = GRPOConfig(corrections=CorrectionConfig(old_logprobs="rollout"))
    n, t = mask.shape
    ids = torch.zeros(n, t, dtype=torch.long)
    rollout = Rollout(ids[:, :2], torch.ones(n, 2), ids, mask.long(), torch.zeros(n, dtype=torch.bool),
                      torch.arange(n), ["p"] * n, ["c"] * n, logprobs=behaviour)  # fmt: skip
    ref = full - 0.05
    adv = torch.linspace(-1, 1, n, dtype=F64)
    batch = UpdateBatch(rollout, adv, mask, old_logprobs=behaviour, ref_logprobs=ref)
    counts = LossCounts.of(mask, 6.0, lambda x: x)
    logprobs = full.clone().requires_grad_()
    current = TokenLogProbs(logprobs, torch.zeros_like(full), kept_log_mass=mass)
    loss, metrics = batch_loss(current, batch, counts, cfg, seed=0, entropy_coef=0.0)
    (grad,) = torch.autograd.grad(loss, logprobs)
    # the same loss with the sampler on the full-vocabulary scale (ratio 1 by construction): same value and gradient
    same = full.clone().requires_grad_()
    plain = UpdateBatch(rollout, adv, mask, old_logprobs=full, ref_logprobs=ref)
    expected, expected_metrics = batch_loss(TokenLogProbs(same, torch.zeros_like(full)), plain, counts,
                                            GRPOConfig(), seed=0, entropy_coef=0.0)  # fmt: skip
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, torch.autograd.grad(expected, same)[0])
    torch.testing.assert_close(metrics["kl"], expected_metrics["kl"])
    unlifted = GRPOConfig(corrections=CorrectionConfig(old_logprobs="rollout"))
    without_mass = TokenLogProbs(full.clone(), torch.zeros_like(full))  # the ratio then carries π(S) < 1
    assert (batch_loss(without_mass, batch, counts, unlifted, seed=0, entropy_coef=0.0)[0] - loss).abs() > 1e-3


def test_lifted_behaviour_is_a_no_op_without_a_mass():
    behaviour = torch.tensor([[-0.5, -1.0]])
    assert lifted_behaviour(behaviour, None) is behaviour
    assert lifted_behaviour(None, torch.zeros(1, 2)) is None
