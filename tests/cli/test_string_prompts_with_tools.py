"""String prompts with tools or an environment: refused when the data is set up, before the first rollout, in one line
that names the fix (chat_template=True, or conversational rows); from Python and from the command line."""

from __future__ import annotations

import pytest

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.config import SamplingConfig
from lightning_grpo.data import PromptDataModule
from lightning_grpo.settings_checks import SettingError
from lightning_grpo.testing import build_tiny_tokenizer
from lightning_grpo.testing.agents import add, short_turn_model
from tests.cli.conftest import TINY, quiet_run_args
from tests.cli.run_process import run_cli
from tests.conftest import make_trainer, prompt_records

FIX = "set chat_template=True on the PromptDataModule (in a config: data.init_args.chat_template: true)"


def count_calls(prompts, completions, **_):
    return [0.0] * len(completions)


def test_a_fit_refuses_string_prompts_with_tools_before_sampling_in_one_line():
    tokenizer = build_tiny_tokenizer()
    module = GRPOModule(
        short_turn_model(tokenizer), [count_calls], tokenizer=tokenizer, tools=[add],
        policy=PolicyConfig(lora_r=4, lora_alpha=8),
        grpo=GRPOConfig(sampling=SamplingConfig(num_generations=2, max_new_tokens=8, max_prompt_length=32)),
    )  # fmt: skip
    sampled, started = [], []
    module.generate = lambda *args, **kwargs: sampled.append(args)  # must never run
    module.on_fit_start = lambda: started.append(True)  # where the rollout backend starts: must not be reached
    trainer = make_trainer(max_steps=1)
    with pytest.raises(SettingError) as refused:
        trainer.fit(module, PromptDataModule(prompt_records(), batch_size=2))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("train_data row 0: tools and environment_factory need conversational prompts (chat "
                              "messages), got the string '0+0='")  # fmt: skip
    assert FIX in message and '[{"role": "user", "content": "..."}]' in message
    assert sampled == [] and started == [] and trainer.global_step == 0  # refused at data set-up


def test_conversational_rows_and_chat_template_pass_the_check():
    tokenizer = build_tiny_tokenizer()
    module = GRPOModule(short_turn_model(tokenizer), [count_calls], tokenizer=tokenizer, tools=[add])
    for data in (
        PromptDataModule(prompt_records(), batch_size=2, chat_template=True),
        PromptDataModule([{"prompt": [{"role": "user", "content": "1+1?"}]}] * 2, batch_size=2),
    ):
        data.trainer = make_trainer()
        data.trainer.strategy.connect(module)
        data.setup("fit")  # no error: every prompt is a conversation
        assert all(isinstance(row["prompt"], list) for row in data.train_records)


def test_the_command_line_says_it_in_one_line_after_the_loading_line(tmp_path, warm_tiny_cache):
    result = run_cli(
        "fit", "--config", str(TINY), *quiet_run_args(tmp_path, max_steps=1),
        "--model.init_args.tools=[examples.tool_calling.calc]", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    loading = next((i for i, line in enumerate(lines) if " fit: loading " in line), -1)
    error = next(line for line in lines[loading + 1 : loading + 3] if " fit: error: " in line)
    assert error.split(" fit: error: ")[1].startswith(
        "train_data row 0: tools and environment_factory need conversational prompts (chat messages), got the string "
    ), lines
    assert FIX in error, error
    assert "Traceback" not in result.stdout


def test_a_prompt_file_of_strings_is_refused_before_the_model_is_built(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "3+4?", "a": 3, "b": 4}\n')
    result = run_cli(
        "fit", "--config", "examples/own_environment/fit.yaml", f"--data.init_args.train_data={rows}",
        f"--model.init_args.model.init_args.cache_dir={tmp_path / 'cache'}", *quiet_run_args(tmp_path, max_steps=1),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:]
    (error,) = [line for line in result.stdout.splitlines() if " fit: error: " in line]
    assert error.split(" fit: error: ")[1].startswith(
        f"data.init_args.train_data='{rows}' row 0: tools and environment_factory need conversational prompts"
    ), error
    assert FIX in error, error
    assert "warming up" not in result.stdout and not (tmp_path / "cache").exists()  # refused before the model
