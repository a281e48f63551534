"""Rollout correction (token/sequence, truncate/mask, rejection) against the formulas written out in float64."""

from __future__ import annotations

import math
import re

import pytest
import torch

from lightning_grpo.algorithms.rollout_correction import rejection_keep, rollout_correct, rollout_weights
from lightning_grpo.config import GROUPS, GRPOConfig

MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


def _weights_loop(old, behaviour, mask, mode, low, high):
    """TRL's ``vllm_importance_sampling_mode`` semantics, one token at a time."""
    n, t = len(old), len(old[0])
    lo, hi = (-math.inf if low is None else low), (math.inf if high is None else high)
    out = [[0.0] * t for _ in range(n)]
    for i in range(n):
        seq = sum(old[i][j] - behaviour[i][j] for j in range(t) if mask[i][j])
        for j in range(t):
            d = seq if mode.startswith("sequence") else (old[i][j] - behaviour[i][j] if mask[i][j] else 0.0)
            r = math.exp(max(min(d, 20.0), -20.0))
            if mode.endswith("truncate"):
                out[i][j] = min(max(r, lo), hi)
            else:
                out[i][j] = r if lo <= r <= hi else 0.0
    return out


def _random(seed, n=5, t=9):
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=generator, dtype=torch.float64) * 3
    behaviour = old + torch.randn(n, t, generator=generator, dtype=torch.float64) * 0.4
    lengths = torch.randint(0, t + 1, (n,), generator=generator).tolist()
    lengths[0] = t
    mask = torch.tensor([[j < length for j in range(t)] for length in lengths], dtype=torch.float64)
    return old, behaviour, mask


def test_hand_worked_weights():
    old = torch.tensor([[0.0, -1.0, -2.0], [-1.0, -1.0, 0.0]], dtype=torch.float64)
    behaviour = torch.tensor([[0.0, -2.0, -1.0], [-1.5, -1.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    e = math.e
    # token ratios: [1, e, 1/e], [e^0.5, 1, (padding)]; sequence ratios: e^0 = 1, e^0.5 = 1.6487
    cases = {
        ("token_truncate", 0.5, 2.0): [[1, 2, 0.5], [e**0.5, 1, 1]],
        ("token_mask", 0.5, 2.0): [[1, 0, 0], [e**0.5, 1, 1]],
        ("sequence_truncate", None, 1.5): [[1, 1, 1], [1.5, 1.5, 1.5]],
        ("sequence_mask", None, 1.5): [[1, 1, 1], [0, 0, 0]],
    }
    for (mode, low, high), expected in cases.items():
        got = rollout_weights(old, behaviour, mask, mode, low, high)
        torch.testing.assert_close(got.double(), torch.tensor(expected, dtype=torch.float64), msg=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("low", "high"), [(None, 2.0), (0.7, 1.3), (0.9, None)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weights_match_the_formula(mode, low, high, seed):
    if mode.endswith("truncate") and low is None and high is None:
        pytest.skip("refused by GRPOConfig")
    old, behaviour, mask = _random(seed)
    expected = _weights_loop(old.tolist(), behaviour.tolist(), mask.tolist(), mode, low, high)
    got = rollout_weights(old, behaviour, mask, mode, low, high).double()
    torch.testing.assert_close(got * mask, torch.tensor(expected, dtype=torch.float64) * mask, rtol=1e-5, atol=1e-6)


def test_rejection_hand_worked():
    old = torch.tensor([[0.0, 0.0], [0.0, -1.0], [0.0, 9.0]], dtype=torch.float64)
    behaviour = torch.tensor([[0.0, 0.0], [-1.0, 0.0], [-0.1, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]])  # the 9.0 is padding
    # token_mean: 1, (e + 1/e)/2 = 1.543, e^0.1 = 1.105; geometric: 1, e^0 = 1, 1.105
    assert rejection_keep(old, behaviour, mask, "token_mean", 0.9, 1.2).flatten().tolist() == [1, 0, 1]
    assert rejection_keep(old, behaviour, mask, "geometric", 0.9, 1.2).flatten().tolist() == [1, 1, 1]
    assert rejection_keep(old, behaviour, mask, "geometric", 0.9, 1.1).flatten().tolist() == [1, 1, 0]


@pytest.mark.parametrize("statistic", ["token_mean", "geometric"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_rejection_matches_the_formula(statistic, seed):
    old, behaviour, mask = _random(seed)
    keep = rejection_keep(old, behaviour, mask, statistic, 0.85, 1.15).flatten().tolist()
    for i in range(old.shape[0]):
        ds = [old[i, j].item() - behaviour[i, j].item() for j in range(old.shape[1]) if mask[i, j]]
        if not ds:
            stat = 0.0 if statistic == "token_mean" else 1.0
        elif statistic == "token_mean":
            stat = sum(math.exp(d) for d in ds) / len(ds)
        else:
            stat = math.exp(sum(ds) / len(ds))
        assert keep[i] == float(0.85 <= stat <= 1.15), (i, stat)


def test_metrics():
    old = torch.zeros(2, 3)
    behaviour = torch.tensor([[0.0, -1.0, 0.0], [0.0, 0.0, 0.0]])  # one token ratio e
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    _, metrics = rollout_correct(
        torch.ones(2, 3), old, behaviour, mask, ("token_mask", None, 2.0), ("geometric", 0.9, 1.1)
    )
    assert metrics["rollout_is_masked_frac"].item() == pytest.approx(1 / 4)
    assert metrics["rollout_is_weight_max"].item() == pytest.approx(1.0)
    assert metrics["rollout_is_weight_mean"].item() == pytest.approx(3 / 4)
    assert metrics["rollout_rs_rejected_frac"].item() == pytest.approx(3 / 4)  # row 0: e^(1/3) = 1.40 is out
    assert metrics["rollout_is_weight_min"].item() == 0.0  # the masked token
    assert metrics["rollout_is_masked_seq_frac"].tolist() == [1.0, 2.0]  # 1 of 2 sequences has a masked token
    assert metrics["rollout_rs_rejected_seq_frac"].tolist() == [1.0, 2.0]  # row 0 rejected


def test_sequence_metrics_count_sequences_with_tokens_and_the_minimum_weight_is_over_loss_tokens():
    old = torch.zeros(4, 3)
    behaviour = torch.tensor([[0.0, 0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, -3.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # row 3: no tokens
    _, metrics = rollout_correct(
        torch.ones(4, 3), old, behaviour, mask, ("token_truncate", None, 2.0), ("token_mean", 0.9, 1.1)
    )
    assert metrics["rollout_is_weight_min"].item() == pytest.approx(math.exp(-0.5))  # not row 3's e^-9
    assert "rollout_is_masked_seq_frac" not in metrics  # truncation masks nothing
    # row 0: (1 + e^-0.5 + 1)/3 = 0.87 is out; rows 1, 2 are 1 (row 2's e^3 is not a loss token)
    assert metrics["rollout_rs_rejected_seq_frac"].tolist() == [1.0, 3.0]


def test_needs_behaviour_logprobs():
    with pytest.raises(ValueError, match=r"Rollout\.logprobs"):
        rollout_correct(torch.ones(1, 2), torch.zeros(1, 2), None, torch.ones(1, 2), ("sequence_mask", None, 2.0),
                        (None, 0.5, 2.0))  # fmt: skip


@pytest.mark.parametrize(
    ("group", "settings", "match"),
    [
        (
            "corrections",
            {"rollout_correction": "sequence_truncate", "rollout_correction_args": {"max": None}},
            "rollout_correction_args={'max': None} is not valid: sequence_truncate truncates the weights",
        ),
        (
            "corrections",
            {"rollout_correction": "token_mask", "rollout_correction_args": {"min": 2.0, "max": 1.0}},
            "token_mask: min=2.0 > max=1.0: the band is empty",
        ),
        (
            "corrections",
            {"rollout_rejection": "geometric", "rollout_rejection_args": {"min": 1.5, "max": 1.1}},
            "geometric: min=1.5 > max=1.1",
        ),
        ("corrections", {"rollout_correction": "sequence_mask", "old_logprobs": "rollout"}, "old_logprobs='recompute'"),
        (
            "corrections",
            {"rollout_correction": "sequence"},
            "rollout_correction='sequence' is not valid; choose one of",
        ),
        ("objective", {"token_selection_args": {"quantile": 0.5}}, "token_selection_args={'quantile': 0.5} is set but"),
        ("corrections", {"off_policy_mask": "opsm"}, "needs the setting(s) threshold"),
    ],
)
def test_bad_settings_name_the_settings_and_the_fix(group, settings, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        GRPOConfig(**{group: GROUPS[group](**settings)})
