"""The compiled decode path on CUDA: inductor with CUDA graphs (``mode="reduce-overhead"``), exact against the eager
loop, reading the live adapter, compiled once (skipped without CUDA; run by ``benchmarks/gpu_run.sh tests``)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from peft import LoraConfig, get_peft_model
from torch._dynamo.utils import counters

from lightning_grpo.rollout import SampleRequest, SamplingSettings, completion_logprobs, generate_rollout
from lightning_grpo.rollout import decode as decode_module
from lightning_grpo.rollout import generation as generation_module
from lightning_grpo.rollout.buckets import DecodeBuckets
from lightning_grpo.rollout.compiled_decode import CompiledDecoder
from lightning_grpo.rollout.sampling_settings import eos_token_ids
from lightning_grpo.testing import build_tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = ["1+2=", "33+4=", "x", "hello world"]


@pytest.mark.parametrize("sampler", ["multinomial", "inverse_cdf"])
def test_cuda_graphs_sample_the_eager_tokens_and_follow_the_adapter(tokenizer, sampler):
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    base = build_tiny_model(tokenizer).to("cuda", torch.float64)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)).eval()
    decoder = CompiledDecoder(DecodeBuckets.for_run(None, max_prompt_length=16, max_new_tokens=12))
    settings = SamplingSettings(num_generations=3, max_new_tokens=12, sampler=sampler, top_k=20)
    ids, mask = generation_module.tokenize_prompts(tokenizer, PROMPTS, 16, torch.device("cuda"))
    eos = eos_token_ids(tokenizer)
    for step in range(3):
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.add_(0.3 * torch.randn_like(parameter))
        torch.manual_seed(step)
        ours = decoder.sample(model, tokenizer, SampleRequest(ids, mask, settings))
        torch.manual_seed(step)
        with torch.no_grad():
            eager = decode_module.decode_loop(model, ids, mask, settings, eos, tokenizer.pad_token_id)
        assert torch.equal(ours.sequences, eager.sequences)
        torch.testing.assert_close(ours.logprobs, eager.logprobs, atol=1e-9, rtol=0)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]


def test_cuda_compiled_logprobs_equal_training_in_float32(tokenizer):
    torch.manual_seed(0)
    model = build_tiny_model(tokenizer).to("cuda").eval()
    decoder = CompiledDecoder(DecodeBuckets.for_run(None, max_prompt_length=16, max_new_tokens=12))
    settings = SamplingSettings(num_generations=3, max_new_tokens=12, temperature=0.7, sampler="inverse_cdf")
    rollout = generate_rollout(model, tokenizer, PROMPTS, settings, max_prompt_length=16, sample=decoder.sample)
    trained = completion_logprobs(model, rollout, temperature=0.7).logprobs
    valid = rollout.completion_mask.bool()
    torch.testing.assert_close(rollout.logprobs[valid], trained[valid], atol=1e-4, rtol=0)
