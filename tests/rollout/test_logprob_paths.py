"""The faster log-prob paths compute exactly what the plain path computes: shared prompts and the fused output head."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.algorithms import selective_logprobs
from lightning_grpo.policy import PolicyConfig, load_policy, reference_mode
from lightning_grpo.rollout import SamplingSettings, completion_logprobs, generate_rollout
from lightning_grpo.rollout.logprobs import _checkpointing, completion_logits, fused_head_supported
from lightning_grpo.testing import build_tiny_model


@pytest.fixture
def policy_and_rollout(tokenizer):
    policy = load_policy(build_tiny_model(tokenizer), PolicyConfig(lora_r=4, lora_alpha=8))
    for name, param in policy.named_parameters():
        if "lora_B" in name:  # a non-zero adapter, so the policy differs from the reference
            torch.nn.init.normal_(param, std=0.1)
    torch.manual_seed(0)
    settings = SamplingSettings(num_generations=3, max_new_tokens=9, temperature=0.8)
    rollout = generate_rollout(policy, tokenizer, ["1+2=", "33+4=", "x"], settings, max_prompt_length=8)
    return policy, rollout.select(torch.randperm(len(rollout)))  # shuffled, as a mini-batch would be


def _run(policy, rollout, **switches):
    policy.zero_grad()
    out = completion_logprobs(policy, rollout, temperature=0.8, with_entropy=True, entropy_grad=True, **switches)
    mask = rollout.completion_mask
    ((out.logprobs + 0.1 * out.entropy) * mask).sum().backward()
    grads = [p.grad.clone() for p in policy.parameters() if p.requires_grad]
    return out.logprobs.detach(), out.entropy.detach(), grads


@pytest.mark.parametrize(("share_prompt", "fused_head"), [(True, True), (True, False), (False, True)])
def test_fast_paths_match_the_full_forward(policy_and_rollout, share_prompt, fused_head):
    policy, rollout = policy_and_rollout
    assert fused_head_supported(policy)
    expected = _run(policy, rollout, share_prompt=False, fused_head=False)
    actual = _run(policy, rollout, share_prompt=share_prompt, fused_head=fused_head)
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(actual[0][mask], expected[0][mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(actual[1][mask], expected[1][mask], atol=1e-5, rtol=1e-5)
    for got, want in zip(actual[2], expected[2], strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_reference_and_logits_paths_agree(policy_and_rollout):
    policy, rollout = policy_and_rollout
    with reference_mode(policy):
        fused = completion_logprobs(policy, rollout, temperature=0.8).logprobs
        logits = completion_logits(policy, rollout, share_prompt=False)  # (N, T, V)
    torch.testing.assert_close(fused, selective_logprobs(logits, rollout.completion_ids, temperature=0.8))
    assert not fused.requires_grad


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_gradient_checkpointing_falls_back_to_the_full_forward(policy_and_rollout):
    """Checkpointing turns the KV cache off in training mode, so the shared-prompt pair is not used."""
    policy, rollout = policy_and_rollout
    expected = _run(policy, rollout, share_prompt=False, fused_head=False)
    policy.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy.base_model.model.enable_input_require_grads()
    policy.train()
    assert _checkpointing(policy)
    actual = _run(policy, rollout)
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(actual[0][mask], expected[0][mask], atol=1e-5, rtol=1e-5)


def test_fused_head_is_not_used_for_transformed_logits(tokenizer):
    model = build_tiny_model(tokenizer)
    assert fused_head_supported(model)
    model.config.final_logit_softcapping = 30.0  # Gemma-style: the head's output is not the logits
    assert not fused_head_supported(model)
