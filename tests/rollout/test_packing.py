"""Packed rows compute what padded rows compute (item 3 of issue 36): log-probs, entropy, loss and adapter gradients.

The tiny model's attention matters (weights of std 0.1): a leak across the packed sequences changes the log-probs by
orders of magnitude more than the tolerance, which :func:`test_a_leak_across_sequences_is_far_outside_tolerance`
checks on both routes.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from lightning_grpo.rollout import completion_logprobs
from lightning_grpo.rollout import packing as packing_module
from lightning_grpo.rollout.packing import pack_rollout, packed_row_chunks, packing_route, unpack
from tests.rollout.packing_cases import mixed_rollout, tiny_policy

PROMPTS = [3, 7, 1, 5]
COMPLETIONS = [[5, 1, 9], [2, 12, 4], [7, 3, 1], [0, 6, 11]]  # an empty completion too


@pytest.fixture
def rollout(tokenizer):
    mixed = mixed_rollout(len(tokenizer), PROMPTS, COMPLETIONS)
    return mixed.select(torch.randperm(len(mixed), generator=torch.Generator().manual_seed(0)))  # a shuffled batch


def _run(policy, rollout, **switches):
    """Log-probs, entropy, a token-mean loss with advantages and the adapter gradients."""
    policy.zero_grad()
    out = completion_logprobs(policy, rollout, temperature=0.8, with_entropy=True, entropy_grad=True, **switches)
    mask = rollout.completion_mask
    advantages = torch.linspace(-1, 1, len(rollout))[:, None]
    loss = ((out.logprobs * advantages + 0.1 * out.entropy) * mask).sum() / mask.sum()
    loss.backward()
    grads = [p.grad.clone() for p in policy.parameters() if p.requires_grad]
    return out.logprobs.detach(), out.entropy.detach(), loss.detach(), grads


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize(("share_prompt", "fused_head"), [(False, True), (True, True), (True, False), (False, False)])
def test_packed_equals_padded(tokenizer, rollout, attn, share_prompt, fused_head):
    policy = tiny_policy(tokenizer, attn)
    assert packing_route(policy, share_prompt) == ("mask" if share_prompt else "positions")
    padded = _run(policy, rollout, share_prompt=share_prompt, fused_head=fused_head, packing=False)
    packed = _run(policy, rollout, share_prompt=share_prompt, fused_head=fused_head, packing=True)
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(packed[0][mask], padded[0][mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[1][mask], padded[1][mask], atol=1e-5, rtol=0)
    assert (packed[0][~mask] == 0).all()  # padding: 0
    torch.testing.assert_close(packed[2], padded[2], atol=1e-6, rtol=0)
    for got, want in zip(packed[3], padded[3], strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert max(g.abs().max() for g in packed[3]) > 1e-3  # the gradients compared are not all 0


def test_shared_prompt_layout_runs_each_prompt_once(rollout):
    plain, shared = pack_rollout(rollout, share_prompt=False), pack_rollout(rollout, share_prompt=True)
    real = rollout.completion_mask.sum(-1)
    prompt = rollout.prompt_mask.sum(-1)
    assert plain.input_ids.shape[1] == int((prompt + (real - 1).clamp(min=0)).sum())
    assert shared.input_ids.shape[1] == sum(PROMPTS) + int((real - 1).clamp(min=0).sum())
    assert len(shared.predict) == len(plain.predict) == int(real.sum())
    back = unpack(shared.targets, shared)
    assert torch.equal(back, rollout.completion_ids * rollout.completion_mask)


@pytest.mark.parametrize("share_prompt", [False, True])
def test_a_leak_across_sequences_is_far_outside_tolerance(tokenizer, rollout, share_prompt, monkeypatch):
    """The same packed row with attention running across its sequences differs by far more than 1e-5."""
    policy = tiny_policy(tokenizer, "sdpa")
    with torch.no_grad():
        exact = completion_logprobs(policy, rollout, share_prompt=share_prompt, packing=True).logprobs
        if share_prompt:  # the explicit mask made causal over the whole row
            causal = lambda packed, dtype, additive: torch.ones(  # noqa: E731
                len(packed.groups), len(packed.groups), dtype=torch.bool
            ).tril()[None, None]
            monkeypatch.setattr(packing_module, "shared_prompt_mask", causal)
            monkeypatch.setattr("lightning_grpo.rollout.logprobs.shared_prompt_mask", causal)
            leaky = completion_logprobs(policy, rollout, share_prompt=True, packing=True).logprobs
        else:  # a 2-D mask turns transformers' packed-sequence detection off: plain causal attention
            packed = pack_rollout(rollout, share_prompt=False)
            out = policy(
                input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                attention_mask=torch.ones_like(packed.input_ids), logits_to_keep=packed.predict,
            )  # fmt: skip
            leaky = unpack(
                torch.log_softmax(out.logits[0].float(), -1)[torch.arange(len(packed.targets)), packed.targets], packed
            )
    mask = rollout.completion_mask.bool()
    assert (leaky - exact)[mask].abs().max() > 1e-2


def test_packing_true_names_the_attention_implementation(tokenizer, rollout):
    policy = tiny_policy(tokenizer, "sdpa")
    policy.config._attn_implementation = "flex_attention"  # not a route packing verified
    assert packing_route(policy, True) is None
    with pytest.raises(ValueError, match=r"'flex_attention' cannot take packed rows.*packing='auto'"):
        completion_logprobs(policy, rollout, packing=True)
    with pytest.raises(ValueError, match="packing='yes' is not valid; choose one of True, False, 'auto'"):
        completion_logprobs(policy, rollout, packing="yes")


def test_auto_falls_back_to_padded_rows(tokenizer, rollout, monkeypatch):
    policy = tiny_policy(tokenizer, "sdpa")
    monkeypatch.setattr("lightning_grpo.rollout.logprobs.packing_route", lambda model, share_prompt: None)
    with torch.no_grad():
        padded = completion_logprobs(policy, rollout, packing=False).logprobs
        auto = completion_logprobs(policy, rollout, packing="auto").logprobs
    assert torch.equal(auto, padded)  # the padded path itself, bit for bit


@pytest.mark.parametrize("share_prompt", [False, True])
def test_a_micro_batch_over_the_packed_row_limit_runs_as_several_rows(tokenizer, rollout, share_prompt, monkeypatch):
    policy = tiny_policy(tokenizer, "sdpa")
    chunks = packed_row_chunks(rollout, share_prompt=share_prompt, max_tokens=16)
    assert len(chunks) > 2 and sorted(torch.cat(chunks).tolist()) == list(range(len(rollout)))
    padded = _run(policy, rollout, share_prompt=share_prompt, packing=False)
    split = partial(packed_row_chunks, max_tokens=16)
    monkeypatch.setattr("lightning_grpo.rollout.logprobs.packed_row_chunks", split)
    packed = _run(policy, rollout, share_prompt=share_prompt, packing=True)
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(packed[0][mask], padded[0][mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[2], padded[2], atol=1e-6, rtol=0)
    for got, want in zip(packed[3], padded[3], strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_auto_packs_only_a_rollout_with_enough_padding(tokenizer):
    even = mixed_rollout(len(tokenizer), [3, 5], [[6, 6], [6, 6]])  # no padding: packing would only add the mask
    uneven = mixed_rollout(len(tokenizer), [3, 5], [[1, 12], [2, 12]])  # 21 of 48 positions are padding
    assert packing_module.padding_fraction(even) == 0.0
    assert packing_module.padding_fraction(uneven) == pytest.approx(21 / 48)
    assert packing_module.packing_for(even, "auto") is False
    assert packing_module.packing_for(uneven, "auto") == "auto"
    assert [packing_module.packing_for(even, value) for value in (True, False)] == [True, False]  # chosen: kept
