"""Entropy control: Skywork-OR1's adaptive coefficient and the top-entropy quantile, against the papers' formulas."""

from __future__ import annotations

import math
import re

import pytest
import torch

from lightning_grpo.algorithms.entropy import AdaptiveEntropy, constant_entropy, entropy_controller, top_entropy_mask
from lightning_grpo.config import GRPOConfig, ObjectiveConfig


def _skywork(entropies, target, delta, lo, hi, start):
    """Skywork-OR1 §3.2 written out: c_{k+1} = clip(c_k ± delta); applied c_{k+1} only while e_k <= target."""
    c, applied = start, []
    for e in entropies:
        if e < target:
            c = c + delta
        elif e > target:
            c = c - delta
        c = min(max(c, lo), hi)
        applied.append(c if e <= target else 0.0)
    return applied


def test_adaptive_coefficient_hand_worked():
    control = AdaptiveEntropy(target=0.5, delta=0.1, coef_min=0.0, coef_max=0.25, entropy_coef=0.05)
    assert control(None) == 0.0  # nothing measured yet (TRL: last entropy = inf)
    got = [control(e) for e in (0.3, 0.4, 0.45, 0.5, 0.9, 0.2)]
    # 0.05 -> 0.15, 0.25, 0.25 (capped), 0.25 (at target: no move, applied), 0.15 (above: 0 applied), 0.25
    assert got == pytest.approx([0.15, 0.25, 0.25, 0.25, 0.0, 0.25])


def test_adaptive_coefficient_matches_the_formula_on_random_entropies():
    generator = torch.Generator().manual_seed(0)
    entropies = (torch.rand(200, generator=generator, dtype=torch.float64) * 1.2).tolist()
    control = AdaptiveEntropy(target=0.6, delta=0.013, coef_min=0.01, coef_max=0.2, entropy_coef=0.1)
    assert [control(e) for e in entropies] == pytest.approx(_skywork(entropies, 0.6, 0.013, 0.01, 0.2, 0.1))


def test_adaptive_state_round_trips_and_non_finite_entropy_does_not_move_it():
    control = AdaptiveEntropy(target=1.0, delta=0.1)
    control(0.5), control(0.5)
    state = control.state_dict()
    assert state == pytest.approx({"coef": 0.2, "entropy": 0.5})
    fresh = AdaptiveEntropy(target=1.0, delta=0.1)
    fresh.load_state_dict(state)
    assert fresh(math.nan) == pytest.approx(0.2) and fresh(0.5) == pytest.approx(control(0.5))


def test_constant_is_the_flat_entropy_coef():
    assert constant_entropy(None, entropy_coef=0.3) == 0.3
    assert entropy_controller("constant", None, 0.25)(1.7) == 0.25
    assert entropy_controller("adaptive", {"target": 2.0}, 0.25, shared=False).coef == 0.25  # c_0 = entropy_coef


def _quantile(values, q):
    """numpy-style linear quantile, written out."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def test_top_entropy_hand_worked():
    entropy = torch.tensor([[0.1, 0.9, 0.5, 0.0], [0.3, 0.7, 2.0, 0.2]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])  # 2.0 and 0.0 are not loss tokens
    # loss-token entropies 0.1, 0.3, 0.5, 0.7, 0.9; the 0.6 quantile is 0.5 + 0.4 * 0.2 = 0.58
    got = top_entropy_mask(entropy, mask, 0.4)
    assert got.tolist() == [[False, True, False, False], [False, True, False, False]]
    assert top_entropy_mask(entropy, mask, 1.0).tolist() == mask.bool().tolist()


@pytest.mark.parametrize("quantile", [0.05, 0.2, 0.5, 0.8, 1.0])
def test_top_entropy_matches_the_formula_on_random_masks(quantile):
    generator = torch.Generator().manual_seed(3)
    entropy = torch.rand(6, 11, generator=generator, dtype=torch.float64) * 3
    lengths = [11, 3, 0, 7, 1, 9]  # uneven, one empty row
    mask = torch.tensor([[t < n for t in range(11)] for n in lengths])
    values = [entropy[i, t].item() for i in range(6) for t in range(11) if mask[i, t]]
    threshold = _quantile(values, 1 - quantile)
    expected = [[bool(mask[i, t]) and entropy[i, t].item() >= threshold for t in range(11)] for i in range(6)]
    assert top_entropy_mask(entropy, mask, quantile).tolist() == expected
    assert top_entropy_mask(entropy, mask, quantile).sum() >= math.floor(quantile * len(values))


@pytest.mark.parametrize("quantile", [0.0, -0.1, 1.5, math.nan])
def test_bad_quantile_is_refused_naming_the_setting(quantile):
    with pytest.raises(
        ValueError, match=r"^GRPOConfig\.objective\.token_selection_args=.* quantile=.* must be in \(0, 1\]"
    ):
        GRPOConfig(
            objective=ObjectiveConfig(token_selection="top_entropy", token_selection_args={"quantile": quantile})
        )


def test_bad_adaptive_settings_are_refused():
    with pytest.raises(ValueError, match=re.escape("coef_min=0.5 > coef_max=0.1")):
        GRPOConfig(
            objective=ObjectiveConfig(
                entropy_control="adaptive", entropy_control_args={"coef_min": 0.5, "coef_max": 0.1}
            )
        )
    with pytest.raises(ValueError, match="takes no setting 'tgt'"):
        GRPOConfig(objective=ObjectiveConfig(entropy_control="adaptive", entropy_control_args={"tgt": 0.5}))
    with pytest.raises(ValueError, match=r"entropy_control_args\.delta"):
        GRPOConfig(objective=ObjectiveConfig(entropy_control="adaptive", entropy_control_args={"delta": -1}))
