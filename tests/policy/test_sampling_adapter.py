"""``GRPOConfig.sampling.sampling_adapter``: sampling with the adapter cast to the base dtype or merged into the base
weights costs fewer ATen calls per token, and leaves the trained adapter and the base weights exactly as they were."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from benchmarks.gpu_readiness import decode_step_calls
from lightning_grpo import GRPOConfig
from lightning_grpo.config import SamplingConfig
from lightning_grpo.policy.sampling_adapter import sampling_adapter
from tests.conftest import count_a, make_trainer, prompt_loader, tiny_sampling


def _model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    base = Qwen2ForCausalLM(config).to(dtype).eval()
    return get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))


@pytest.mark.parametrize("mode", ["base_dtype", "merged"])
def test_every_weight_is_restored_bit_for_bit(mode):
    model = _model(torch.bfloat16)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    lora = next(p for n, p in model.named_parameters() if "lora_A" in n)
    with torch.no_grad(), sampling_adapter(model, mode):
        model(input_ids=torch.randint(256, (2, 5)))
        if mode == "base_dtype":
            assert lora.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="inside"), sampling_adapter(model, mode):
        raise RuntimeError("inside")  # restored on an exception too
    after = model.state_dict()
    assert all(after[name].dtype == value.dtype and torch.equal(after[name], value) for name, value in before.items())
    assert lora.dtype == torch.float32


def test_merged_samples_the_same_policy_in_float32():
    model = _model(torch.float32)
    ids = torch.randint(256, (2, 7))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with sampling_adapter(model, "merged"):
            merged = model(input_ids=ids).logits
        with model.disable_adapter():
            base = model(input_ids=ids).logits
    assert torch.allclose(merged, expected, atol=1e-5)
    assert not torch.allclose(base, expected, atol=1e-3)  # the adapter does change the outputs


def test_fewer_aten_calls_per_decode_step():
    as_trained, base_dtype, merged = (decode_step_calls(mode) for mode in ("as_trained", "base_dtype", "merged"))
    assert merged < base_dtype < as_trained


@pytest.mark.parametrize("mode", ["base_dtype", "merged"])
def test_a_fit_samples_through_it_and_keeps_a_float32_adapter(make_module, mode):
    module = make_module([count_a], sampling=tiny_sampling(sampling_adapter=mode))
    make_trainer(max_steps=2).fit(module, prompt_loader(["1+1=", "2+3="], repeat=2))
    assert all(p.dtype == torch.float32 for p in module.policy.parameters() if p.requires_grad)


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="sampling_adapter='bf16' is not valid; choose one of 'as_trained'"):
        GRPOConfig(sampling=SamplingConfig(sampling_adapter="bf16"))
