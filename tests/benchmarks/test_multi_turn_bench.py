"""The multi-turn rollout benchmark runs at minimal size and measures what it claims."""

from __future__ import annotations

from benchmarks.multi_turn import format_table, main, scripts
from lightning_grpo.testing import build_tiny_tokenizer


def test_the_scripts_sample_the_same_number_of_tokens_in_three_turns_and_in_one():
    tokenizer = build_tiny_tokenizer()
    multi, single = scripts(tokenizer)
    assert len(multi) == 3 and len(single) == 1
    assert sum(map(len, multi)) == len(single[0])
    assert all(turn[-1] == tokenizer.eos_token_id for turn in [*multi, *single])
    assert tokenizer.eos_token_id not in single[0][:-1]
    assert "<tool_call>" in tokenizer.decode(multi[0]) and "<tool_call>" not in tokenizer.decode(single[0])


def test_the_benchmark_runs_at_minimal_size_and_prints_its_table(capsys):
    args = ["--hidden-size", "64", "--layers", "1", "--prompts", "1", "--generations", "2", "--repeats", "1"]
    multi, single = main([*args, "--device", "cpu"])
    assert (multi.turns, single.turns) == (3, 1)
    assert multi.sampled_tokens == single.sampled_tokens > 100  # the same sampled tokens in both rollouts
    assert multi.context_tokens > 0 and single.context_tokens == 0  # the two tool results are context
    assert multi.prompt_tokens == single.prompt_tokens > 0  # the same prompts, tool schema included
    assert multi.trajectories == single.trajectories == 2 and multi.seconds > 0 and single.seconds > 0
    out = capsys.readouterr().out
    assert format_table([multi, single]).splitlines()[0] in out and "| 3 turns, 2 tool calls (turn cache off) |" in out


def test_the_turn_cache_rollouts_follow_the_script_in_five_turns():
    """Both settings, alternating: the scripted session samples the same tokens as ``generate`` does, turn by turn."""
    args = ["--hidden-size", "64", "--layers", "1", "--prompts", "1", "--generations", "2", "--repeats", "1"]
    off, on, single_off, single_on = main([*args, "--device", "cpu", "--turns", "5", "--turn-cache", "off", "on"])
    assert (off.turns, on.turns, single_off.turns, single_on.turns) == (5, 5, 1, 1)
    assert off.sampled_tokens == on.sampled_tokens == single_on.sampled_tokens  # the script, or main raises
    assert off.context_tokens == on.context_tokens > 0  # four tool results inserted either way
    assert "turn cache on" in on.name and "turn cache off" in off.name
    low, median, high = on.ratio[1], on.ratio[0], on.ratio[2]
    assert 0 < low <= median <= high
