"""The calculator task shared by the three calculator examples: one set of flags, one warm-up."""

from __future__ import annotations

import argparse

import pytest
import torch

from lightning_grpo.config import ObjectiveConfig, SamplingConfig
from lightning_grpo.testing import calculator
from tests.examples.test_examples import load_example

TASK_FLAGS = ("max_steps", "num_generations", "batch_size", "lr", "warmup_steps", "call_fraction", "seed")


def _options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    calculator.add_task_flags(parser)
    return parser.parse_args(list(argv))


def test_the_three_examples_take_the_task_s_flags_and_defaults():
    shared = _options()
    assert (shared.warmup_steps, shared.call_fraction) == (calculator.WARMUP_STEPS, calculator.CALL_FRACTION)
    for name in ("tool_calling", "mcp_tools", "openai_agent"):
        options = load_example(name).parse(["--warmup-steps", "7"])
        assert options.warmup_steps == 7, name
        assert all(getattr(options, f) == getattr(shared, f) for f in TASK_FLAGS if f != "warmup_steps"), name


def test_the_warm_up_is_the_same_for_a_seed_and_differs_between_seeds():
    tokenizer, rows, model = calculator.warm_policy(_options("--warmup-steps", "2", "--seed", "3"))
    _, rows_again, again = calculator.warm_policy(_options("--warmup-steps", "2", "--seed", "3"))
    _, other_rows, other = calculator.warm_policy(_options("--warmup-steps", "2", "--seed", "4"))
    assert rows == rows_again != other_rows and len(rows) == calculator.ROWS
    assert rows[0]["prompt"][0]["content"] == f"{rows[0]['a']}+{rows[0]['b']}?"
    weights = [m.get_output_embeddings().weight for m in (model, again, other)]
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])
    assert "{{ fn.name }}" in tokenizer.chat_template  # tools listed by name: short prompts


@pytest.mark.parametrize("fraction", ["-0.1", "1.5"])
def test_a_call_fraction_outside_0_1_is_refused_before_the_warm_up(fraction):
    with pytest.raises(ValueError, match=r"--call-fraction must be in \[0, 1\]"):
        calculator.warm_policy(_options("--call-fraction", fraction))


def test_the_grpo_settings_follow_the_flags():
    settings = calculator.grpo_settings(_options("--num-generations", "4"))
    assert settings == {
        "sampling": SamplingConfig(num_generations=4, max_new_tokens=128, max_prompt_length=64),
        "objective": ObjectiveConfig(kl_coef=0.0),
    }
