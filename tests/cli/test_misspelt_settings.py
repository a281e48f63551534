"""A misspelt setting: the closest valid name on the first line; ``--debug`` adds the rest."""

from __future__ import annotations

import pytest

from lightning_grpo.cli import misspelt_setting
from tests.cli.conftest import FIT_LOADING
from tests.cli.run_process import REPO, run_cli

TINY = str(REPO / "configs" / "debug" / "tiny.yaml")


def _first_lines(result, n=5):
    """The first ``n`` lines after the one saying what the command loads."""
    lines = [line for line in result.stdout.splitlines() if "gemm_4bit" not in line]
    assert lines[0] == FIT_LOADING, result.stdout[:2000]
    return lines[1 : n + 1]


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (["--model.init_args.grpo.sampling.num_generatoins", "8"], "did you mean 'sampling.num_generations'?"),
        (["--model.init_args.grpo.sampling.kl_coef", "0.1"], "did you mean 'objective.kl_coef'?"),  # another group
        (["--trainer.max_step", "3"], "did you mean 'trainer.max_steps'?"),
    ],
)
def test_a_typo_on_the_command_line_gets_the_closest_name(args, fix, tmp_path):
    result = run_cli("fit", "--config", TINY, *args, cwd=tmp_path)
    assert result.returncode == 2
    assert fix in "\n".join(_first_lines(result)), result.stdout[:2000]
    assert "--debug" in result.stdout.splitlines()[-1] and len(_first_lines(result, 10)) <= 3  # short; --debug: all


def test_debug_adds_the_parsers_full_message(tmp_path):
    result = run_cli("fit", "--config", TINY, "--trainer.max_step", "3", "--debug", cwd=tmp_path)
    assert result.returncode == 2 and "did you mean 'trainer.max_steps'?" in _first_lines(result)[0]
    assert "The full message:" in result.stdout and "unrecognized arguments" in result.stdout.splitlines()[-1]


def test_a_typo_in_yaml_gets_the_closest_name(tmp_path):
    typo = tmp_path / "typo.yaml"
    typo.write_text("model:\n  init_args:\n    grpo:\n      sampling:\n        num_generation: 4\n")
    result = run_cli("fit", "--config", TINY, "--config", str(typo), cwd=tmp_path)
    assert result.returncode == 2
    assert "did you mean 'sampling.num_generations'?" in _first_lines(result)[0]


def test_an_unknown_name_far_from_any_lists_the_valid_ones():
    message = "Problem with given class_path 'lightning_grpo.GRPOConfig':\n    Option 'zzz' is not accepted"
    assert "valid names: " in misspelt_setting(message, [])
    assert misspelt_setting("some other error", []) is None
