"""TinyToolModel: the calculator examples' warmed policy as a class a YAML config can name, cached like TinyModel."""

from __future__ import annotations

import argparse

import pytest
import torch

from lightning_grpo.agents import ToolSet
from lightning_grpo.rollout.chat import render_messages
from lightning_grpo.testing import TinyToolModel, TinyToolTokenizer
from lightning_grpo.testing.agents import add
from lightning_grpo.testing.calculator import add_task_flags, warm_policy


def test_its_weights_are_the_examples_warmed_policy_and_a_second_load_reads_the_cache(tmp_path, capsys):
    options = argparse.ArgumentParser()
    add_task_flags(options)
    _, _, reference = warm_policy(options.parse_args(["--seed", "3", "--warmup-steps", "4"]))
    warmed = TinyToolModel(seed=3, warmup_steps=4, cache_dir=str(tmp_path))
    assert "tiny tool model: warming up on tool-call traces (4 supervised steps" in capsys.readouterr().err
    loaded = TinyToolModel(seed=3, warmup_steps=4, cache_dir=str(tmp_path))
    assert capsys.readouterr().err == ""  # read from the cache: no warm-up
    expected = reference.state_dict()
    for model in (warmed, loaded):
        assert all(torch.equal(value, expected[name]) for name, value in model.state_dict().items())
        assert model.training
    other = TinyToolModel(seed=3, warmup_steps=5, cache_dir=str(tmp_path))  # another recipe: another cached copy
    assert not torch.equal(other.lm_head.weight, warmed.lm_head.weight)
    assert len(list(tmp_path.glob("tiny-calculator-*"))) == 2


@pytest.mark.parametrize(
    ("arguments", "message"),
    [({"call_fraction": 1.5}, r"call_fraction must be in \[0, 1\]"), ({"warmup_steps": -1}, "warmup_steps must be")],
)
def test_bad_recipes_are_refused_naming_the_setting(tmp_path, arguments, message):
    with pytest.raises(ValueError, match=message):
        TinyToolModel(cache_dir=str(tmp_path), **arguments)


def test_its_tokenizer_lists_tools_by_name():
    text = render_messages(TinyToolTokenizer(), [{"role": "user", "content": "3+4?"}], tools=ToolSet([add]).schemas)
    assert "add" in text and "Add two integers" not in text and "3+4?" in text
