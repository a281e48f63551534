"""RewardCurve: every fit with the default callbacks draws its reward curve; without matplotlib one line says how."""

from __future__ import annotations

import sys

from lightning.pytorch.loggers import CSVLogger

from lightning_grpo.callbacks import RewardCurve
from tests.callbacks.test_interrupt_update import lightning_info
from tests.cli.conftest import TINY, quiet_run_args
from tests.cli.run_process import run_cli
from tests.conftest import make_trainer, prompt_loader

PROMPTS = ["1+1=", "2+2="]


def test_a_python_fit_draws_the_reward_curve_in_its_run_folder(make_module, tmp_path):
    trainer = make_trainer(max_steps=3, logger=CSVLogger(tmp_path, name="run"), log_every_n_steps=1)
    with lightning_info() as info:
        trainer.fit(make_module(), prompt_loader(PROMPTS, repeat=3))  # the module adds the default callbacks
    picture = tmp_path / "run" / "version_0" / "reward_curve.png"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"reward curve: {picture}" in info
    curve = next(callback for callback in trainer.callbacks if isinstance(callback, RewardCurve))
    assert len(curve.rewards) == 3


def test_without_matplotlib_one_line_says_how_to_get_it(make_module, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    trainer = make_trainer(max_steps=1, default_root_dir=tmp_path)
    with lightning_info() as info:
        trainer.fit(make_module(), prompt_loader(PROMPTS))
    lines = [line for line in info if "reward curve" in line]
    assert lines == [
        'reward curve: off (matplotlib is not installed: pip install ".[plot]" in a clone of lightning-grpo (pip '
        'install -e ".[plot]" for an editable install; from a built wheel: pip install "<the wheel file>[plot]"))'
    ]
    assert not list(tmp_path.rglob("*.png"))


def test_the_curve_travels_in_the_checkpoint():
    curve = RewardCurve()
    curve.rewards = {0: 0.1, 1: 0.2}
    restored = RewardCurve()
    restored.load_state_dict(curve.state_dict())  # the curve travels in the checkpoint
    assert restored.rewards == {0: 0.1, 1: 0.2}


def test_a_cli_fit_writes_the_reward_curve(tmp_path):
    result = run_cli("fit", "--config", str(TINY), *quiet_run_args(tmp_path, max_steps=2), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    picture = tmp_path / "tiny" / "version_0" / "reward_curve.png"
    assert picture.stat().st_size > 1000 and f"reward curve: {picture}" in result.stdout


def test_nothing_is_drawn_without_a_logged_reward(tmp_path):
    trainer = make_trainer(max_steps=0, default_root_dir=tmp_path)
    RewardCurve().on_fit_end(trainer, None)
    assert not list(tmp_path.rglob("*.png"))


def test_without_a_run_folder_nothing_is_drawn_into_the_working_directory(make_module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_trainer(max_steps=1).fit(make_module(), prompt_loader(PROMPTS))  # logger=False, no default_root_dir
    assert not list(tmp_path.rglob("*.png"))
