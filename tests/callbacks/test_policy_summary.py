"""A Python fit draws no model table unless asked: Lightning's own summary (rich's or the plain one) becomes one line;
a summary callback the user passes draws its table."""

from __future__ import annotations

import re

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelSummary, RichModelSummary, Timer

from lightning_grpo.callbacks import PolicySummary
from lightning_grpo.callbacks.policy_summary import one_line_summary
from tests.callbacks.test_quiet_lightning import lightning_lines
from tests.conftest import make_trainer, prompt_loader

TABLE = "Trainable params"  # a line of Lightning's table, rich or plain


def quiet(**kwargs) -> Trainer:
    return Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, **kwargs)


def test_a_python_fit_with_rich_installed_prints_one_line_and_no_table(make_module, capsys):
    with lightning_lines() as lines:
        trainer = make_trainer(max_steps=1, enable_model_summary=None)  # left out: Lightning adds RichModelSummary
        trainer.fit(make_module(), prompt_loader(["1+1=", "2+2="]))
    shown = capsys.readouterr().out + "\n".join(lines)
    assert TABLE not in shown, shown
    (line,) = [line for line in lines if line.startswith("model: ")]
    assert re.fullmatch(r"model: [\d.]+ K trainable parameters \(the LoRA adapter\) of [\d.]+ K in all", line), line


def test_a_summary_the_user_passes_draws_its_table(make_module, capsys):
    trainer = make_trainer(max_steps=1, callbacks=[RichModelSummary(max_depth=2)], enable_model_summary=True)
    trainer.fit(make_module(), prompt_loader(["1+1=", "2+2="]))
    assert TABLE in capsys.readouterr().out


def test_lightning_s_summary_is_told_by_its_class_settings_and_place():
    default = quiet()  # enable_model_summary left out (or True: Lightning records no difference)
    assert [type(c) for c in one_line_summary(default)] == [PolicySummary]
    assert not any(isinstance(c, ModelSummary) for c in default.callbacks)  # taken out of the trainer
    assert one_line_summary(quiet(enable_model_summary=False)) == []
    for mine in (
        [RichModelSummary(max_depth=2)],  # a setting of its own
        [ModelSummary()],  # not the class Lightning adds where rich is installed
        [RichModelSummary(), Timer()],  # before another callback: the user's
    ):
        trainer = quiet(callbacks=mine)
        assert one_line_summary(trainer) == [] and mine[0] in trainer.callbacks
