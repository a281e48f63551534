"""The policy's weights under Hugging Face names, base alone or with the adapter merged (what vLLM loads)."""

from __future__ import annotations

import copy

import torch

from lightning_grpo.policy import PolicyConfig, load_policy
from lightning_grpo.policy.weights import base_weights, merged_weights
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer


def _policy():
    policy = load_policy(build_tiny_model(build_tiny_tokenizer()), PolicyConfig(lora_r=4, lora_alpha=8))
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1)
    return policy


def test_merged_weights_equal_peft_merge_and_leave_the_policy_untouched():
    policy = _policy()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    merged = dict(merged_weights(policy))
    reference = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(merged) == set(reference) | {"lm_head.weight"}  # the tied head is named: engines need it
    for name, weight in reference.items():
        torch.testing.assert_close(merged[name], weight, atol=1e-6, rtol=1e-6)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           dict(base_weights(policy))["model.layers.0.self_attn.q_proj.weight"])  # fmt: skip
    assert all(torch.equal(before[n], p) for n, p in policy.named_parameters())


def test_base_weights_are_the_model_without_its_adapter():
    policy = _policy()
    base = dict(base_weights(policy))
    original = build_tiny_model(build_tiny_tokenizer()).state_dict()
    assert set(base) == set(original) | {"lm_head.weight"}
    for name, weight in original.items():
        assert torch.equal(base[name], weight), name
