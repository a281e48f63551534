"""Errors at the boundary: a missing data file before the model loads, reward parameters the data
cannot fill at fit start."""

from __future__ import annotations

import pytest

from lightning_grpo.data import MissingDataError, PromptDataModule
from lightning_grpo.rewards import RewardInputError
from tests.cli.conftest import FIT_LOADING
from tests.cli.run_process import REPO, run_cli
from tests.conftest import make_trainer, prompt_records


def test_a_missing_prompt_file_is_refused_at_construction(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MissingDataError, match=r"train_data: prompt file 'missing.jsonl' not found \(looked for in"):
        PromptDataModule("missing.jsonl")
    with pytest.raises(MissingDataError, match="val_data"):
        PromptDataModule(prompt_records(), val_data=tmp_path / "val.jsonl")
    (tmp_path / "rows.csv").write_text("prompt\n")
    with pytest.raises(MissingDataError, match=r"allowed: \.jsonl, \.json"):
        PromptDataModule("rows.csv")


def test_the_command_line_refuses_a_missing_file_before_the_model_loads(tmp_path):
    result = run_cli(
        "fit", "--config", str(REPO / "configs" / "debug" / "tiny.yaml"),
        "--data", "lightning_grpo.data.PromptDataModule", "--data.train_data", "missing.jsonl",
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}",
        f"--model.init_args.model.init_args.cache_dir={tmp_path / 'warm-ups'}", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1
    lines = [line for line in result.stdout.splitlines() if not line.startswith(("Failed to load CPU", "Seed set"))]
    assert lines[0] == FIT_LOADING, result.stdout  # then the error
    assert len(lines) < 6 and "prompt file 'missing.jsonl' not found" in lines[1], result.stdout
    assert not (tmp_path / "warm-ups").exists()  # the model was never built (it would have been warmed up there)
    assert not list(tmp_path.rglob("version_*"))


def needs_x(x):
    return [0.0] * len(x)


def test_a_reward_the_data_cannot_fill_fails_at_fit_start(make_module):
    module = make_module(reward_funcs=(needs_x,))
    trainer = make_trainer(max_steps=1)
    with pytest.raises(RewardInputError, match=r"'needs_x' needs keyword\(s\) \['x'\].*columns \['answer'\]"):
        trainer.fit(module, PromptDataModule(prompt_records(), batch_size=2))
    assert trainer.global_step == 0
