"""The callbacks a GRPO run usually wants, which of them a trainer lacks (:func:`missing_callbacks`), and those a
``GRPOModule`` brings to its trainer (:func:`module_callbacks`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from lightning_grpo.callbacks.adapter_export import AdapterExport
from lightning_grpo.callbacks.agent_stats import AgentStats
from lightning_grpo.callbacks.close_rollout_backend import CloseRolloutBackend
from lightning_grpo.callbacks.collapse_monitor import CollapseMonitor
from lightning_grpo.callbacks.completion_stats import CompletionStats
from lightning_grpo.callbacks.group_rewards import GroupRewardStats
from lightning_grpo.callbacks.interrupt import SaveOnInterrupt
from lightning_grpo.callbacks.phase_heartbeat import PhaseHeartbeat
from lightning_grpo.callbacks.policy_summary import one_line_summary
from lightning_grpo.callbacks.prediction_writer import PredictionWriter
from lightning_grpo.callbacks.progress_bar import readable_progress_bar
from lightning_grpo.callbacks.rank_failure_watch import RankFailureWatch
from lightning_grpo.callbacks.reward_curve import RewardCurve
from lightning_grpo.callbacks.sample_logger import SampleLogger
from lightning_grpo.callbacks.throughput import ThroughputMonitor
from lightning_grpo.callbacks.tool_servers import CloseToolServers

__all__ = ["default_callbacks", "missing_callbacks", "module_callbacks"]


def default_callbacks(
    *,
    sample_every_n_iterations: int = 50,
    export_adapter: bool = False,
    adapter_dirpath: str | Path | None = None,
) -> list[Callback]:
    """One of each monitoring callback with its defaults, :class:`RewardCurve`, :class:`SaveOnInterrupt`; an
    :class:`AdapterExport` if asked.

    Args:
        sample_every_n_iterations: Iterations between two sample tables of the :class:`SampleLogger`.
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
        SampleLogger(every_n_iterations=sample_every_n_iterations),
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


def module_callbacks(trainer: Trainer, *, tool_servers: bool, monitoring: bool) -> list[Callback]:
    """The callbacks a ``GRPOModule`` adds to its trainer (``configure_callbacks``).

    Always :class:`CloseRolloutBackend` (the one place the backend is closed: end of fit, or an exception), a
    :class:`RankFailureWatch` unless the trainer has one (a failure on one rank stops every rank, naming it) and, with
    MCP ``tool_servers``, :class:`CloseToolServers`; when predicting, a :class:`PredictionWriter` unless the trainer
    has a ``BasePredictionWriter``; with ``monitoring``, the :func:`default_callbacks` and a :class:`PhaseHeartbeat`
    of types the trainer lacks (a trainer's callback of the same or a related type wins), a :class:`PolicySummary`
    in place of Lightning's default model summary (:func:`~lightning_grpo.callbacks.policy_summary.one_line_summary`),
    then ``GRPOProgressBar`` in place of Lightning's default bar, last: it shows what they logged.
    """
    close: list[Callback] = [CloseRolloutBackend()]
    close += [] if any(isinstance(c, RankFailureWatch) for c in trainer.callbacks) else [RankFailureWatch()]
    close += [CloseToolServers()] if tool_servers else []  # MCP sessions end with the fit
    writes = any(isinstance(c, BasePredictionWriter) for c in trainer.callbacks)
    close += [PredictionWriter()] if trainer.predicting and not writes else []  # predictions.jsonl in the run folder
    if not monitoring:
        return close
    missing = missing_callbacks([*default_callbacks(), PhaseHeartbeat()], present=trainer.callbacks)
    return [*close, *missing, *one_line_summary(trainer), *readable_progress_bar(trainer)]
