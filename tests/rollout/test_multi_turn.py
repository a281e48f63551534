"""Multi-turn rollouts: turns interleave sampled and inserted tokens, ids are never re-tokenized, log-probs are those
of the sampling, tools and environments feed back, and budgets cut trajectories (docs/agents.md)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

from lightning_grpo.agents import EnvironmentFailedError, EnvStep, ToolExecutor, ToolSet
from lightning_grpo.rollout import SamplingSettings, completion_logprobs
from lightning_grpo.rollout import multi_turn as multi_turn_module
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.chat import render_messages
from lightning_grpo.rollout.sampling import sample_rollout
from lightning_grpo.rollout.sampling_settings import Sampled
from lightning_grpo.testing.agents import CountdownEnv, add, short_turn_model

PROMPTS = [[{"role": "user", "content": "go"}], [{"role": "user", "content": "play 2"}]]


def _runs(mask_row: torch.Tensor, value: int) -> list[tuple[int, int]]:
    """``(start, end)`` of every run of ``value`` in a 1-D 0/1 row."""
    runs, start = [], None
    for i, v in enumerate([*mask_row.tolist(), 1 - value]):
        if v == value and start is None:
            start = i
        elif v != value and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _env_rollout(tokenizer, model, *, turns=(1, 3), max_turns=4, budget=200, temperature=1.0, g=2):
    agent = AgentSettings(environment_factory=CountdownEnv, max_turns=max_turns)
    settings = SamplingSettings(num_generations=g, max_new_tokens=budget, temperature=temperature)
    torch.manual_seed(0)
    columns = {"turns": list(turns)}
    return sample_rollout(model, tokenizer, PROMPTS, settings, agent, max_prompt_length=64, columns=columns)


def test_environment_turns_interleave_sampled_and_inserted_tokens(tokenizer):
    model = short_turn_model(tokenizer)
    rollout = _env_rollout(tokenizer, model)
    assert rollout.turns.num_turns.tolist() == [1, 1, 3, 3] and not rollout.truncated.any()
    for i in range(len(rollout)):
        sampled = _runs(rollout.sampled_mask[i, : int(rollout.completion_lengths[i])], 1)
        inserted = _runs(rollout.sampled_mask[i, : int(rollout.completion_lengths[i])], 0)
        assert len(sampled) == rollout.turns.num_turns[i] and len(inserted) == len(sampled) - 1
        for start, end in inserted:  # the template's text between an assistant turn and the next one
            text = tokenizer.decode(rollout.completion_ids[i, start:end])
            assert text == "\nU:\nagain<eos>\nA:\n"
        roles = [m["role"] for m in rollout.completions[i]]
        assert roles == ["assistant", "user"] * (len(sampled) - 1) + ["assistant"]
        # no re-tokenization: prompt + trajectory tokens are exactly the template's rendering of the conversation
        ids = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist() + rollout.completion_token_ids[i]
        rendered = render_messages(tokenizer, rollout.prompts[i] + rollout.completions[i], add_generation_prompt=False)
        assert tokenizer.decode(ids) == rendered.removesuffix("\n")  # the template ends the last turn with a newline
    rewards = rollout.turns.turn_rewards
    assert [len(r) for r in rewards] == [1, 1, 3, 3]
    assert rollout.columns["env_reward"] == [sum(r) for r in rewards]
    assert rollout.columns["turns"] == [1, 1, 3, 3]


def test_multi_turn_logprobs_equal_the_sampling_distribution(tokenizer):
    """Every sampled token of every turn is scored by training with the distribution it was drawn from."""
    model = short_turn_model(tokenizer).eval()
    records: list[torch.Tensor] = []
    generate = model.generate

    def recording_generate(*args, **kwargs):
        out = generate(*args, **kwargs, output_scores=True, return_dict_in_generate=True)
        new = out.sequences[:, kwargs["input_ids"].shape[1] :]
        scores = torch.stack(out.scores, dim=1).log_softmax(-1)  # the processed (temperature) distribution
        records.append(scores.gather(-1, new[..., None]).squeeze(-1))
        return out.sequences

    model.generate = recording_generate
    rollout = _env_rollout(tokenizer, model, temperature=0.7)
    ours = completion_logprobs(model, rollout, temperature=0.7, fused_head=False).logprobs
    checked = 0
    for i in range(len(rollout)):
        segments = _runs(rollout.sampled_mask[i, : int(rollout.completion_lengths[i])], 1)
        for turn, (start, end) in enumerate(segments):
            row = sum(int(rollout.turns.num_turns[j]) > turn for j in range(i))  # its row in that turn's call
            sampled = records[turn][row, : end - start]
            torch.testing.assert_close(ours[i, start:end], sampled, atol=1e-4, rtol=1e-4)
            checked += end - start
    assert checked == int(rollout.sampled_mask.sum()) and len(records) == 3


def test_max_turns_and_the_token_budget_truncate(tokenizer):
    model = short_turn_model(tokenizer)
    cut = _env_rollout(tokenizer, model, turns=(3, 3), max_turns=2)
    assert cut.turns.num_turns.tolist() == [2] * 4
    assert cut.truncated.all() and cut.turns.max_turns_reached.all()
    short = _env_rollout(tokenizer, model, turns=(9, 9), max_turns=9, budget=12)
    assert short.completion_ids.shape[1] <= 12 and short.truncated.all()
    assert not short.turns.max_turns_reached.any()
    for i in range(len(short)):  # an observation that did not fit is in neither the tokens nor the messages
        text = tokenizer.decode(short.completion_token_ids[i])
        users = [m for m in short.completions[i] if m["role"] == "user"]
        assert text.count("U:\n") == len(users)


def test_groups_with_different_first_observations_sample_each_row(tokenizer):
    class Numbered(CountdownEnv):
        count = 0

        def reset(self):
            Numbered.count += 1
            return f"you are {Numbered.count}"

    model = short_turn_model(tokenizer)
    agent = AgentSettings(environment_factory=Numbered, max_turns=2)
    settings = SamplingSettings(num_generations=2, max_new_tokens=60)
    rollout = sample_rollout(
        model, tokenizer, PROMPTS, settings, agent, max_prompt_length=64, columns={"turns": [1, 1]}
    )
    assert [p[-1]["content"] for p in rollout.prompts] == [f"you are {k}" for k in (1, 2, 3, 4)]
    assert len({tuple(row.tolist()) for row in rollout.prompt_ids}) == 4


# ---------------------------------------------------------------- tools, with a scripted policy


def _scripted(tokenizer, script):
    """Replace sampling by ``script(context_text) -> turn text``; each turn ends with EOS."""

    def sample(model, tok, request):
        prompt_ids, prompt_mask, settings = request.prompt_ids, request.prompt_mask, request.settings
        ids = prompt_ids.repeat_interleave(settings.num_generations, dim=0)
        mask = prompt_mask.repeat_interleave(settings.num_generations, dim=0)
        texts = [script(tokenizer.decode(row[m.bool()])) for row, m in zip(ids, mask, strict=True)]
        turns = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
        width = max(map(len, turns))
        out = torch.full((len(turns), width), tokenizer.pad_token_id)
        for i, turn in enumerate(turns):
            out[i, : len(turn)] = torch.tensor(turn)
        return Sampled(torch.cat([ids, out], dim=1), torch.zeros(out.shape))

    return sample


def _call(name, arguments):
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


CALLS = {
    "ok": _call("add", '{"a": 2, "b": 3}'),
    "bad json": _call("add", '{"a": 2'),
    "unknown": _call("mul", '{"a": 2, "b": 3}'),
    "raises": _call("fail", "{}"),
    "hangs": _call("sleep", "{}"),
}


def fail() -> int:
    """Always fails."""
    raise RuntimeError("boom")


def sleep() -> int:
    """Sleeps for a while."""
    time.sleep(2)
    return 0


def test_tool_calls_run_and_their_errors_become_messages(tokenizer, monkeypatch):
    def script(context: str) -> str:
        if "T:\n" in context:  # a tool answered: give the final answer
            return "done"
        return CALLS[context.split("U:\n")[-1].split("<eos>")[0]]

    monkeypatch.setattr(multi_turn_module, "sample_tokens", _scripted(tokenizer, script))
    agent = AgentSettings(executor=ToolExecutor(ToolSet([add, fail, sleep]), timeout=0.5), max_turns=3)
    prompts = [[{"role": "user", "content": key}] for key in CALLS]
    start = time.perf_counter()
    rollout = sample_rollout(
        torch.nn.Linear(1, 1), tokenizer, prompts, SamplingSettings(2, 400), agent, max_prompt_length=2000
    )
    assert time.perf_counter() - start < 1.9, "a hanging tool is abandoned after its timeout"
    tool_messages = [rollout.completions[i][1] for i in range(0, len(rollout), 2)]
    assert tool_messages[0] == {"role": "tool", "name": "add", "content": "5"}
    assert "not valid JSON" in tool_messages[1]["content"]
    assert "mul" in tool_messages[2]["content"] and "add" in tool_messages[2]["content"]  # unknown: names the tools
    assert "boom" in tool_messages[3]["content"]
    assert "timed out" in tool_messages[4]["content"]
    assert all(m["content"].startswith("Error") for m in tool_messages[1:])
    assert rollout.completions[0][0]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert rollout.completions[0][-1] == {"role": "assistant", "content": "done"}
    assert rollout.turns.num_turns.tolist() == [2] * 10 and rollout.turns.tool_calls.tolist() == [1] * 10
    assert rollout.turns.tool_errors.tolist() == [0, 0, 1, 1, 1, 1, 1, 1, 0, 0]
    assert rollout.turns.tool_timeouts.tolist() == [0] * 8 + [1, 1]
    inserted = rollout.completion_mask.bool() & ~rollout.sampled_mask.bool()
    assert tokenizer.decode(rollout.completion_ids[0][inserted[0]]) == "\nT:\n5<eos>\nA:\n"


def test_a_policy_that_keeps_calling_is_cut_at_max_turns(tokenizer, monkeypatch):
    monkeypatch.setattr(multi_turn_module, "sample_tokens", _scripted(tokenizer, lambda context: CALLS["ok"]))
    agent = AgentSettings(executor=ToolExecutor(ToolSet([add])), max_turns=3)
    model = torch.nn.Linear(1, 1)  # never called: the sampling is scripted
    rollout = sample_rollout(model, tokenizer, PROMPTS[:1], SamplingSettings(2, 400), agent, max_prompt_length=2000)
    assert rollout.turns.num_turns.tolist() == [3, 3] and rollout.truncated.all()
    assert rollout.turns.max_turns_reached.all() and rollout.turns.tool_calls.tolist() == [3, 3]


def test_the_samplers_margins_reach_the_rollout_and_inserted_tokens_have_none(tokenizer, monkeypatch):
    """Each turn's kept-set margins land on its sampled tokens; inserted tokens and padding get 0; settings that
    truncate nothing (or a sampler that records none) give no margins and the same rollout otherwise."""
    scripted = _scripted(tokenizer, lambda context: "done" if "T:\n" in context else CALLS["ok"])
    calls = []

    def with_margins(model, tok, request):  # margin k on every token of the k-th call
        out = scripted(model, tok, request)
        calls.append(request)
        return Sampled(out.sequences, out.logprobs, torch.full(out.logprobs.shape, float(len(calls))))

    agent = AgentSettings(executor=ToolExecutor(ToolSet([add])), max_turns=3)
    rollouts = {}
    for name, sample, settings in [("top_p", with_margins, SamplingSettings(2, 400, top_p=0.9)),
                                   ("none", scripted, SamplingSettings(2, 400)),
                                   ("unrecorded", scripted, SamplingSettings(2, 400, top_p=0.9))]:  # fmt: skip
        monkeypatch.setattr(multi_turn_module, "sample_tokens", sample)
        rollouts[name] = sample_rollout(torch.nn.Linear(1, 1), tokenizer, PROMPTS[:1], settings, agent,
                                        max_prompt_length=2000)  # fmt: skip
    rollout, plain = rollouts["top_p"], rollouts["none"]
    assert rollout.turns.num_turns.tolist() == [2, 2] and len(calls) == 2
    margins = rollout.kept_margins
    assert margins is not None and margins.shape == rollout.completion_ids.shape
    for i in range(len(rollout)):
        n = int(rollout.completion_lengths[i])
        turns = _runs(rollout.sampled_mask[i, :n], 1)
        assert len(turns) == 2 and all((margins[i, a:b] == k + 1).all() for k, (a, b) in enumerate(turns))
    assert (margins[~rollout.sampled_mask.bool()] == 0).all()  # inserted tokens and padding
    assert plain.kept_margins is None
    assert rollouts["unrecorded"].kept_margins is None  # a sampler that records no margins: no kept set made up
    assert torch.equal(plain.completion_ids, rollout.completion_ids)
    assert torch.equal(plain.sampled_mask, rollout.sampled_mask) and torch.equal(plain.logprobs, rollout.logprobs)


# ---------------------------------------------------------------- bad input


def test_an_environment_that_raises_names_itself_and_the_row(tokenizer):
    class Broken(CountdownEnv):
        def step(self, message):
            raise KeyError("score")

    agent = AgentSettings(environment_factory=Broken, max_turns=2)
    message = r"Environment Broken failed in step\(\) for batch row 0 \(prompt: 'go'\): raised KeyError: 'score'"
    with pytest.raises(EnvironmentFailedError, match=message):
        sample_rollout(
            short_turn_model(tokenizer), tokenizer, PROMPTS, SamplingSettings(2, 40), agent,
            max_prompt_length=64, columns={"turns": [2, 2]},
        )  # fmt: skip


def test_tools_need_conversational_prompts_and_prompts_are_checked(tokenizer):
    agent = AgentSettings(executor=ToolExecutor(ToolSet([add])))
    with pytest.raises(ValueError, match=r"need conversational prompts"):
        sample_rollout(None, tokenizer, ["1+1="], SamplingSettings(2, 4), agent, max_prompt_length=8)
    with pytest.raises(ValueError, match=r"all strings or all lists of chat messages"):
        sample_rollout(None, tokenizer, ["a", PROMPTS[0]], SamplingSettings(2, 4), AgentSettings(), max_prompt_length=8)
    with pytest.raises(ValueError, match=r"prompt 0\[0\] has role 'robot'"):
        bad = [[{"role": "robot", "content": "x"}]]
        sample_rollout(None, tokenizer, bad, SamplingSettings(2, 4), AgentSettings(), max_prompt_length=8)


def test_a_template_without_tools_is_refused_when_tools_are_set(tokenizer):
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(ValueError, match="does not render tools"):
        AgentSettings.build(tokenizer, tools=[add])
    AgentSettings.build(tokenizer)  # without tools any template will do


def test_env_steps_that_end_without_observation_finish_the_episode(tokenizer):
    class OneShot(CountdownEnv):
        def step(self, message):
            return EnvStep(observation=None, reward=1.0, done=False)

    agent = AgentSettings(environment_factory=OneShot, max_turns=5)
    rollout = sample_rollout(
        short_turn_model(tokenizer), tokenizer, PROMPTS, replace(SamplingSettings(2, 60)), agent,
        max_prompt_length=64, columns={"turns": [5, 5]},
    )  # fmt: skip
    assert rollout.turns.num_turns.tolist() == [1] * 4 and rollout.columns["env_reward"] == [1.0] * 4
