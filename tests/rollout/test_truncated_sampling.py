"""Truncated sampling records the distribution it drew from: on every Hugging Face path (``generate``, our eager loop
with each sampler, the compiled step) each sampled token's log-prob is renormalised over its kept set (top-k, top-p,
min-p in ``generate``'s order) and its margin replays that kept set; with nothing truncated, no margins and the
full-vocabulary log-probs as before.

The reference is a plain recomputation: a forward of the same model on the sampled sequences, ``logits / T``, and the
truncation rules written out here (not ``transformers``' warpers). The model is float64 (the samplers still work on
float32 logits), so that the incremental decode and the full forward agree to far below any kept-set boundary.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from lightning_grpo.rollout import Rollout, SamplingSettings, compiled_decode, generate_rollout
from lightning_grpo.rollout.buckets import DecodeBuckets
from lightning_grpo.rollout.compiled_decode import CompiledDecoder
from lightning_grpo.rollout.decode import decode_loop
from lightning_grpo.rollout.logprobs import completion_logits, position_ids_from_mask
from lightning_grpo.rollout.sampling_settings import eos_token_ids
from lightning_grpo.rollout.truncation import behaviour, warp
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer

PROMPTS = ["1+2=", "33+4=", "x", "hello world"]
TRUNCATING = {
    "top_p": {"top_p": 0.8},
    "top_k": {"top_k": 20, "temperature": 0.9},
    "min_p": {"min_p": 0.05},
    "all_three": {"top_p": 0.8, "top_k": 20, "min_p": 0.05, "temperature": 0.9},
}
PATHS = ["generate", "eager_multinomial", "eager_inverse_cdf", "compiled"]
TIE = 1e-5  # tokens this close to a kept set's boundary may fall either side (ties, the margin's rounding)


def kept_sets(z: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    """``(..., V)`` bool, the kept set of ``softmax(z)`` (``z = logits / T``, ``-inf`` where barred): top-k, then
    top-p, then min-p, each on the distribution the previous one left (``generate``'s order)."""
    kept = torch.isfinite(z)
    if settings.top_k > 0:
        kept &= z >= z.topk(settings.top_k, dim=-1).values[..., -1:]
    if settings.top_p < 1.0:
        probs, order = torch.softmax(z.masked_fill(~kept, -math.inf), -1).sort(-1, descending=True)
        before = probs.cumsum(-1) - probs  # the mass ranked strictly above each token
        kept &= torch.zeros_like(kept).scatter(-1, order, before < settings.top_p)
    if settings.min_p > 0.0:
        probs = torch.softmax(z.masked_fill(~kept, -math.inf), -1)
        kept &= probs >= settings.min_p * probs.amax(-1, keepdim=True)
    return kept


@torch.no_grad()
def replay(model, rollout: Rollout, settings: SamplingSettings, eos: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``z`` ``(N, T, V)`` (float32 ``logits / T`` of a full forward, EOS barred before ``min_new_tokens``) and the
    kept sets ``(N, T, V)`` of :func:`kept_sets`."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    width = rollout.prompt_ids.shape[1]
    z = logits[:, width - 1 : -1].float() / settings.temperature
    z[:, : settings.min_new_tokens, eos] = -math.inf
    return z, kept_sets(z, settings)


def check_recorded(model, tokenizer, rollout: Rollout, settings: SamplingSettings, atol: float = 1e-4) -> None:
    """The rollout's log-probs and margins are those of the recomputed kept sets, on every real token."""
    z, kept = replay(model, rollout, settings, eos_token_ids(tokenizer))
    real = rollout.completion_mask.bool()
    token = rollout.completion_ids[..., None]
    z_token = z.gather(-1, token).squeeze(-1)
    assert kept.gather(-1, token).squeeze(-1)[real].all(), "a sampled token outside its kept set"
    expected = z_token - z.masked_fill(~kept, -math.inf).logsumexp(-1)
    torch.testing.assert_close(rollout.logprobs[real], expected[real], atol=atol, rtol=0)
    if not settings.truncates:
        assert rollout.kept_margins is None
        return
    margins = rollout.kept_margins
    assert (margins[~real] == 0).all() and (margins[real] >= 0).all()
    assert torch.equal(margins[real].isinf(), kept.all(-1)[real]), "inf exactly where the whole vocabulary is kept"
    threshold = (z_token - margins)[..., None]
    replayed = z >= threshold
    near = (z - threshold).abs() <= TIE
    wrong = (replayed ^ kept) & ~near & real[..., None]
    assert not wrong.any(), f"{int(wrong.sum())} tokens the margin puts on the wrong side of the kept set"


@torch.no_grad()
def trainer_replay(model, rollout: Rollout, temperature: float) -> torch.Tensor:
    """``(N, T)`` what the trainer computes from the rollout: the log-prob of each token over the kept set it replays
    from the margin on its own logits, ``{v: z[v] >= z[token] - margin - TIE}`` (the whole vocabulary without
    margins). The lowest kept token lies exactly on the boundary, so logits recomputed in float32 (a full forward,
    not the sampler's incremental one) need the tolerance to keep it."""
    z = completion_logits(model, rollout, share_prompt=False).float() / temperature
    z_token = z.gather(-1, rollout.completion_ids[..., None])
    if rollout.kept_margins is not None:
        z = z.masked_fill(z < z_token - rollout.kept_margins[..., None] - TIE, -math.inf)
    return (z_token.squeeze(-1) - z.logsumexp(-1)) * rollout.completion_mask


def _eager_multinomial(model, tokenizer, request):
    """Our eager loop with the default sampler (``sample_tokens`` would hand it to ``generate``)."""
    eos, pad = eos_token_ids(tokenizer), tokenizer.pad_token_id
    return decode_loop(model, request.prompt_ids, request.prompt_mask, request.settings, eos, pad)


def _sampler(path: str, settings: SamplingSettings):
    """The settings and sample function of a path."""
    if path == "eager_inverse_cdf":
        return replace(settings, sampler="inverse_cdf", drop_finished=True), None
    if path == "eager_multinomial":
        return settings, _eager_multinomial
    if path == "compiled":
        buckets = DecodeBuckets.for_run(None, max_prompt_length=16, max_new_tokens=settings.max_new_tokens)
        return settings, CompiledDecoder(buckets, backend="eager").sample
    return settings, None


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(build_tiny_tokenizer()).to(torch.float64).eval()


@pytest.fixture(autouse=True)
def eager_compile(monkeypatch):
    monkeypatch.setattr(compiled_decode, "COMPILE_BACKEND", "eager")


def _rollout(model, tokenizer, path: str, options: dict, seed: int = 0, **extra) -> tuple[Rollout, SamplingSettings]:
    settings = SamplingSettings(num_generations=3, max_new_tokens=8, **options, **extra)
    settings, sample = _sampler(path, settings)
    torch.manual_seed(seed)
    return generate_rollout(model, tokenizer, PROMPTS, settings, max_prompt_length=16, sample=sample), settings


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("options", list(TRUNCATING.values()), ids=list(TRUNCATING))
def test_truncated_paths_record_the_kept_set(model, tokenizer, path, options):
    rollout, settings = _rollout(model, tokenizer, path, options)
    check_recorded(model, tokenizer, rollout, settings)
    real = rollout.completion_mask.bool()
    _, kept = replay(model, rollout, settings, eos_token_ids(tokenizer))
    assert (kept.sum(-1)[real] < kept.shape[-1]).any(), "nothing was truncated: the test would mean nothing"
    assert rollout.kept_margins[real].isfinite().any()


@pytest.mark.parametrize("path", PATHS)
def test_without_truncation_no_margins_and_full_vocabulary_logprobs(model, tokenizer, path):
    rollout, settings = _rollout(model, tokenizer, path, {"temperature": 0.9})
    assert not settings.truncates and rollout.kept_margins is None
    check_recorded(model, tokenizer, rollout, settings)


@pytest.mark.parametrize("path", ["generate", "compiled"])
def test_min_new_tokens_records_what_the_eager_loop_draws_from(model, tokenizer, path):
    """Under ``min_new_tokens`` (EOS barred) ``generate``'s recorder replays the ban: the same tokens, log-probs and
    margins as our loop, which records from the scores it drew from; both match the recomputation with EOS barred."""
    options = {"top_k": 20, "top_p": 0.8, "temperature": 0.9, "min_new_tokens": 4}
    eager, settings = _rollout(model, tokenizer, "eager_multinomial", options, seed=2)
    ours, _ = _rollout(model, tokenizer, path, options, seed=2)
    assert torch.equal(ours.completion_ids, eager.completion_ids)
    real = eager.completion_mask.bool()
    torch.testing.assert_close(ours.logprobs[real], eager.logprobs[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.kept_margins, eager.kept_margins, atol=1e-5, rtol=0)
    check_recorded(model, tokenizer, eager, settings)


def test_behaviour_on_a_hand_made_row():
    """``z = [2, 1, 0, -1]`` at T=1: top-2 keeps {0, 1}; the whole vocabulary gives an infinite margin; an ended row
    records zeros."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]] * 3)
    settings = SamplingSettings(1, 1, top_k=2)
    chosen, ended = torch.tensor([1, 0, 3]), torch.tensor([False, False, True])
    logprobs, margins = behaviour(logits, warp(logits, settings), chosen, settings, ended)
    mass = math.log(math.exp(2.0) + math.exp(1.0))
    torch.testing.assert_close(logprobs, torch.tensor([1.0 - mass, 2.0 - mass, 0.0]))
    torch.testing.assert_close(margins, torch.tensor([0.0, 1.0, 0.0]))
    wide = SamplingSettings(1, 1, top_k=4, temperature=0.5)
    logprobs, margins = behaviour(logits, warp(logits, wide), chosen, wide)
    torch.testing.assert_close(logprobs, (logits / 0.5).log_softmax(-1).gather(-1, chosen[:, None]).squeeze(-1))
    assert margins.isinf().all()
    plain = SamplingSettings(1, 1, temperature=0.5)
    logprobs, margins = behaviour(logits, warp(logits, plain), chosen, plain)
    scaled = logits / 0.5  # the arithmetic it always was: bit for bit
    assert margins is None and torch.equal(
        logprobs, scaled.gather(-1, chosen[:, None]).squeeze(-1) - scaled.logsumexp(-1)
    )


def test_min_p_is_one_of_the_warpers():
    """min-p after top-p: ``p = softmax([2, 1, 0, -3])``, min_p 0.3 keeps the tokens with ``p >= 0.3 * p_max``."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -3.0]])
    kept = torch.isfinite(warp(logits, SamplingSettings(1, 1, min_p=0.3)))
    assert kept.tolist() == [[True, True, False, False]]  # e^-1 = 0.37 >= 0.3 > e^-2 = 0.14
    kept = torch.isfinite(warp(logits, SamplingSettings(1, 1, min_p=0.3, top_k=1)))
    assert kept.tolist() == [[True, False, False, False]]
