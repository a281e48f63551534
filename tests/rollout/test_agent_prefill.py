"""Agent calls that share a prompt share its prefill: the G first calls of a row are one prompt of a sampling call,
prefilled once, as in the ordinary rollout; distinct prompts stay apart (docs/agents.md, cost)."""

from __future__ import annotations

import itertools

import pytest
import torch

from lightning_grpo.agents import HermesToolCallParser
from lightning_grpo.backends.hf import HFSession
from lightning_grpo.rollout import completion_logprobs
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.agent_client import AgentLimits, run_agents
from lightning_grpo.rollout.agent_client.grouping import PADDING, group_calls
from lightning_grpo.rollout.multi_turn import generate_conversations
from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.testing.agents import short_turn_model

ROWS = [{"prompt": [{"role": "user", "content": f"question {i}: {i}+{i}?"}]} for i in range(8)]


async def one_call(client, row):
    await client.chat.completions.create(model="policy", messages=row["prompt"])
    return 1.0


class PrefillCounter:
    """Counts the rows of the model's forwards over more than one position (prefills; a decoding step has one)."""

    def __init__(self, model):
        self.rows: list[int] = []
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 1:
            self.rows.append(int(ids.shape[0]))

    def close(self):
        self._handle.remove()


def _agents(model, tokenizer, agent, rows=ROWS, g=8, sample=None, max_new_tokens=6):
    torch.manual_seed(0)
    settings = SamplingSettings(num_generations=g, max_new_tokens=max_new_tokens)
    return run_agents(model, tokenizer, agent, rows, settings, HermesToolCallParser(), max_prompt_length=64,
                      limits=AgentLimits(), sample=sample)  # fmt: skip


def _counted(model, run):
    counter = PrefillCounter(model)
    try:
        return run(), counter.rows
    finally:
        counter.close()


@pytest.mark.parametrize("turn_cache", [False, True], ids=["generate", "turn_cache"])
def test_64_calls_over_8_prompts_cost_8_prefills_as_the_ordinary_rollout(tokenizer, turn_cache):
    model = short_turn_model(tokenizer).eval()
    session = HFSession(model, "as_trained", turn_cache=turn_cache)
    (rollout, stats), agent_rows = _counted(model, lambda: _agents(model, tokenizer, one_call, sample=session))
    assert stats.batches == [64] and len(rollout) == 64 and not stats.failures
    assert agent_rows == [8]  # one prefill forward over the 8 distinct prompts, not 64 prompt rows
    settings = SamplingSettings(num_generations=8, max_new_tokens=6)
    prompts, session = [row["prompt"] for row in ROWS], HFSession(model, "as_trained", turn_cache=turn_cache)
    _, ordinary_rows = _counted(model, lambda: generate_conversations(model, tokenizer, prompts, settings,
                                                                      AgentSettings(), max_prompt_length=64,
                                                                      sample=session))  # fmt: skip
    assert agent_rows == ordinary_rows


@pytest.mark.parametrize("turn_cache", [False, True], ids=["generate", "turn_cache"])
def test_grouped_calls_sample_the_ordinary_rollouts_tokens_and_logprobs(tokenizer, turn_cache):
    """Same seed, same prompts, the HF backend's session: the agents' rows are the ordinary rollout's, token for token
    (the batch is its first turn: 8 prompts × G=8 in the same order, the same random draws)."""
    model = short_turn_model(tokenizer).eval()
    rollout, _ = _agents(model, tokenizer, one_call, sample=HFSession(model, "as_trained", turn_cache=turn_cache))
    torch.manual_seed(0)
    settings = SamplingSettings(num_generations=8, max_new_tokens=6)
    session = HFSession(model, "as_trained", turn_cache=turn_cache)
    ordinary = generate_conversations(model, tokenizer, [row["prompt"] for row in ROWS], settings, AgentSettings(),
                                      max_prompt_length=64, sample=session)  # fmt: skip
    assert torch.equal(rollout.completion_mask, ordinary.completion_mask)
    mask = rollout.completion_mask.bool()
    assert torch.equal(rollout.completion_ids[mask], ordinary.completion_ids[mask])
    assert torch.equal(rollout.logprobs[mask], ordinary.logprobs[mask])
    assert torch.equal(rollout.prompt_ids[rollout.prompt_mask.bool()], ordinary.prompt_ids[ordinary.prompt_mask.bool()])


def test_distinct_prompts_are_not_merged(tokenizer):
    """Each run sends its own prompt: every prompt is prefilled once, alone, and each row keeps its own prompt."""
    numbers = itertools.count()

    async def own_prompt(client, row):
        content = f"{row['prompt'][0]['content']} (run {next(numbers)})"
        reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": content}],
                                                     extra_body={"return_token_ids": True})  # fmt: skip
        return float(len(reply.prompt_token_ids))

    model = short_turn_model(tokenizer).eval()
    (rollout, stats), prefilled = _counted(model, lambda: _agents(model, tokenizer, own_prompt, rows=ROWS[:2], g=4))
    assert stats.batches == [8] and prefilled == [8]  # 8 distinct prompts: 8 prompt rows
    prompts = [rollout.prompts[i][0]["content"] for i in range(8)]
    assert len(set(prompts)) == 8
    texts = [tokenizer.decode(ids[mask.bool()]) for ids, mask in zip(rollout.prompt_ids, rollout.prompt_mask,
                                                                      strict=True)]  # fmt: skip
    assert all(prompt in text for prompt, text in zip(prompts, texts, strict=True))


def test_a_missing_call_leaves_a_padding_row_that_is_sampled_and_dropped(tokenizer):
    """One run of row 0 raises before calling: 63 calls, groups of 7 and 8, one g=8 call (a padding row)."""
    numbers = itertools.count()

    async def all_but_one(client, row):
        if next(numbers) == 0:
            raise ValueError("no call")
        return await one_call(client, row)

    model = short_turn_model(tokenizer).eval()
    (rollout, stats), prefilled = _counted(model, lambda: _agents(model, tokenizer, all_but_one))
    assert stats.batches == [63] and len(stats.failures) == 1 and prefilled == [8]
    assert len(rollout) == 63 and rollout.group_ids.tolist() == [0] * 7 + [g for g in range(1, 8) for _ in range(8)]
    train = completion_logprobs(model, rollout, temperature=1.0, fused_head=False).logprobs
    mask = rollout.sampled_mask.bool()
    torch.testing.assert_close(rollout.logprobs[mask], train[mask].float(), rtol=0, atol=1e-4)


def test_group_calls_groups_equal_contexts_of_new_branches_only():
    same = [[1, 2]] * 4 + [[3]] * 4
    assert group_calls(same, [True] * 8) == group_calls(same, [True] * 8)
    groups = group_calls(same, [True] * 8)
    assert (groups.prompts, groups.members, groups.g) == ([0, 4], list(range(8)), 4)
    # calls that continue a branch are sampled alone, even with an equal context
    assert group_calls([[1, 2]] * 2, [False, False]).g == 1
    assert group_calls([[1, 2]] * 2, [True, False]).prompts == [0, 1]
    # equal contexts apart in the batch are one group, in the order of its first call
    apart = group_calls([[1], [2], [1], [2]], [True] * 4)
    assert (apart.prompts, apart.members, apart.g) == ([0, 1], [0, 2, 1, 3], 2)


def test_group_calls_pads_within_the_slack_and_otherwise_shares_less():
    seven_and_eight = group_calls([[0]] * 7 + [[1]] * 8, [True] * 15)  # 1 padding row of 16: within 1/8
    assert seven_and_eight.g == 8 and seven_and_eight.members == [*range(7), PADDING, *range(7, 15)]
    # a group of 8 and 8 calls alone: padding each to 8 would sample 72 rows for 16 calls; g=1 samples 16
    mixed = group_calls([[0]] * 8 + [[i] for i in range(1, 9)], [True] * 16)
    assert mixed.g == 1 and len(mixed.prompts) == 16
    six_and_four = group_calls([[0]] * 6 + [[1]] * 4, [True] * 10)  # 2 divides both: no padding
    assert six_and_four.g == 2 and six_and_four.prompts == [0, 2, 4, 6, 8] and PADDING not in six_and_four.members


def test_equal_messages_are_rendered_once_per_rollout(tokenizer, monkeypatch):
    from lightning_grpo.rollout.agent_client import recorder

    rendered = []
    render = recorder.render_messages
    monkeypatch.setattr(recorder, "render_messages", lambda *a, **k: rendered.append(1) or render(*a, **k))
    rollout, _ = _agents(short_turn_model(tokenizer).eval(), tokenizer, one_call)
    assert len(rollout) == 64 and len(rendered) == 8  # the G runs of a row render their first call once
