"""Reruns of a shipped config, and models that cannot be loaded, through the real command line."""

from __future__ import annotations

import pytest

from tests.cli.conftest import TINY, quiet_run_args, run_module


def test_a_rerun_with_the_logger_off_works(tmp_path, warm_tiny_cache):
    args = [*quiet_run_args(tmp_path, max_steps=1)[:2], "--trainer.enable_progress_bar=false", "--trainer.logger=false"]
    for attempt in range(2):  # the second run used to fail: "SaveConfigCallback expected ... config.yaml to NOT exist"
        result = run_module("lightning_grpo", "fit", "--config", str(TINY), *args)
        assert result.returncode == 0, f"run {attempt + 1}: {result.stderr[-3000:]}"


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("nobody-here/not-a-cached-model", "the hub cannot be reached"),
        ("./no/such/model/folder", "does not exist"),
    ],
)
def test_a_model_that_cannot_be_loaded_gets_one_line_naming_it(tmp_path, model, expected):
    args = quiet_run_args(tmp_path, max_steps=1)
    result = run_module(
        "lightning_grpo", "fit", "--config", str(TINY), *args,
        f"--model.init_args.model={model}", "--model.init_args.tokenizer=null",
    )  # fmt: skip
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]  # one line, not the resolved config or three tracebacks
    assert model in errors[0] and expected in errors[0]
    assert "Does not validate against any of the Union subtypes" not in result.stderr
