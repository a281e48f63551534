"""The fused output head's kept log mass (``margins``) equals the explicit computation from the logits."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.algorithms import fused_head as fused_head_module
from lightning_grpo.algorithms import fused_head_logprobs
from lightning_grpo.algorithms.logprob_kernels import KEPT_SLACK, kept_log_mass

N, T, H, V = 3, 5, 16, 3000


def _explicit(logits, targets, margins, temperature):
    """``log Σ_{z[v] >= z[t] - m - KEPT_SLACK·max(1,|z[t]|)} p(v)`` (the sampled token in), 0 at ``m = inf``."""
    z = logits.float() / temperature
    zt = z.gather(-1, targets[..., None])
    keep = z >= zt - margins[..., None] - KEPT_SLACK * zt.abs().clamp(min=1)
    keep.scatter_(-1, targets[..., None], True)
    kept = torch.logsumexp(z.double().masked_fill(~keep, float("-inf")), -1) - torch.logsumexp(z.double(), -1)
    return torch.where(margins.isinf(), 0.0, kept).float()


def _inputs(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, T, H, generator=gen).to(dtype)
    weight = (torch.randn(V, H, generator=gen) / 2).to(dtype)
    bias = torch.randn(V, generator=gen).to(dtype)
    probs = torch.softmax((hidden @ weight.t() + bias).float().view(N * T, V) / 0.7, -1)
    targets = torch.multinomial(probs, 1, generator=gen).view(N, T)  # sampled: kept sets of a few tokens
    kind = torch.randint(3, (N, T), generator=gen)
    margins = torch.stack([torch.zeros(N, T), 3 * torch.rand(N, T, generator=gen), torch.full((N, T), float("inf"))])
    return hidden, weight, bias, targets, margins.gather(0, kind[None]).squeeze(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tile_bytes", [None, 4096])  # one vocabulary slice; three slices of 1024 (and 952) tokens
@pytest.mark.parametrize("chunk_size", [1, 4, 1024])
def test_kept_log_mass_equals_explicit_logits(dtype, tile_bytes, chunk_size):
    hidden, weight, bias, targets, margins = _inputs(dtype)
    settings = {"temperature": 0.7, "chunk_size": chunk_size, "tile_bytes": tile_bytes}
    logprobs, _, kept = fused_head_logprobs(hidden, weight, bias, targets, margins=margins, **settings)
    logits = hidden @ weight.t() + bias
    want = _explicit(logits, targets, margins, 0.7)
    torch.testing.assert_close(kept, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(kept_log_mass(logits, targets, margins, temperature=0.7), want, atol=1e-5, rtol=0)
    assert (kept[margins.isinf()] == 0).all() and margins.isinf().any()
    assert (kept <= 0).all() and (kept < -0.1).sum() >= 5  # not all whole-vocabulary sets
    assert (kept >= logprobs - 1e-6).all()  # the sampled token is in S


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sampled_token_on_the_boundary(dtype):
    """Margin 0: S is the tokens at least as likely as the sampled one; margin ``z[t] - z[u]``: ``u`` is in S too."""
    hidden, weight, bias, _, _ = _inputs(dtype, seed=1)
    z = ((hidden @ weight.t() + bias).float() / 0.7).view(N * T, V)
    order = z.argsort(-1, descending=True)
    ranks = torch.randint(1, 40, (N * T,), generator=torch.Generator().manual_seed(2))
    targets = order.gather(-1, ranks[:, None]).squeeze(-1)  # the token of rank k: k tokens above it
    top = lambda k: torch.logsumexp(  # noqa: E731  # log mass of the k most likely tokens, each row its own k
        z.double().gather(-1, order).masked_fill(torch.arange(V) >= k[:, None], float("-inf")), -1
    )
    lse = torch.logsumexp(z.double(), -1)
    at_zero = fused_head_logprobs(hidden, weight, bias, targets.view(N, T), temperature=0.7, margins=torch.zeros(N, T))
    torch.testing.assert_close(at_zero[2].view(-1), (top(ranks + 1) - lse).float(), atol=1e-5, rtol=0)
    below = order.gather(-1, (ranks + 3)[:, None]).squeeze(-1)  # the token 3 ranks lower, exactly on the boundary
    margins = (z.gather(-1, targets[:, None]) - z.gather(-1, below[:, None])).view(N, T)
    on_edge = fused_head_logprobs(hidden, weight, bias, targets.view(N, T), temperature=0.7, margins=margins)
    torch.testing.assert_close(on_edge[2].view(-1), (top(ranks + 4) - lse).float(), atol=1e-5, rtol=0)


def test_the_sampled_token_stays_in_when_its_gathered_logit_rounds_up(monkeypatch):
    """The threshold comes from a gather of weight rows, which may round above the tile's value (another kernel; a
    bfloat16 rounding step is 0.4 %): the sampled token is in S regardless, so the argmax with margin 0 has S = {t}."""
    hidden, weight, bias, _, _ = _inputs(torch.float32)
    targets = (hidden @ weight.t() + bias).argmax(-1)
    gathered = fused_head_module._target_logits
    monkeypatch.setattr(fused_head_module, "_target_logits", lambda *args: gathered(*args) + 0.01)
    logprobs, _, kept = fused_head_logprobs(hidden, weight, bias, targets, margins=torch.zeros(N, T))
    torch.testing.assert_close(kept, logprobs, atol=1e-5, rtol=0)
    hidden, weight, bias, targets, _ = _inputs(torch.bfloat16)
    logprobs, _, kept = fused_head_logprobs(hidden, weight, bias, targets, margins=torch.zeros(N, T))
    assert torch.isfinite(kept).all() and (kept >= logprobs - 1e-6).all()


def test_margins_leave_values_and_gradients_unchanged():
    hidden, weight, bias, targets, margins = _inputs(torch.float32)
    runs = []
    for extra in ({}, {"margins": margins}):
        leaves = [x.clone().requires_grad_() for x in (hidden, weight, bias)]
        logprobs, entropy, *kept = fused_head_logprobs(*leaves, targets, temperature=0.7, with_entropy=True, **extra)
        (logprobs.sum() + 0.3 * entropy.sum()).backward()
        runs.append([logprobs.detach(), entropy.detach(), *(x.grad for x in leaves)])
        assert len(kept) == len(extra) and all(not k.requires_grad for k in kept)
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_margins_of_the_wrong_shape_are_refused():
    hidden, weight, bias, targets, _ = _inputs(torch.float32)
    with pytest.raises(ValueError, match="margins"):
        fused_head_logprobs(hidden, weight, bias, targets, margins=torch.zeros(N, T + 1))
