"""``environment_factory:`` given in YAML as an import path: a TRL-style class and one of the package's protocol."""

from __future__ import annotations

import pytest

from lightning_grpo.agents.trl_environment import TRLEnvironments
from lightning_grpo.cli import GRPOCLI
from lightning_grpo.testing.agents import CountdownEnv
from tests.agents.test_trl_environment import Echo
from tests.cli.conftest import TINY
from tests.cli.run_process import run_cli


def _cli(tmp_path, factory: str) -> GRPOCLI:
    config = tmp_path / "env.yaml"
    grpo = "    grpo:\n      agents:\n        max_turns: 2\n"
    config.write_text(f"model:\n  init_args:\n    environment_factory: {factory}\n{grpo}")
    return GRPOCLI(
        args=["--config", str(TINY), "--config", str(config), f"--trainer.default_root_dir={tmp_path}",
              f"--trainer.logger.init_args.save_dir={tmp_path}"],
        run=False,
    )  # fmt: skip


def test_a_trl_style_class_named_in_yaml_runs_as_from_python(tmp_path):
    module = _cli(tmp_path, "tests.agents.test_trl_environment.Echo").model
    environments = module.agent.trl_environments
    assert isinstance(environments, TRLEnvironments) and environments.factories == {None: Echo}


def test_a_class_of_the_packages_protocol_named_in_yaml_is_the_factory_not_an_instance(tmp_path):
    module = _cli(tmp_path, "lightning_grpo.testing.agents.CountdownEnv").model
    assert module.agent.environment_factory is CountdownEnv  # built per row during the rollout, not by the parser


def test_a_path_that_does_not_import_is_one_line_naming_it(tmp_path):
    config = tmp_path / "env.yaml"
    config.write_text("model:\n  init_args:\n    environment_factory: my_env.NoSuchClass\n")
    result = run_cli("fit", "--config", str(TINY), "--config", str(config), cwd=tmp_path)
    assert result.returncode == 1, result.stdout[-2000:]
    (line,) = [line for line in result.stdout.splitlines() if "error:" in line]
    assert "environment_factory='my_env.NoSuchClass' cannot be imported (ModuleNotFoundError" in line
    assert "Traceback" not in result.stdout


@pytest.mark.parametrize("path", ["tests.agents.test_trl_environment.Echo"])
def test_a_dict_of_trl_style_classes_in_yaml(tmp_path, path):
    module = _cli(tmp_path, f"{{echo: {path}}}").model
    assert module.agent.trl_environments.factories == {"echo": Echo}
