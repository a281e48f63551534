"""examples/openai_agent.py: the SDK agent runs its tool from ``message.tool_calls``, and the example trains."""

from __future__ import annotations

import re

import pytest

from lightning_grpo.agents import HermesToolCallParser
from lightning_grpo.rollout.agent_client import AgentLimits, run_agents
from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.testing.agents import short_turn_model, tool_name_tokenizer
from tests.examples.test_examples import load_example
from tests.rollout.test_agent_client import _scripted


def test_run_tool_answers_and_reports_bad_calls():
    example = load_example("openai_agent")
    assert example.run_tool("add", '{"a": 3, "b": 4}') == "7"
    assert example.run_tool("add", '{"a": 3}').startswith("error: TypeError")
    assert example.run_tool("mul", "{}").startswith("error: KeyError") and "error" in example.run_tool("add", "{")


@pytest.mark.parametrize("transport", ["http", "in_process"])
def test_the_agent_runs_the_tool_it_was_asked_for_and_is_rewarded(transport):
    example, tokenizer = load_example("openai_agent"), tool_name_tokenizer()
    call = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
    sample = _scripted(tokenizer, lambda context: "7" if "T:" in context else call)
    rows = [{"prompt": [{"role": "user", "content": "3+4?"}], "a": 3, "b": 4},
            {"prompt": [{"role": "user", "content": "5+1?"}], "a": 5, "b": 1}]  # fmt: skip
    settings, limits = SamplingSettings(num_generations=2, max_new_tokens=128), AgentLimits(transport=transport)
    rollout, stats = run_agents(short_turn_model(tokenizer), tokenizer, example.agent, rows, settings,
                                HermesToolCallParser(), max_prompt_length=64, limits=limits, sample=sample)  # fmt: skip
    assert not stats.failures and stats.batches == [4, 4]  # two calls per run, every run's calls in one batch
    assert rollout.columns["agent_reward"] == [1.0, 1.0, 0.0, 0.0]  # the tool's result is 7: right for row 0 only
    assert len(rollout) == 4 and bool((rollout.completion_mask.bool() & ~rollout.sampled_mask.bool()).any())


def test_the_example_trains_over_http_and_prints_its_line(tmp_path, capsys):
    args = ["--max-steps", "2", "--warmup-steps", "20", "--num-generations", "4", "--output-dir", str(tmp_path)]
    first, last, steps = load_example("openai_agent").main([*args, "--seed", "0", "--no-progress-bar"])
    assert steps == 2 and 0.0 <= first <= 1.0 and 0.0 <= last <= 1.0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"openai_agent: mean reward \d\.\d\d -> \d\.\d\d over 2 iterations \(\d+ s\)", line), line


def test_help_shows_the_defaults_and_the_transports(capsys):
    with pytest.raises(SystemExit):
        load_example("openai_agent").parse(["--help"])
    out = capsys.readouterr().out
    assert "(default: http)" in out and "in_process" in out
