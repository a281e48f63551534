"""The lines a run ends with (the demo's mean-reward line, the reward curve's path once) and the install line of a
missing extra, in the README's form."""

from __future__ import annotations

import logging
import re

from lightning.pytorch.utilities import rank_zero_info

from lightning_grpo.cli.summary import curve_path_left_to_summary, reward_line
from lightning_grpo.extras import install_hint
from tests.cli.conftest import REPO


def test_the_reward_line_is_the_mean_of_the_first_and_last_tenth():
    rewards = [0.0, 0.5] + [0.25] * 16 + [1.0, 0.8]  # 20 iterations: tenths of two, (0 + .5) / 2 and (1 + .8) / 2
    assert reward_line("fit", rewards, seconds=40.6) == "fit: mean reward 0.25 -> 0.90 over 20 iterations (41 s)"
    assert reward_line("demo", [0.5]) == "demo: mean reward 0.50 -> 0.50 over 1 iteration"
    assert reward_line("fit", []) == (
        "fit: no mean reward was logged (train/reward_mean, logged by the GroupRewardStats callback)"
    )


def test_the_reward_curves_own_path_line_waits_for_the_summary_and_nothing_else():
    logger, seen = logging.getLogger("lightning.pytorch.utilities.rank_zero"), []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        with curve_path_left_to_summary():
            rank_zero_info("reward curve: runs/tiny/version_0/reward_curve.png")
            rank_zero_info("reward curve: off (matplotlib is not installed: ...)")
            rank_zero_info("another info line")
        rank_zero_info("reward curve: after.png")
    finally:
        logger.removeHandler(handler)
    assert seen == [
        "reward curve: off (matplotlib is not installed: ...)",
        "another info line",
        "reward curve: after.png",
    ]


def test_the_install_line_is_the_readmes_with_the_editable_form_beside_it():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (readme_line,) = re.findall(r'^(pip install "\.\[plot\]")', readme, flags=re.MULTILINE)
    hint = install_hint("plot")
    assert hint.startswith(f"{readme_line} in a clone of lightning-grpo ("), hint
    assert 'pip install -e ".[plot]" for an editable install' in hint
    assert install_hint("data", "quant").startswith('pip install ".[data,quant]" in a clone')
