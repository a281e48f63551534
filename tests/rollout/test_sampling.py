"""Sampling speed work keeps the distribution: shared prompt prefill, our decoding loop, its samplers, dropped rows."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lightning_grpo.rollout import SamplingSettings, compiled_decode, completion_logprobs, generate_rollout
from lightning_grpo.rollout import decode as decode_module
from lightning_grpo.rollout import generation as generation_module
from lightning_grpo.rollout.buckets import DecodeBuckets
from lightning_grpo.rollout.compiled_decode import CompiledDecoder
from lightning_grpo.rollout.sampling_settings import eos_token_ids
from lightning_grpo.testing import build_tiny_model
from tests.rollout.test_truncated_sampling import check_recorded, trainer_replay

PROMPTS = ["1+2=", "33+4=", "x", "hello world"]


def _sample(model, tokenizer, settings, seed=0, prompts=PROMPTS):
    torch.manual_seed(seed)
    return generate_rollout(model, tokenizer, prompts, settings, max_prompt_length=16)


@pytest.mark.parametrize(
    "options",
    [{}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}, {"min_new_tokens": 6}],
)
def test_shared_prefill_and_our_loop_draw_what_generate_draws(tokenizer, options):
    """Same seed, same tokens: prefilling once per prompt (and our loop with torch.multinomial) change no draw."""
    model = build_tiny_model(tokenizer).eval()
    plain = SamplingSettings(num_generations=4, max_new_tokens=16, share_prompt=False, **options)
    reference = _sample(model, tokenizer, plain)
    shared = _sample(model, tokenizer, replace(plain, share_prompt=True))
    assert torch.equal(shared.completion_ids, reference.completion_ids)
    ids, mask = generation_module.tokenize_prompts(tokenizer, PROMPTS, 16, torch.device("cpu"))
    torch.manual_seed(0)
    with torch.no_grad():
        ours = decode_module.decode_loop(model, ids, mask, plain, eos_token_ids(tokenizer), tokenizer.pad_token_id)
    valid = reference.completion_mask.bool()
    assert torch.equal(ours.sequences[:, ids.shape[1] :][valid], reference.completion_ids[valid])
    # every path records the same behaviour log-probs and margins, and training scores the tokens the same way
    torch.testing.assert_close(shared.logprobs, reference.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.logprobs[valid], reference.logprobs[valid], atol=1e-5, rtol=0)
    if plain.truncates:
        torch.testing.assert_close(shared.kept_margins, reference.kept_margins, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.margins[valid], reference.kept_margins[valid], atol=1e-5, rtol=0)
        assert reference.kept_margins[valid].isfinite().any()
    else:
        assert ours.margins is None and reference.kept_margins is None
    replayed = trainer_replay(model, reference, plain.temperature)  # over the kept sets the margins replay
    torch.testing.assert_close(replayed[valid], reference.logprobs[valid], atol=1e-4, rtol=0)
    if not plain.truncates:  # no margins: training's own log-probs, over the whole vocabulary
        trained = completion_logprobs(model, reference, temperature=plain.temperature).logprobs
        torch.testing.assert_close(trained[valid], reference.logprobs[valid], atol=1e-4, rtol=0)
    assert (reference.logprobs[~valid] == 0).all()


@pytest.mark.parametrize(
    "settings",
    [{}, {"sampler": "inverse_cdf", "drop_finished": True}, {"decode": "compiled"},
     {"decode": "compiled", "sampler": "inverse_cdf"}],
)  # fmt: skip
def test_rollout_records_the_logprobs_training_computes(tokenizer, settings, monkeypatch):
    """Behaviour log-probs (softmax at the temperature, renormalised over the kept set of top-k) equal training's over
    the kept set it replays from the margins, on every decode path (``decode: compiled`` traced by dynamo without code
    generation, to stay fast). During ``min_new_tokens``' EOS ban (outside the contract) they are those of the
    distribution drawn from, EOS barred, which training does not model: those steps are compared with a recomputation
    that bars EOS too."""
    model = build_tiny_model(tokenizer).eval()
    base = SamplingSettings(num_generations=3, max_new_tokens=12, temperature=0.7, top_k=20, min_new_tokens=2)
    settings = dict(settings)
    sample = None
    if settings.pop("decode", None) == "compiled":
        monkeypatch.setattr(compiled_decode, "COMPILE_BACKEND", "eager")
        sample = CompiledDecoder(DecodeBuckets.for_run(None, max_prompt_length=16, max_new_tokens=12)).sample
    torch.manual_seed(0)
    settings = replace(base, **settings)
    rollout = generate_rollout(model, tokenizer, PROMPTS, settings, max_prompt_length=16, sample=sample)
    trained = trainer_replay(model, rollout, temperature=0.7)
    mask = rollout.completion_mask.bool()
    mask[:, : settings.min_new_tokens] = False  # the EOS ban: below
    torch.testing.assert_close(rollout.logprobs[mask], trained[mask], atol=1e-4, rtol=0)
    check_recorded(model, tokenizer, rollout, settings)  # every step, the ban included
    mask = rollout.completion_mask.bool()
    assert (rollout.logprobs[mask] < 0).all() and (rollout.logprobs[~mask] == 0).all()


def test_min_new_tokens_gives_fixed_length_completions(tokenizer):
    model = build_tiny_model(tokenizer)
    rollout = _sample(model, tokenizer, SamplingSettings(num_generations=4, max_new_tokens=12, min_new_tokens=12))
    assert rollout.truncated.all() and (rollout.completion_lengths == 12).all()


def test_inverse_cdf_sampler_draws_from_the_softmax(tokenizer):
    """4,000 first tokens from one prompt against softmax(logits / T): Pearson's chi-square within its 99.9% bound."""
    model = build_tiny_model(tokenizer).eval()
    settings = SamplingSettings(num_generations=4000, max_new_tokens=1, temperature=0.7, sampler="inverse_cdf")
    rollout = _sample(model, tokenizer, settings, seed=1, prompts=["1+2="])
    with torch.no_grad():
        ids = tokenizer(["1+2="], add_special_tokens=False, return_tensors="pt")["input_ids"]
        probs = torch.softmax(model(ids).logits[0, -1] / 0.7, -1)
    counts = torch.bincount(rollout.completion_ids[:, 0], minlength=len(probs)).double()
    expected = probs.double() * len(rollout)
    cells = expected > 5
    chi2 = float(((counts[cells] - expected[cells]) ** 2 / expected[cells]).sum())
    dof = int(cells.sum()) - 1
    assert chi2 < dof + 3.1 * (2 * dof) ** 0.5 + 10, (chi2, dof)  # ~99.9% upper quantile
    assert counts[~cells].sum() <= expected[~cells].sum() * 3 + 10


@pytest.mark.parametrize("sampler", ["multinomial", "inverse_cdf"])
def test_dropping_finished_rows_keeps_every_step_on_its_distribution(tokenizer, monkeypatch, sampler):
    """Record the processed scores of every decoding step; the update pass's log-probs must equal them.

    With ``drop_finished``, the rows in the batch at step t are exactly those whose completion mask is 1 at t.
    """
    model = build_tiny_model(tokenizer).eval()
    recorded = []
    draw = decode_module._draw

    def recording_draw(scores, kind):
        chosen = draw(scores, kind)
        recorded.append(scores.log_softmax(-1).gather(-1, chosen[:, None]).squeeze(-1))
        return chosen

    monkeypatch.setattr(decode_module, "_draw", recording_draw)
    options = {"temperature": 0.8, "sampler": sampler, "drop_finished": True}
    settings = SamplingSettings(num_generations=6, max_new_tokens=24, **options)
    rollout = _sample(model, tokenizer, settings, seed=3)
    assert (~rollout.truncated).any(), "some rows must finish early for the test to mean anything"
    ours = completion_logprobs(model, rollout, temperature=0.8).logprobs
    for step, sampled in enumerate(recorded):
        alive = rollout.completion_mask[:, step].bool()
        assert int(alive.sum()) == len(sampled)
        torch.testing.assert_close(ours[alive, step], sampled, atol=1e-4, rtol=1e-4)


def test_static_cache_setting_reaches_generate(tokenizer):
    config = SamplingSettings(num_generations=2, max_new_tokens=4, static_cache=True).generation_config(tokenizer)
    assert config.cache_implementation == "static"
    assert not SamplingSettings(2, 4, static_cache=True, sampler="inverse_cdf").own_loop


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_static_cache_compiled_decode_on_cuda(tokenizer):
    """Static KV cache + torch.compile'd decode step (CUDA only) draws what the dynamic cache draws, same seed."""
    model = build_tiny_model(tokenizer).cuda().eval()
    dynamic = SamplingSettings(num_generations=2, max_new_tokens=8, share_prompt=False, temperature=0.7)
    static = replace(dynamic, static_cache=True)
    reference, compiled = _sample(model, tokenizer, dynamic), _sample(model, tokenizer, static)
    assert compiled.completion_ids.shape == reference.completion_ids.shape == (8, 8)
    assert torch.equal(compiled.completion_ids, reference.completion_ids)
    assert torch.equal(compiled.completion_mask, reference.completion_mask)
    assert len({tuple(row) for row in reference.completion_ids.tolist()}) > 1  # real draws, not one repeated row
    torch.testing.assert_close(
        completion_logprobs(model, compiled).logprobs, completion_logprobs(model, reference).logprobs
    )  # fmt: skip
