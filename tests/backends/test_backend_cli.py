"""A backend written in a user's project, chosen from YAML by import path through the real command line: its settings
reach it, are saved in the checkpoint's hyper-parameters, and a resume with other settings logs them and uses them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import TINY
from tests.conftest import repo_pythonpath

pytestmark = pytest.mark.slow

#: The user's project: a backend that samples with the policy itself and writes down every call it gets.
MY_BACKEND = """
import json
from dataclasses import dataclass

from lightning_grpo.rollout.generation import sample_tokens


@dataclass
class Settings:
    log: str = "events.jsonl"
    scale: int = 1


class Session:
    def __init__(self, backend):
        self.backend = backend

    def sample(self, model, tokenizer, request):
        self.backend.write("sample", len(request.rows))
        return sample_tokens(model, tokenizer, request)

    def close(self):
        self.backend.write("close session")


class MyBackend:
    settings_class = Settings
    supported_settings = frozenset()

    def __init__(self, settings, spec):
        self.settings = settings
        self.write("built", settings.scale)

    def write(self, *event):
        with open(self.settings.log, "a") as handle:
            handle.write(json.dumps(event) + "\\n")

    def start(self, policy, seed, *, sharded):
        self.write("start", seed)

    def sync(self, policy, version):
        self.write("sync", version)

    def session(self, policy, settings):
        return Session(self)

    def release(self):
        self.write("release")

    def close(self):
        self.write("close")
"""


def _fit(tmp_path: Path, scale: int, *args: str) -> subprocess.CompletedProcess:
    """``python -m lightning_grpo fit`` of the tiny config with ``my_backend.MyBackend`` (``scale``) in ``tmp_path``."""
    (tmp_path / "my_backend.py").write_text(MY_BACKEND)
    config = yaml.safe_load(TINY.read_text())
    config["model"]["init_args"]["grpo"]["backend"] = {
        "rollout_backend": "my_backend.MyBackend", "rollout_backend_args": {"log": "events.jsonl", "scale": scale},
    }  # fmt: skip
    config["trainer"]["callbacks"] = []
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": repo_pythonpath(), "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "lightning_grpo", "fit", "--config", "config.yaml", "--trainer.max_steps=2"]
    command += [f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}"]
    command += ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", *args]
    return subprocess.run(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300
    )


def _events(tmp_path: Path) -> list[list]:
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    (tmp_path / "events.jsonl").unlink()
    return [json.loads(line) for line in lines]


def test_a_backend_chosen_in_yaml_by_import_path_runs_saves_its_settings_and_resumes_with_new_ones(tmp_path):
    done = _fit(tmp_path, scale=1)
    assert done.returncode == 0, done.stdout[-3000:]
    step = [["sample", 64], ["close session"], ["release"]]  # 8 prompts x G=8, one sampling call
    assert _events(tmp_path) == [["built", 1], ["start", 0], ["sync", 0], ["sync", 0], *step, ["sync", 1],
                                 ["sync", 1], *step, ["close"]]  # fmt: skip
    run_dir = tmp_path / "tiny" / "version_0"
    saved = yaml.safe_load((run_dir / "hparams.yaml").read_text())
    assert saved["grpo"]["backend"]["rollout_backend"] == "my_backend.MyBackend"
    assert saved["grpo"]["backend"]["rollout_backend_args"] == {"log": "events.jsonl", "scale": 1}
    (checkpoint,) = (run_dir / "checkpoints").glob("*.ckpt")

    resumed = _fit(tmp_path, 2, "--trainer.max_steps=3", f"--ckpt_path={checkpoint}")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "grpo.backend.rollout_backend_args.scale 1 -> 2" in resumed.stdout  # logged, and the new value is used
    events = _events(tmp_path)
    assert events[0] == ["built", 2] and ["sync", 2] in events and events[-1] == ["close"]


def test_an_unknown_backend_setting_in_yaml_names_the_key_and_the_allowed_ones(tmp_path):
    done = _fit(tmp_path, 1, "--model.init_args.grpo.backend.rollout_backend_args={scale: 1, colour: red}")
    assert done.returncode != 0
    assert (
        "rollout_backend_args.colour='red': not a setting of the rollout backend 'my_backend.MyBackend' (Settings); "
        "allowed keys: log, scale" in done.stdout
    ), done.stdout[-3000:]
