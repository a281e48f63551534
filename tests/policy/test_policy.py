"""Loading the policy from a local path, with dtype and attention settings, and from an existing PeftModel."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

from lightning_grpo import GRPOModule, PolicyConfig
from lightning_grpo.policy import trainable_names
from lightning_grpo.testing import build_tiny_model


def _reward(prompts, completions, **_):
    return [0.0] * len(completions)


def test_model_and_tokenizer_load_from_a_local_path(tokenizer, tmp_path):
    build_tiny_model(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    policy = PolicyConfig(lora_r=2, dtype="bfloat16", attn_implementation="eager", target_modules=["q_proj"])
    module = GRPOModule(str(tmp_path), [_reward], policy=policy)
    base = module.policy.get_base_model()
    assert base.dtype == torch.bfloat16 and base.config._attn_implementation == "eager"
    assert module.tokenizer.pad_token_id == tokenizer.pad_token_id and module.tokenizer.padding_side == "left"
    names = trainable_names(module.policy)
    assert names and all("lora_" in n and "q_proj" in n for n in names)
    assert all(p.dtype == torch.float32 for n, p in module.policy.named_parameters() if p.requires_grad)


def test_an_existing_peft_model_trains_its_own_adapter(tokenizer):
    peft_model = get_peft_model(build_tiny_model(tokenizer), LoraConfig(r=3, target_modules=["v_proj"]))
    module = GRPOModule(peft_model, [_reward], tokenizer=tokenizer)
    assert module.policy is peft_model
    names = trainable_names(module.policy)
    assert names and all("v_proj.lora_" in n for n in names)


def test_adapter_initialisation_is_seeded(tokenizer):
    adapters = []
    for _ in range(2):
        torch.manual_seed(torch.randint(0, 1000, ()).item())  # whatever the global state
        module = GRPOModule(build_tiny_model(tokenizer), [_reward], tokenizer=tokenizer, seed=5)
        adapters.append({n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad})
    assert all(torch.equal(adapters[0][n], adapters[1][n]) for n in adapters[0])
