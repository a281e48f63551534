"""The GRPO algorithm core: pure torch, no Lightning, no transformers.

Every variant is chosen by name from a read-only catalogue of functions sharing one signature; an unknown name raises
a ``ValueError`` that lists the valid ones. The policy losses, advantage estimators and KL estimators are open: the
import path of a function of the same signature selects it like a built-in (:mod:`lightning_grpo.algorithms.catalogue`).
"""

from lightning_grpo.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    AdvantageFunction,
    AdvantageScale,
    AdvantageSettings,
    EstimatorNeeds,
    GroupStats,
    compute_advantages,
    declare_needs,
    estimator_needs,
)
from lightning_grpo.algorithms.aggregation import LOSS_AGG_MODES, LossAggMode, aggregate_loss, count_sequences
from lightning_grpo.algorithms.fused_head import FusedHeadLogProbs, fused_head_logprobs
from lightning_grpo.algorithms.importance import rollout_agreement
from lightning_grpo.algorithms.kl import KL_ESTIMATORS, KLEstimator, kl_penalty
from lightning_grpo.algorithms.logprob_kernels import entropy_from_logits, selective_logprobs
from lightning_grpo.algorithms.objective import LossSettings, grpo_loss
from lightning_grpo.algorithms.policy_losses import (
    POLICY_LOSSES,
    PolicyLossFunction,
    PolicyLossKind,
    PolicyLossSettings,
    PolicyLossStats,
    PolicyLossTerms,
    policy_loss,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdvantageEstimator",
    "AdvantageFunction",
    "AdvantageScale",
    "AdvantageSettings",
    "EstimatorNeeds",
    "FusedHeadLogProbs",
    "GroupStats",
    "KLEstimator",
    "LossAggMode",
    "LossSettings",
    "PolicyLossFunction",
    "PolicyLossKind",
    "PolicyLossSettings",
    "PolicyLossStats",
    "PolicyLossTerms",
    "aggregate_loss",
    "compute_advantages",
    "count_sequences",
    "declare_needs",
    "entropy_from_logits",
    "estimator_needs",
    "fused_head_logprobs",
    "grpo_loss",
    "kl_penalty",
    "policy_loss",
    "rollout_agreement",
    "selective_logprobs",
]
