"""``grpo_loss`` with issue 38's pieces on: each piece composed as the papers write it, under every aggregation.

The pieces themselves are checked against their formulas in test_rollout_correction.py, test_off_policy.py and
test_entropy_control.py; here the expected loss is assembled token by token in float64 from the policy loss
(``policy_loss``, tested in test_policy_losses.py) and the aggregation (``aggregate_loss``, test_aggregation.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.algorithms import aggregate_loss, policy_loss
from lightning_grpo.algorithms.objective import grpo_loss
from lightning_grpo.config import CorrectionConfig, GRPOConfig, ObjectiveConfig

MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
F64 = torch.float64


def _inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    n, t = 6, 7
    old = -2 * torch.rand(n, t, generator=gen, dtype=F64)
    logprobs = (old + 0.2 * torch.randn(n, t, generator=gen, dtype=F64)).requires_grad_()
    behaviour = old + 0.25 * torch.randn(n, t, generator=gen, dtype=F64)
    ref = old + 0.4 * torch.randn(n, t, generator=gen, dtype=F64)
    entropy = (2 * torch.rand(n, t, generator=gen, dtype=F64)).requires_grad_()
    adv = torch.randn(n, generator=gen, dtype=F64)
    lengths = [7, 2, 5, 0, 3, 6]
    mask = torch.tensor([[j < length for j in range(t)] for length in lengths], dtype=F64)
    return logprobs, old, behaviour, ref, entropy, adv, mask


def _expected(cfg, logprobs, old, behaviour, ref, entropy, adv, mask, mode):
    n, t = mask.shape
    pg, _ = policy_loss(
        logprobs,
        old,
        adv,
        mask,
        kind="clip",
        clip_low=cfg.objective.clip_low,
        clip_high=cfg.objective.clip_high,
        dual_clip=cfg.objective.dual_clip,
    )
    lo, hi = cfg.corrections.rollout_correction_args["min"], cfg.corrections.rollout_correction_args["max"]
    values = [e for i in range(n) for j, e in enumerate(entropy[i].tolist()) if mask[i, j]]
    s = sorted(values)
    pos = (1 - cfg.objective.token_selection_args["quantile"]) * (len(s) - 1)
    threshold = s[math.floor(pos)] + (s[min(math.floor(pos) + 1, len(s) - 1)] - s[math.floor(pos)]) * (pos % 1)
    factor = torch.zeros(n, t, dtype=F64)
    selected = torch.zeros(n, t, dtype=F64)
    for i in range(n):
        toks = [j for j in range(t) if mask[i, j]]
        d = [old[i, j].item() - behaviour[i, j].item() for j in range(t)]
        seq = sum(d[j] for j in toks)
        geo = math.exp(seq / len(toks)) if toks else 1.0
        keep_rs = cfg.corrections.rollout_rejection_args["min"] <= geo <= cfg.corrections.rollout_rejection_args["max"]
        kl = sum(behaviour[i, j].item() - logprobs[i, j].item() for j in toks) / max(len(toks), 1)
        keep_opsm = adv[i].item() >= 0 or kl <= cfg.corrections.off_policy_mask_args["threshold"]
        for j in range(t):
            r = math.exp(seq if cfg.corrections.rollout_correction.startswith("sequence") else d[j])
            w = (
                min(max(r, lo), hi)
                if cfg.corrections.rollout_correction.endswith("truncate")
                else (r if lo <= r <= hi else 0.0)
            )
            selected[i, j] = float(bool(mask[i, j]) and entropy[i, j].item() >= threshold)
            factor[i, j] = w * keep_rs * keep_opsm * selected[i, j]
    d_ref = ref - logprobs
    k3 = (d_ref.exp() - d_ref - 1) * (logprobs - old).exp()
    agg = lambda v: aggregate_loss(v, mask, mode, norm=5)  # noqa: E731
    return agg(pg * factor) + cfg.objective.kl_coef * agg(k3) - cfg.objective.entropy_coef * agg(entropy * selected)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("correction", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_loss_composes_the_pieces(mode, correction, seed):
    cfg = GRPOConfig(
        corrections=CorrectionConfig(
            rollout_correction=correction,
            rollout_correction_args={"min": 0.7, "max": 1.4},
            rollout_rejection="geometric",
            rollout_rejection_args={"min": 0.85, "max": 1.2},
            off_policy_mask="opsm",
            off_policy_mask_args={"threshold": 0.05},
        ),
        objective=ObjectiveConfig(
            kl_weighting="importance",
            token_selection="top_entropy",
            token_selection_args={"quantile": 0.5},
            entropy_coef=0.1,
            kl_coef=0.2,
            clip_high=0.28,
        ),
    )
    logprobs, old, behaviour, ref, entropy, adv, mask = _inputs(seed)
    aggregate = lambda v: aggregate_loss(v, mask, mode, norm=5)  # noqa: E731
    loss, metrics = grpo_loss(logprobs, entropy, adv, mask, cfg.objective, aggregate, corrections=cfg.corrections,
                              old_logprobs=old, ref_logprobs=ref, behaviour_logprobs=behaviour,
                              entropy_coef=0.1)  # fmt: skip
    expected = _expected(cfg, logprobs, old, behaviour, ref, entropy, adv, mask, mode)
    torch.testing.assert_close(loss, expected)
    grads = torch.autograd.grad(loss, [logprobs, entropy])
    torch.testing.assert_close(grads, torch.autograd.grad(expected, [logprobs, entropy]))
    assert 0 < metrics["entropy_selected_frac"] <= 0.6 and metrics["entropy_coef"] == pytest.approx(0.1)
    names = ("rollout_is_weight_mean", "rollout_is_weight_max", "rollout_is_weight_min", "rollout_rs_rejected_frac",
             "rollout_rs_rejected_seq_frac", "opsm_masked_frac", "opsm_masked_seq_frac")  # fmt: skip
    for name in names:
        assert name in metrics


def test_the_pieces_are_off_by_default():
    logprobs, old, behaviour, ref, entropy, adv, mask = _inputs(0)
    aggregate = lambda v: aggregate_loss(v, mask, "token-mean")  # noqa: E731
    cfg = GRPOConfig()
    loss, metrics = grpo_loss(logprobs, entropy, adv, mask, cfg.objective, aggregate, corrections=cfg.corrections,
                              old_logprobs=old, ref_logprobs=ref, behaviour_logprobs=behaviour)  # fmt: skip
    pg, _ = policy_loss(logprobs, old, adv, mask, kind="clip", clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    d = ref - logprobs
    torch.testing.assert_close(loss, aggregate(pg) + cfg.objective.kl_coef * aggregate(d.exp() - d - 1))
    assert not {"entropy_coef", "entropy_selected_frac", "rollout_is_weight_mean", "opsm_masked_frac"} & set(metrics)
