"""The reward curve of any fit as a picture: ``reward_curve.png`` in the run's folder, drawn when fit ends."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_grpo.callbacks._run_folder import run_folder
from lightning_grpo.extras import install_hint

__all__ = ["RewardCurve", "curve_title", "matplotlib_installed", "plot_rewards"]

_METRIC = "train/reward_mean"


def matplotlib_installed() -> bool:
    """Whether matplotlib can be imported (found without importing it; a blocked import counts as missing)."""
    if "matplotlib" in sys.modules:
        return sys.modules["matplotlib"] is not None
    return importlib.util.find_spec("matplotlib") is not None


def plot_rewards(
    rewards: Sequence[float], path: str | Path, title: str = "", ylabel: str = "mean reward"
) -> Path | None:
    """Save the reward curve (per iteration and a moving average) as a PNG; ``None`` without matplotlib.

    Args:
        rewards: One mean reward per GRPO iteration, in order.
        path: The PNG file to write.
        title: The picture's title.
        ylabel: The y axis' label.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    window = max(1, len(rewards) // 20)
    trailing = [rewards[max(0, i - window + 1) : i + 1] for i in range(len(rewards))]  # each point's window
    smooth = [sum(values) / len(values) for values in trailing]
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(range(1, len(rewards) + 1), rewards, alpha=0.35, label="per iteration")
    axes.plot(range(1, len(rewards) + 1), smooth, label=f"moving average ({window})")
    axes.set(xlabel="GRPO iteration", ylabel=ylabel, title=title)
    if rewards and min(rewards) >= 0.0 and max(rewards) <= 1.0:  # a 0/1 reward: the whole range, for comparison
        axes.set_ylim(0, 1.02)
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return Path(path)


def curve_title(task: str, model: str, num_generations: int, log_dir: Path) -> str:
    """The reward curve's title: what was learned, by which model, and the run it comes from.

    Example::

        >>> curve_title("addition", "TinyModel", 8, Path("runs/tiny/version_0"))
        'GRPO on addition: TinyModel, G=8 (run tiny/version_0)'
    """
    log_dir = Path(log_dir)
    return f"GRPO on {task}: {model}, G={num_generations} (run {log_dir.parent.name}/{log_dir.name})"


def _default_title(trainer: Trainer, pl_module: LightningModule, folder: Path) -> str:
    """:func:`curve_title` from the data module's ``task`` (else "prompts"), the base model's class and G."""
    policy = getattr(pl_module, "policy", None)
    base = policy.get_base_model() if callable(getattr(policy, "get_base_model", None)) else policy
    config = getattr(pl_module, "config", None)
    task = getattr(getattr(trainer, "datamodule", None), "task", None) or "prompts"
    return curve_title(
        str(task), type(base).__name__, getattr(getattr(config, "sampling", None), "num_generations", 0), folder
    )


class RewardCurve(Callback):
    """Draw ``train/reward_mean`` per GRPO iteration into ``reward_curve.png`` in the run's folder when fit ends.

    The folder is the logger's ``log_dir`` (``runs/<name>/version_N``), else ``trainer.default_root_dir`` (nothing is
    drawn when that is the working directory: no run folder is known then). The curve
    is kept in the checkpoint, so a resumed run draws the whole curve. Without matplotlib it draws nothing and says
    so in one line at the start of fit (the ``plot`` extra installs it). One of
    :func:`~lightning_grpo.callbacks.default_callbacks`: it reads the value
    :class:`~lightning_grpo.callbacks.GroupRewardStats` logs, so it comes after it.

    Args:
        filename: The picture's file name in the run's folder.
        title: Its title; ``None``: :func:`curve_title` (``GRPO on <task>: <model>, G=<G> (run <name>/<version>)``).

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import GroupRewardStats, RewardCurve
        >>> trainer = Trainer(callbacks=[GroupRewardStats(), RewardCurve()], logger=False)
    """

    def __init__(self, filename: str = "reward_curve.png", title: str | None = None) -> None:
        self.filename = filename
        self.title = title
        self.rewards: dict[int, float] = {}  # iteration (global step before it) -> mean reward
        self.path: Path | None = None  # where the last picture went
        self._enabled = True

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._enabled = matplotlib_installed()
        if not self._enabled:
            rank_zero_info(f"reward curve: off (matplotlib is not installed: {install_hint('plot')})")

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        value = trainer.callback_metrics.get(_METRIC)
        if value is not None:
            self.rewards[len(self.rewards)] = float(value)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._enabled or not self.rewards or not trainer.is_global_zero:
            return
        folder = run_folder(trainer)  # on rank zero alone: no collective (Trainer.log_dir broadcasts)
        if folder.resolve() == Path.cwd().resolve():  # no run folder (no logger, or one without files): not the cwd
            return
        folder.mkdir(parents=True, exist_ok=True)
        title = self.title if self.title is not None else _default_title(trainer, pl_module, folder)
        self.path = plot_rewards([self.rewards[i] for i in sorted(self.rewards)], folder / self.filename, title)
        if self.path is not None:
            rank_zero_info(f"reward curve: {self.path}")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"rewards": [self.rewards[i] for i in sorted(self.rewards)]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rewards = dict(enumerate(float(value) for value in state_dict.get("rewards", [])))
