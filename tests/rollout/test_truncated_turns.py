"""Truncated sampling (top-k, top-p, min-p) on the multi-turn and agent paths: every sampled token's behaviour
log-prob is the one of the kept set it was drawn from, and its kept-set margin replays that set on a recomputation
(``Rollout.kept_margins``; 0 on inserted tokens, ``None`` when nothing truncates). The reference is a plain forward
of the same model over the final trajectories, with ``generate``'s warpers in ``generate``'s order."""

from __future__ import annotations

import pytest
import torch
from transformers.generation import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from lightning_grpo.agents import HermesToolCallParser
from lightning_grpo.iteration.rank_rows import idle_rollout
from lightning_grpo.rollout import Rollout, SamplingSettings, position_ids_from_mask
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.agent_client import AgentLimits, run_agents
from lightning_grpo.rollout.agent_wiring import empty_agent_rollout
from lightning_grpo.rollout.multi_turn import generate_conversations
from lightning_grpo.rollout.turn_cache import TurnCache
from lightning_grpo.testing import build_tiny_tokenizer
from lightning_grpo.testing.agents import CountdownEnv, short_turn_model

PROMPTS = [[{"role": "user", "content": "go"}], [{"role": "user", "content": "play 2"}]]
ROWS = [{"prompt": prompt} for prompt in PROMPTS]
CASES = {
    "top_p-top_k": {"top_p": 0.8, "top_k": 20},
    "top_p-top_k-min_p": {"top_p": 0.8, "top_k": 20, "min_p": 0.05},
    "none": {},
}
TEMPERATURE = 0.9


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return short_turn_model(tokenizer, eos_bias=2.0).double().eval()  # float64: the sampled logits, recomputed


def _settings(case: str, **extra) -> SamplingSettings:
    return SamplingSettings(num_generations=2, max_new_tokens=80, temperature=TEMPERATURE, **CASES[case], **extra)


def _reference(model, rollout: Rollout, settings: SamplingSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(N, T)`` log-probs of the completion tokens over generate's kept set, ``(N, T, V)`` that kept set, and
    ``(N, T, V)`` the temperature-scaled logits, from one forward over the final trajectories."""
    ids, mask = rollout.input_ids, rollout.attention_mask
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    logits = logits[:, rollout.prompt_ids.shape[1] - 1 : -1].float()  # (N, T, V): the logits of each completion token
    warpers = LogitsProcessorList([TemperatureLogitsWarper(settings.temperature)])
    if settings.top_k > 0:
        warpers.append(TopKLogitsWarper(settings.top_k))
    if settings.top_p < 1.0:
        warpers.append(TopPLogitsWarper(settings.top_p))
    if settings.min_p > 0.0:
        warpers.append(MinPLogitsWarper(settings.min_p))
    n, t, v = logits.shape
    scores = warpers(None, logits.reshape(n * t, v).clone()).view(n, t, v)
    logprobs = scores.log_softmax(-1).gather(-1, rollout.completion_ids[..., None]).squeeze(-1)
    return logprobs, torch.isfinite(scores), logits / settings.temperature


def _check(model, rollout: Rollout, settings: SamplingSettings) -> None:
    """The rollout's log-probs and margins against :func:`_reference` (see the module docstring)."""
    sampled = rollout.sampled_mask.bool() & rollout.completion_mask.bool()
    inserted = rollout.completion_mask.bool() & ~rollout.sampled_mask.bool()
    assert sampled.sum() >= 10 and inserted.any()  # several turns: sampled tokens after inserted ones
    logprobs, kept, z = _reference(model, rollout, settings)
    ids = rollout.completion_ids[..., None]
    assert kept.gather(-1, ids).squeeze(-1)[sampled].all()  # every sampled token is in generate's kept set
    torch.testing.assert_close(rollout.logprobs[sampled], logprobs[sampled], rtol=0, atol=1e-4)
    assert (rollout.logprobs[~sampled] == 0).all()
    if not settings.truncates:
        assert rollout.kept_margins is None
        return
    margins = rollout.kept_margins
    assert margins is not None and margins.shape == rollout.completion_ids.shape and margins.dtype == torch.float32
    assert (margins[~sampled] == 0).all()  # inserted tokens and padding
    assert (margins[sampled] >= 0).all() and (margins[sampled] > 0).any()
    assert (kept[sampled].sum(-1) <= settings.top_k).all()  # truncation did leave tokens out
    threshold = z.gather(-1, ids) - margins[..., None]  # (N, T, 1)
    replay = z >= threshold - 1e-4  # the smallest kept logit sits on the threshold: rounding may put it a hair below
    undecided = (z - threshold).abs() < 1e-4
    assert not ((replay != kept) & ~undecided)[sampled].any()  # the margin replays generate's kept set
    assert ((replay == kept)[sampled].all(-1)).float().mean() > 0.95  # and exactly, but for near-ties


def _conversations(model, tokenizer, settings, sample):
    agent = AgentSettings(environment_factory=CountdownEnv, max_turns=3)
    torch.manual_seed(0)
    return generate_conversations(model, tokenizer, PROMPTS, settings, agent, max_prompt_length=64,
                                  columns={"turns": [3, 3]}, sample=sample)  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_the_turn_cache_records_the_kept_set_of_every_turn(model, tokenizer, case):
    settings = _settings(case)
    cache = TurnCache()
    rollout = _conversations(model, tokenizer, settings, cache)
    assert cache.reused > 0  # later turns resumed from the kept caches
    _check(model, rollout, settings)


@pytest.mark.parametrize("sampler", ["multinomial", "inverse_cdf"], ids=["generate", "own-loop"])
@pytest.mark.parametrize("case", CASES)
def test_multi_turn_without_the_turn_cache_records_the_kept_set_of_every_turn(model, tokenizer, case, sampler):
    settings = _settings(case, sampler=sampler)
    _check(model, _conversations(model, tokenizer, settings, None), settings)


async def _two_call_agent(client, row):
    """Calls, then continues its history with a user message and calls again (one branch with inserted tokens)."""
    messages = list(row["prompt"])
    first = await client.chat.completions.create(model="policy", messages=messages)
    messages += [first.choices[0].message, {"role": "user", "content": "and?"}]
    await client.chat.completions.create(model="policy", messages=messages)
    return 1.0


@pytest.mark.parametrize("route", ["generate", "turn-cache"])
@pytest.mark.parametrize("case", CASES)
def test_agent_branches_record_the_kept_set_of_every_call(model, tokenizer, case, route):
    settings = _settings(case)
    sample = TurnCache() if route == "turn-cache" else None
    torch.manual_seed(0)
    rollout, stats = run_agents(model, tokenizer, _two_call_agent, ROWS, settings, HermesToolCallParser(),
                                max_prompt_length=64, limits=AgentLimits(), sample=sample)  # fmt: skip
    assert not stats.failures and len(rollout) == 4  # one branch per run
    _check(model, rollout, settings)


@pytest.mark.parametrize("truncates", [True, False], ids=["truncated", "whole-vocabulary"])
def test_a_rank_without_rows_has_margins_when_the_other_ranks_do(truncates):
    """The rollout of a rank whose agents made no call, and the made-up row it trains on, carry ``kept_margins``
    exactly when sampling truncates (zeros: the row samples nothing), like ``logprobs``."""
    empty = empty_agent_rollout(ROWS, truncates=truncates)
    idle = idle_rollout(empty)
    assert idle.logprobs is not None and idle.logprobs.shape == (1, 1)
    if not truncates:
        assert empty.kept_margins is None and idle.kept_margins is None
        return
    assert empty.kept_margins.shape == (0, 1) and empty.kept_margins.dtype == torch.float32
    assert idle.kept_margins.shape == (1, 1) and idle.kept_margins.dtype == torch.float32
    assert (idle.kept_margins == 0).all() and idle.sampled_mask.sum() == 0
