"""OPSM and the importance-weighted KL (DeepSeek-V3.2), against their formulas written out in float64."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.algorithms.kl import importance_weighted_kl, kl_penalty
from lightning_grpo.algorithms.off_policy import off_policy_mask, off_policy_masked


def test_opsm_hand_worked():
    adv = torch.tensor([0.5, -0.5, -0.5, 0.0])
    current = torch.tensor([[-2.0, -3.0, 0.0], [-2.0, -3.0, 0.0], [-1.2, -1.0, -9.0], [-5.0, -5.0, -5.0]])
    sampler = torch.tensor([[-1.0, -1.0, 0.0], [-1.0, -1.0, 0.0], [-1.0, -1.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 1]])
    # mean KL: 1.5, 1.5, 0.1, 4; kept: A >= 0, dropped (A < 0, 1.5 > 1), kept (0.1 <= 1), kept (A = 0)
    keep = off_policy_mask(adv, current, sampler, mask, threshold=1.0)
    assert keep.flatten().tolist() == [1, 0, 1, 1]
    _, metrics = off_policy_masked(torch.ones(4, 3), adv, current, sampler, mask, 1.0)
    assert metrics["opsm_masked_frac"].item() == pytest.approx(2 / 9)
    assert metrics["opsm_masked_seq_frac"].tolist() == [1.0, 4.0]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.3])
def test_opsm_matches_the_formula(seed, threshold):
    generator = torch.Generator().manual_seed(seed)
    n, t = 7, 6
    current = -torch.rand(n, t, generator=generator, dtype=torch.float64) * 2
    sampler = current + torch.randn(n, t, generator=generator, dtype=torch.float64) * 0.3
    adv = torch.randn(n, generator=generator, dtype=torch.float64)
    lengths = [6, 1, 3, 0, 5, 2, 6]
    mask = torch.tensor([[j < length for j in range(t)] for length in lengths], dtype=torch.float64)
    keep = off_policy_mask(adv, current, sampler, mask, threshold).flatten().tolist()
    for i in range(n):
        kl = [sampler[i, j].item() - current[i, j].item() for j in range(t) if mask[i, j]]
        mean = sum(kl) / max(len(kl), 1)
        assert keep[i] == float(adv[i].item() >= 0 or mean <= threshold)
    per_token_adv = adv[:, None].expand(n, t)  # (n, T) advantages: the same decision token by token
    assert off_policy_mask(per_token_adv, current, sampler, mask, threshold).tolist() == [[k] * t for k in keep]


def test_importance_weighted_kl_value_and_gradient():
    logprobs = torch.tensor([[-1.0, -0.5]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.5, -0.5]], dtype=torch.float64)
    ref = torch.tensor([[-1.2, -0.1]], dtype=torch.float64)
    weighted = importance_weighted_kl(kl_penalty(logprobs, ref, "k3"), logprobs, old)
    for j, (lp, o, r) in enumerate([(-1.0, -1.5, -1.2), (-0.5, -0.5, -0.1)]):
        d = r - lp
        k3 = math.exp(d) - d - 1
        assert weighted[0, j].item() == pytest.approx(math.exp(lp - o) * k3)
    weighted.sum().backward()
    for j, (lp, o, r) in enumerate([(-1.0, -1.5, -1.2), (-0.5, -0.5, -0.1)]):
        d = r - lp  # d/dlp [exp(lp - o) * (exp(r - lp) - (r - lp) - 1)]
        grad = math.exp(lp - o) * (math.exp(d) - d - 1) + math.exp(lp - o) * (1 - math.exp(d))
        assert logprobs.grad[0, j].item() == pytest.approx(grad)


def test_on_policy_importance_weighted_k3_has_the_gradient_of_k3_plus():
    """At ratio 1, ∇(ratio · k3) = ∇k3 + k3 ∇log π = -d ∇log π = ∇k2: the straight-through ``k3+``."""
    generator = torch.Generator().manual_seed(0)
    base = -torch.rand(3, 5, generator=generator, dtype=torch.float64)
    ref = base + torch.randn(3, 5, generator=generator, dtype=torch.float64) * 0.5
    a = base.clone().requires_grad_()
    b = base.clone().requires_grad_()
    importance_weighted_kl(kl_penalty(a, ref, "k3"), a, a.detach()).sum().backward()
    kl_penalty(b, ref, "k3+").sum().backward()
    torch.testing.assert_close(a.grad, b.grad)
