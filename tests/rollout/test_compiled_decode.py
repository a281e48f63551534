"""The compiled decode path: compiles once per bucket, reads the live adapter, samples what the eager loop samples."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch._dynamo
from peft import LoraConfig, get_peft_model
from torch._dynamo.utils import counters

from lightning_grpo.rollout import SampleRequest, SamplingSettings, generate_rollout
from lightning_grpo.rollout import decode as decode_module
from lightning_grpo.rollout import generation as generation_module
from lightning_grpo.rollout.buckets import DecodeBuckets, check_decode_lengths, pick_decode_path
from lightning_grpo.rollout.compiled_decode import CompiledDecoder, compile_blocker
from lightning_grpo.rollout.sampling_settings import eos_token_ids
from lightning_grpo.testing import build_tiny_model
from tests.rollout.test_truncated_sampling import check_recorded, trainer_replay

PROMPTS = ["1+2=", "33+4=", "x", "hello world"]
OPTIONS = [
    {"sampler": "multinomial"},
    {"sampler": "inverse_cdf"},
    {"sampler": "multinomial", "temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_new_tokens": 3},
    {"sampler": "inverse_cdf", "temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "min_new_tokens": 3},
]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _decoder(max_prompt_length: int = 16, max_new_tokens: int = 16) -> CompiledDecoder:
    buckets = DecodeBuckets.for_run(None, max_prompt_length=max_prompt_length, max_new_tokens=max_new_tokens)
    return CompiledDecoder(buckets, backend="eager")  # dynamo's tracing and guards, without code generation


def _policy(tokenizer, dtype=torch.float32):
    torch.manual_seed(0)
    base = build_tiny_model(tokenizer).to(dtype)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)
    return get_peft_model(base, config).eval()


def _eager(model, tokenizer, prompts, settings, seed):
    ids, mask = generation_module.tokenize_prompts(tokenizer, prompts, 16, torch.device("cpu"))
    torch.manual_seed(seed)
    with torch.no_grad():
        return decode_module.decode_loop(model, ids, mask, settings, eos_token_ids(tokenizer), tokenizer.pad_token_id)


def _compiled(decoder, model, tokenizer, prompts, settings, seed):
    ids, mask = generation_module.tokenize_prompts(tokenizer, prompts, 16, torch.device("cpu"))
    torch.manual_seed(seed)
    return decoder.sample(model, tokenizer, SampleRequest(ids, mask, settings))


@pytest.mark.parametrize("options", OPTIONS)
def test_float64_compiled_path_samples_the_eager_tokens(tokenizer, options):
    """Same seed, same tokens, log-probs and margins as the eager loop, for each sampler and processor (uniforms drawn
    outside the graph); the rows of a bucket past the call's rows change nothing."""
    model = _policy(tokenizer, torch.float64)
    settings = SamplingSettings(num_generations=3, max_new_tokens=16, **options)  # 12 rows: bucket of 16
    decoder = _decoder()
    for seed in (0, 1):
        eager = _eager(model, tokenizer, PROMPTS, settings, seed)
        ours = _compiled(decoder, model, tokenizer, PROMPTS, settings, seed)
        assert torch.equal(ours.sequences, eager.sequences)
        torch.testing.assert_close(ours.logprobs, eager.logprobs, atol=1e-10, rtol=0)
        if settings.truncates:
            torch.testing.assert_close(ours.margins, eager.margins, atol=1e-10, rtol=0)
            assert ours.margins.isfinite().any()
        else:
            assert ours.margins is None and eager.margins is None
    assert not counters["graph_break"]


@pytest.mark.parametrize("sampler", ["multinomial", "inverse_cdf"])
def test_no_recompile_across_20_rollouts_with_changing_adapter_and_shapes(tokenizer, sampler):
    """Prompt lengths and counts vary within the buckets, the adapter changes every rollout: after the first call of
    each bucket nothing compiles again, and nothing breaks the graph."""
    model = _policy(tokenizer)
    decoder = _decoder()
    settings = SamplingSettings(num_generations=2, max_new_tokens=8, sampler=sampler, temperature=0.9)
    words = ["1+2=", "33+4=", "x", "hello world", "7", "12+30=", "abc abc", "9+9="]
    for count in (3, 4):  # 6 and 8 rows: one bucket of 8 rows; then 2 prompts, 4 rows: a bucket of 4
        _compiled(decoder, model, tokenizer, words[:count], settings, 0)
    _compiled(decoder, model, tokenizer, words[:2], settings, 0)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == 2
    lora = [p for name, p in model.named_parameters() if "lora_" in name]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in range(20):
            with torch.no_grad():
                for parameter in lora:
                    parameter.add_(0.05 * torch.randn_like(parameter))  # an optimizer step, in place
            start, count = step % len(words), 2 + step % 3
            prompts = (words + words)[start : start + count]
            _compiled(decoder, model, tokenizer, prompts, settings, step)
    assert counters["stats"]["unique_graphs"] == graphs
    assert not counters["graph_break"]


def test_compiled_step_reads_the_adapter_after_an_update(tokenizer):
    """An adapter update (in place, and a swap of the weights' data as sampling_adapter does) reaches the compiled
    step: it samples what the eager loop samples from the new weights, which differs from before."""
    model = _policy(tokenizer, torch.float64)
    decoder = _decoder()
    settings = SamplingSettings(num_generations=4, max_new_tokens=12)
    before = _compiled(decoder, model, tokenizer, PROMPTS, settings, 3)
    lora_b = [p for name, p in model.named_parameters() if "lora_B" in name]
    with torch.no_grad():
        for parameter in lora_b[: len(lora_b) // 2]:
            parameter.mul_(20.0)
        for parameter in lora_b[len(lora_b) // 2 :]:
            parameter.data = parameter.data * -20.0  # new storage, as sampling_adapter's swaps
    after = _compiled(decoder, model, tokenizer, PROMPTS, settings, 3)
    eager = _eager(model, tokenizer, PROMPTS, settings, 3)
    assert torch.equal(after.sequences, eager.sequences)
    assert not torch.equal(after.sequences, before.sequences)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("options", OPTIONS[2:])
def test_behaviour_logprobs_equal_the_training_pass(tokenizer, options):
    """``as_trained``: the log-probs the compiled path records are those training computes over the kept sets it
    replays from the margins (the existing tolerance), past ``min_new_tokens``' EOS ban; every step (the ban included)
    matches a recomputation of the kept sets."""
    model = _policy(tokenizer)
    decoder = _decoder()
    settings = SamplingSettings(num_generations=3, max_new_tokens=12, **options)
    torch.manual_seed(0)
    rollout = generate_rollout(model, tokenizer, PROMPTS, settings, max_prompt_length=16, sample=decoder.sample)
    trained = trainer_replay(model, rollout, settings.temperature)
    mask = rollout.completion_mask.bool()
    mask[:, : settings.min_new_tokens] = False
    torch.testing.assert_close(rollout.logprobs[mask], trained[mask], atol=1e-4, rtol=0)
    check_recorded(model, tokenizer, rollout, settings)
    mask = rollout.completion_mask.bool()
    assert (rollout.logprobs[mask] < 0).all() and (rollout.logprobs[~mask] == 0).all()


def test_min_new_tokens_and_eos_end_rows_as_the_eager_loop(tokenizer):
    """``min_new_tokens`` bars EOS for that many steps; a row ends at its EOS (pads after it, log-prob 0)."""
    model = _policy(tokenizer)
    settings = SamplingSettings(num_generations=2, max_new_tokens=10, min_new_tokens=10)
    decoder = _decoder()
    torch.manual_seed(0)
    rollout = generate_rollout(model, tokenizer, PROMPTS, settings, max_prompt_length=16, sample=decoder.sample)
    assert rollout.completion_mask.sum(-1).tolist() == [10] * 8
    short = replace(settings, min_new_tokens=0, max_new_tokens=16)
    torch.manual_seed(0)
    free = generate_rollout(model, tokenizer, PROMPTS, short, max_prompt_length=16, sample=decoder.sample)
    ended = ~free.truncated
    assert ended.any()  # a random tiny model ends some rows (EOS) within 16 tokens at this seed
    assert (free.logprobs[~free.completion_mask.bool()] == 0).all()


def test_a_call_longer_than_every_bucket_samples_eagerly(tokenizer, caplog):
    """A context past the longest length bucket is sampled by the eager loop, logged once."""
    model = _policy(tokenizer)
    decoder = CompiledDecoder(DecodeBuckets((20,)), backend="eager")
    settings = SamplingSettings(num_generations=2, max_new_tokens=16)
    eager = _eager(model, tokenizer, PROMPTS, settings, 0)
    with caplog.at_level("WARNING"):
        ours = _compiled(decoder, model, tokenizer, PROMPTS, settings, 0)
        _compiled(decoder, model, tokenizer, PROMPTS, settings, 0)
    assert torch.equal(ours.sequences, eager.sequences)
    assert counters["stats"]["unique_graphs"] == 0
    assert sum("longer than every length bucket" in r.message for r in caplog.records) == 1


def test_buckets_round_rows_and_lengths():
    buckets = DecodeBuckets.for_run([512, 256], max_prompt_length=100, max_new_tokens=128)
    assert buckets.lengths == (256, 512)
    assert [DecodeBuckets.rows(n) for n in (1, 2, 3, 8, 9, 1000, 1025)] == [1, 2, 4, 8, 16, 1024, 2048]
    assert buckets.length(100, 128) == 256 and buckets.length(200, 128) == 512 and buckets.length(400, 128) is None
    assert DecodeBuckets.for_run(None, max_prompt_length=100, max_new_tokens=100).lengths == (256,)


@pytest.mark.parametrize("lengths", [[128], [300, 200], [], [0], [256.0]])
def test_a_bucket_too_small_or_malformed_is_refused(lengths):
    with pytest.raises(ValueError, match="decode_lengths") as error:
        check_decode_lengths(lengths, max_prompt_length=100, max_new_tokens=128)
    if lengths and lengths[0] == 128:
        assert "at least 228" in str(error.value)


def test_decode_path_choice():
    assert pick_decode_path("compiled", "cpu") == "compiled" and pick_decode_path("eager", "cuda") == "eager"
    assert pick_decode_path("auto", "cuda") == "eager"  # today's default until a GPU has measured the compiled path
    with pytest.raises(ValueError, match=r"\['auto', 'eager', 'compiled'\]"):
        pick_decode_path("fast", "cpu")


def test_a_model_that_cannot_compile_is_named(tokenizer, monkeypatch):
    model = _policy(tokenizer)
    assert compile_blocker(model) == ""
    monkeypatch.setattr(type(model.get_base_model()), "_can_compile_fullgraph", False)
    assert "Qwen2ForCausalLM does not support a static KV cache" in compile_blocker(model)


def test_sampling_adapter_modes_are_honoured_without_recompiling(tokenizer):
    """``base_dtype`` and ``merged`` sample what the eager loop samples under the same mode; each mode compiles once,
    and entering it again (new weight storage each time) compiles nothing."""
    from lightning_grpo.policy.sampling_adapter import sampling_adapter

    model = _policy(tokenizer, torch.float64)  # base_dtype: the float32 LoRA weights cast to float64
    decoder = _decoder()
    settings = SamplingSettings(num_generations=2, max_new_tokens=8, sampler="inverse_cdf")
    graphs = 0
    for i, mode in enumerate(("merged", "base_dtype", "as_trained") * 2):
        graphs = counters["stats"]["unique_graphs"] if i == 3 else graphs
        with sampling_adapter(model, mode):
            ours = _compiled(decoder, model, tokenizer, PROMPTS, settings, 5)
            eager = _eager(model, tokenizer, PROMPTS, settings, 5)
        assert torch.equal(ours.sequences, eager.sequences)
        torch.testing.assert_close(ours.logprobs, eager.logprobs, atol=1e-10, rtol=0)
    assert 1 <= graphs <= 3 and counters["stats"]["unique_graphs"] == graphs  # the second round compiles nothing
    assert not counters["graph_break"]
