"""Callbacks that log what a GRPO practitioner watches, export the adapter and write predictions; one callback per
file.

The monitoring ones read the :class:`~lightning_grpo.iteration.StepOutput` that ``GRPOModule.training_step`` returns,
in ``on_train_batch_end``, and log with ``pl_module.log`` so every attached logger receives the metrics.
:class:`PredictionWriter` writes what ``predict_step`` returns; :class:`PolicySummary` is the model summary in one line.
"""

from lightning_grpo.callbacks import _quiet_lightning
from lightning_grpo.callbacks.adapter_export import AdapterExport
from lightning_grpo.callbacks.agent_stats import AgentStats
from lightning_grpo.callbacks.collapse_monitor import CollapseMonitor
from lightning_grpo.callbacks.completion_stats import CompletionStats
from lightning_grpo.callbacks.defaults import default_callbacks
from lightning_grpo.callbacks.group_rewards import GroupRewardStats
from lightning_grpo.callbacks.interrupt import SaveOnInterrupt
from lightning_grpo.callbacks.phase_heartbeat import PhaseHeartbeat
from lightning_grpo.callbacks.policy_summary import PolicySummary
from lightning_grpo.callbacks.prediction_writer import PredictionWriter
from lightning_grpo.callbacks.progress_bar import GRPOProgressBar
from lightning_grpo.callbacks.rank_failure_watch import RankFailureWatch
from lightning_grpo.callbacks.reward_curve import RewardCurve
from lightning_grpo.callbacks.sample_logger import SampleLogger
from lightning_grpo.callbacks.throughput import ThroughputMonitor

__all__ = [
    "AdapterExport",
    "AgentStats",
    "CollapseMonitor",
    "CompletionStats",
    "GRPOProgressBar",
    "GroupRewardStats",
    "PhaseHeartbeat",
    "PolicySummary",
    "PredictionWriter",
    "RankFailureWatch",
    "RewardCurve",
    "SampleLogger",
    "SaveOnInterrupt",
    "ThroughputMonitor",
    "default_callbacks",
]

_quiet_lightning.install()  # Lightning's lines that say nothing about a GRPO fit (Seed set, no GPU, ...)
