"""``TokenLogProbs.kept_log_mass`` on every log-prob route equals the kept set's log mass of the materialised logits.

Routes: padded rows (full forward, shared-prompt forward) and packed rows (positions route, mask route), each with the
fused output head and with the materialised logits. The margins mix 0 (only tokens at least as likely as the sampled
one), moderate values, margins that put another token exactly on the boundary, and ``inf`` (the whole vocabulary).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lightning_grpo.algorithms.logprob_kernels import KEPT_SLACK
from lightning_grpo.rollout import completion_logprobs
from lightning_grpo.rollout.logprobs import completion_logits
from lightning_grpo.rollout.packing import packing_route
from tests.rollout.packing_cases import mixed_rollout, tiny_policy

TEMPERATURE = 0.8
PROMPTS = [3, 7, 1, 5]
COMPLETIONS = [[5, 1, 9], [2, 12, 4], [7, 3, 1], [0, 6, 11]]  # an empty completion too
ROUTES = [  # (share_prompt, packing): full forward, shared-prompt forward, packed positions, packed mask
    (False, False),
    (True, False),
    (False, True),
    (True, True),
]


def _explicit(logits, targets, margins):
    """From the logits: ``log Σ_{z[v] >= z[t] - m - KEPT_SLACK·max(1,|z[t]|)} p(v)``, 0 where ``m = inf``."""
    z = logits.float() / TEMPERATURE
    zt = z.gather(-1, targets[..., None])
    keep = z >= zt - margins[..., None] - KEPT_SLACK * zt.abs().clamp(min=1)
    keep.scatter_(-1, targets[..., None], True)
    kept = torch.logsumexp(z.double().masked_fill(~keep, float("-inf")), -1) - torch.logsumexp(z.double(), -1)
    return torch.where(margins.isinf(), 0.0, kept).float()


def _margins(logits, targets):
    """0, moderate, boundary (another token's logit exactly at ``z[t] - m``) and ``inf`` margins, by position."""
    gen = torch.Generator().manual_seed(3)
    z = logits.float() / TEMPERATURE
    zt = z.gather(-1, targets[..., None]).squeeze(-1)
    other = torch.randint(z.shape[-1], targets.shape, generator=gen)
    boundary = (zt - z.gather(-1, other[..., None]).squeeze(-1)).clamp(min=0)
    kind = torch.randint(4, targets.shape, generator=gen)
    moderate = 2.0 * torch.rand(targets.shape, generator=gen)
    choices = torch.stack([torch.zeros_like(zt), moderate, boundary, torch.full_like(zt, float("inf"))])
    return choices.gather(0, kind[None]).squeeze(0)


@pytest.fixture
def case(tokenizer):
    """The tiny policy, a shuffled rollout of mixed lengths with margins, and the materialised logits."""
    policy = tiny_policy(tokenizer, "sdpa")
    mixed = mixed_rollout(len(tokenizer), PROMPTS, COMPLETIONS)
    rollout = mixed.select(torch.randperm(len(mixed), generator=torch.Generator().manual_seed(0)))
    with torch.no_grad():
        logits = completion_logits(policy, rollout, share_prompt=False)  # (N, T, V)
    margins = _margins(logits, rollout.completion_ids)
    return policy, replace(rollout, kept_margins=margins), logits


def _run(policy, rollout, **switches):
    """Log-probs, entropy, kept log mass and the adapter gradients of a loss on log-probs and entropy."""
    policy.zero_grad()
    out = completion_logprobs(
        policy, rollout, temperature=TEMPERATURE, with_entropy=True, entropy_grad=True, **switches
    )
    advantages = torch.linspace(-1, 1, len(rollout))[:, None]
    ((out.logprobs * advantages + 0.1 * out.entropy) * rollout.completion_mask).sum().backward()
    grads = [p.grad.clone() for p in policy.parameters() if p.requires_grad]
    return out, grads


@pytest.mark.parametrize("fused_head", [True, False])
@pytest.mark.parametrize(("share_prompt", "packing"), ROUTES)
def test_every_route_gives_the_explicit_kept_log_mass(case, share_prompt, packing, fused_head):
    policy, rollout, logits = case
    if packing:
        assert packing_route(policy, share_prompt) == ("mask" if share_prompt else "positions")
    out, _ = _run(policy, rollout, share_prompt=share_prompt, fused_head=fused_head, packing=packing)
    mask = rollout.completion_mask.bool()
    want = _explicit(logits, rollout.completion_ids, rollout.kept_margins)
    kept = out.kept_log_mass
    assert kept is not None and not kept.requires_grad and kept.dtype == torch.float32
    torch.testing.assert_close(kept[mask], want[mask], atol=1e-5, rtol=0)
    infinite = rollout.kept_margins.isinf() & mask
    assert infinite.any() and (kept[infinite] == 0).all()  # m = inf: exactly 0
    assert (kept[mask] <= 0).all()
    assert (kept[mask] < -0.05).sum() >= 5  # the kept sets compared are not all the whole vocabulary
    assert (kept[mask] >= out.logprobs.detach()[mask] - 1e-6).all()  # the sampled token is always in S
    assert ((rollout.kept_margins == 0) & mask).any()


@pytest.mark.parametrize("fused_head", [True, False])
@pytest.mark.parametrize(("share_prompt", "packing"), ROUTES)
def test_margins_change_neither_values_nor_gradients(case, share_prompt, packing, fused_head):
    """Without margins (or with ``with_kept_mass=False``) the field is None; log-probs, entropy and gradients are
    bit-identical with and without margins."""
    policy, rollout, _ = case
    switches = {"share_prompt": share_prompt, "fused_head": fused_head, "packing": packing}
    with_margins, grads = _run(policy, rollout, **switches)
    plain, plain_grads = _run(policy, replace(rollout, kept_margins=None), **switches)
    skipped, skipped_grads = _run(policy, rollout, with_kept_mass=False, **switches)
    assert with_margins.kept_log_mass is not None
    assert plain.kept_log_mass is None and skipped.kept_log_mass is None
    for other, other_grads in ((plain, plain_grads), (skipped, skipped_grads)):
        assert torch.equal(with_margins.logprobs, other.logprobs)
        assert torch.equal(with_margins.entropy, other.entropy)
        for got, want in zip(grads, other_grads, strict=True):
            assert torch.equal(got, want)
    assert max(g.abs().max() for g in grads) > 1e-3  # the gradients compared are not all 0


def test_fused_and_unfused_agree_without_grad(case):
    """Under ``no_grad`` (old log-probs) the fused and unfused routes agree on the kept log mass."""
    policy, rollout, _ = case
    with torch.no_grad():
        fused = completion_logprobs(policy, rollout, temperature=TEMPERATURE).kept_log_mass
        unfused = completion_logprobs(policy, rollout, temperature=TEMPERATURE, fused_head=False).kept_log_mass
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(fused[mask], unfused[mask], atol=1e-5, rtol=0)
