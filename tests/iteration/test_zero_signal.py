"""No silent zero-signal runs: ``train/zero_std_frac`` is logged (in the progress bar) and the user is told once."""

from __future__ import annotations

import warnings
import zlib

from lightning_grpo.iteration.zero_signal import NO_REWARD_MESSAGE, ZERO_STD_MESSAGE
from tests.conftest import make_trainer, prompt_loader


def _hash(text: str) -> float:
    """A reward that differs between (almost) any two different completions."""
    return zlib.crc32(text.encode()) % 1000 / 1000


def _fit(make_module, reward, steps: int = 3):
    module = make_module([reward])
    trainer = make_trainer(max_steps=steps, log_every_n_steps=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, train_dataloaders=prompt_loader(["1+1=", "2+2="], repeat=steps))
    return trainer, [str(w.message) for w in caught]


def test_equal_rewards_in_every_group_warn_once_with_reason_and_fix(make_module):
    trainer, messages = _fit(make_module, lambda completions, **kw: [1.0] * len(completions))
    zero = [m for m in messages if m.startswith("All 2 groups of the iteration at step")]
    assert len(zero) == 1  # once, although all 3 steps had no signal
    assert zero[0] == ZERO_STD_MESSAGE.format(groups=2, step=0)
    assert "dynamic_sampling=True" in zero[0] and "num_generations" in zero[0]
    assert float(trainer.callback_metrics["train/zero_std_frac"]) == 1.0
    assert float(trainer.progress_bar_metrics["train/zero_std_frac"]) == 1.0  # shown in the bar


def test_every_reward_none_warns_once_that_nothing_applied(make_module):
    trainer, messages = _fit(make_module, lambda completions, **kw: [None] * len(completions))
    none = [m for m in messages if m.startswith("Every reward function returned None")]
    assert none == [NO_REWARD_MESSAGE.format(step=0)]
    assert not [m for m in messages if m.startswith("All 2 groups")]  # one cause, one message
    assert float(trainer.callback_metrics["train/zero_std_frac"]) == 1.0


def test_groups_with_signal_log_zero_and_do_not_warn(make_module):
    trainer, messages = _fit(make_module, lambda completions, **kw: [_hash(c) for c in completions])
    assert not [m for m in messages if "zero variance" in m or "returned None" in m]
    assert float(trainer.callback_metrics["train/zero_std_frac"]) < 1.0


def test_partly_zero_variance_step_reports_the_fraction(make_module):
    # group of "1+1=" gets constant rewards, group of "2+2=" varies with the completion
    def reward(prompts, completions, **kw):
        return [1.0 if p == "1+1=" else _hash(c) for p, c in zip(prompts, completions, strict=True)]

    trainer, messages = _fit(make_module, reward, steps=1)
    assert float(trainer.callback_metrics["train/zero_std_frac"]) == 0.5
    assert not [m for m in messages if m.startswith("All ")]
