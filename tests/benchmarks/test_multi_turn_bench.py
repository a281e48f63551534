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


ARGS = ["--hidden-size", "64", "--layers", "1", "--prompts", "1", "--generations", "2", "--repeats", "1"]


def test_the_benchmark_runs_at_default_settings_and_prints_its_table_and_ratios(capsys):
    """No flag: the 3- and 5-turn tasks at the default settings, the turn cache kept for the multi-turn rollouts."""
    multi3, single3, multi5, single5 = main([*ARGS, "--device", "cpu"])
    assert (multi3.turns, single3.turns, multi5.turns, single5.turns) == (3, 1, 5, 1)
    assert multi3.sampled_tokens == single3.sampled_tokens > 100  # the same sampled tokens in both rollouts
    assert multi5.sampled_tokens == single5.sampled_tokens > multi3.sampled_tokens
    assert multi3.context_tokens > 0 and single3.context_tokens == 0  # the two tool results are context
    assert multi3.prompt_tokens == single3.prompt_tokens > 0  # the same prompts, tool schema included
    assert multi3.trajectories == single3.trajectories == 2 and multi3.seconds > 0 and single3.seconds > 0
    assert "turn_cache default: on" in multi3.name and "turn_cache default: off" in single3.name  # generate
    out = capsys.readouterr().out
    assert format_table([multi3, single3]).splitlines()[0] in out and "| 3 turns, 2 tool calls (turn_cache" in out
    assert "3 turns, 2 tool calls (turn_cache default: on):" in out and "target <= 1.3x" in out
    assert "5 turns, 4 tool calls (turn_cache default: on):" in out and "target <= 1.5x" in out


def test_the_turn_cache_settings_follow_the_script_in_five_turns():
    """Settings alternate: each samples the script turn by turn (``generate`` without the cache, our loop with it)."""
    settings = ["--turn-cache", "off", "on", "default"]
    off, on, default, *singles = main([*ARGS, "--device", "cpu", "--turns", "5", *settings])
    assert (off.turns, on.turns, default.turns) == (5, 5, 5) and [s.turns for s in singles] == [1, 1, 1]
    assert off.sampled_tokens == on.sampled_tokens == default.sampled_tokens == singles[0].sampled_tokens
    assert off.context_tokens == on.context_tokens > 0  # four tool results inserted either way
    assert "(turn_cache false: off)" in off.name and "(turn_cache true: on)" in on.name
    assert "(turn_cache true: on)" in singles[1].name  # true keeps it for a single-turn run too
    low, median, high = on.ratio[1], on.ratio[0], on.ratio[2]
    assert 0 < low <= median <= high
