"""The callbacks a GRPO run usually wants, and which of them a trainer lacks (:func:`missing_callbacks`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from lightning.pytorch import Callback

from lightning_grpo.callbacks.adapter_export import AdapterExport
from lightning_grpo.callbacks.agent_stats import AgentStats
from lightning_grpo.callbacks.collapse_monitor import CollapseMonitor
from lightning_grpo.callbacks.completion_stats import CompletionStats
from lightning_grpo.callbacks.group_rewards import GroupRewardStats
from lightning_grpo.callbacks.interrupt import SaveOnInterrupt
from lightning_grpo.callbacks.reward_curve import RewardCurve
from lightning_grpo.callbacks.sample_logger import SampleLogger
from lightning_grpo.callbacks.throughput import ThroughputMonitor

__all__ = ["default_callbacks", "missing_callbacks"]


def default_callbacks(
    *,
    sample_every_n_steps: int = 50,
    export_adapter: bool = False,
    adapter_dirpath: str | Path | None = None,
) -> list[Callback]:
    """One of each monitoring callback with its defaults, :class:`RewardCurve`, :class:`SaveOnInterrupt`; an
    :class:`AdapterExport` if asked.

    Args:
        sample_every_n_steps: Iterations between two sample tables of the :class:`SampleLogger`.
        export_adapter: Add an :class:`AdapterExport` that writes the final adapter.
        adapter_dirpath: Its ``dirpath`` (``None``: ``trainer.default_root_dir``).

    Example::

        >>> from lightning.pytorch import Trainer
        >>> [type(cb).__name__ for cb in default_callbacks()][3:]
        ['AgentStats', 'CollapseMonitor', 'ThroughputMonitor', 'SaveOnInterrupt', 'SampleLogger']
        >>> trainer = Trainer(callbacks=default_callbacks(export_adapter=True), logger=False)
    """
    callbacks: list[Callback] = [
        GroupRewardStats(),
        RewardCurve(),  # after GroupRewardStats, whose train/reward_mean it draws; says so once without matplotlib
        CompletionStats(),
        AgentStats(),  # logs nothing for single-turn rollouts
        CollapseMonitor(),  # warns once when the reward falls to a floor with no signal left
        ThroughputMonitor(),
        SaveOnInterrupt(),
        SampleLogger(every_n_steps=sample_every_n_steps),
    ]
    if export_adapter:
        callbacks.append(AdapterExport(dirpath=adapter_dirpath))
    return callbacks


def missing_callbacks(defaults: Iterable[Callback], present: Iterable[Callback]) -> list[Callback]:
    """The ``defaults`` whose type is not related to the type of any ``present`` callback, in order.

    A default is left out when a present callback is of its type, of a subclass or of a base class (other than
    ``Callback``): Lightning replaces a trainer's callback by a module's one of a subclass, so the user's would lose.
    A default whose class lists the present type in its ``replaces`` attribute is left out too
    (:class:`~lightning_grpo.callbacks.ThroughputMonitor` and Lightning's).

    Example::

        >>> from lightning.pytorch.callbacks import ThroughputMonitor, Timer
        >>> from lightning_grpo.callbacks import GroupRewardStats, ThroughputMonitor as GRPOThroughput
        >>> defaults = [GroupRewardStats(), GRPOThroughput()]
        >>> [type(c).__name__ for c in missing_callbacks(defaults, [Timer(), ThroughputMonitor(len)])]
        ['GroupRewardStats']
    """
    kinds = {type(callback) for callback in present} - {Callback}

    def related(cls: type) -> bool:  # of a kind present, or one it replaces (its ``replaces`` attribute)
        own = (cls, *getattr(cls, "replaces", ()))
        return any(issubclass(one, kind) or issubclass(kind, one) for one in own for kind in kinds)

    return [callback for callback in defaults if not related(type(callback))]
