"""The parts of ``GRPOModule``'s validation, test and predict steps (docs/evaluation.md).

All three sample the way validation does (:func:`sample`: ``grpo.validation.num_generations`` completions per prompt
at ``grpo.validation.temperature``, seeded). Validation and test add each batch's rewards to their own metrics
(:func:`update`), logged as ``val/...`` and ``test/...`` (:class:`TestMetrics`); predict returns one record per
prompt (:func:`prediction_records`), scored when the reward functions find what they need in the batch
(:func:`prediction_scores`). The module's ``generate`` and ``score`` come in as callables: nothing here calls back
into the module.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torchmetrics import Metric

from lightning_grpo.backends.ahead import Batch
from lightning_grpo.config import ValidationConfig
from lightning_grpo.iteration.fit_checks import STEP_KEYWORDS
from lightning_grpo.iteration.seeding import seeded
from lightning_grpo.metrics import ValidationMetrics
from lightning_grpo.rewards import RewardFunctions, RewardInputError, RewardScores
from lightning_grpo.rollout import Rollout, agent_client, agent_wiring

__all__ = ["TestMetrics", "prediction_records", "prediction_scores", "sample", "unscorable", "update"]


class TestMetrics(ValidationMetrics):
    """:class:`~lightning_grpo.metrics.ValidationMetrics` of the test set: ``test/reward_mean``, ``test/accuracy``
    and ``test/pass@k``, with a state of their own.

    Example::

        >>> metrics = TestMetrics(k=2, threshold=1.0)
        >>> sorted(metrics.update(torch.tensor([1.0, 0.0])))
        ['test/accuracy', 'test/pass@2', 'test/reward_mean']
    """

    __test__ = False  # a metric, not a pytest test class

    def update(self, rewards: Tensor) -> dict[str, Metric]:
        """As :meth:`ValidationMetrics.update <lightning_grpo.metrics.ValidationMetrics.update>`, named ``test/...``."""
        return {f"test/{name.split('/', 1)[1]}": metric for name, metric in super().update(rewards).items()}


def sample(
    generate: Callable[..., Rollout], batch: Batch, settings: ValidationConfig, *, seed: int, device: torch.device
) -> Rollout:
    """``settings.num_generations`` completions per prompt of ``batch`` at ``settings.temperature``, sampled under
    ``seed`` (the outer random state is left as it was).

    Args:
        generate: The module's ``generate`` (``generate(batch, num_generations=..., temperature=...)``).
        batch: Prompts (``"prompt"``) and their columns.
        settings: ``GRPOConfig.validation``.
        seed: The seed of this batch's sampling.
        device: The module's device (its generator is seeded too when it is a GPU).
    """
    with seeded(seed, device):
        return generate(batch, num_generations=settings.num_generations, temperature=settings.temperature)


def update(metrics: ValidationMetrics, scores: RewardScores, rollout: Rollout, batch: Batch) -> dict[str, Metric]:
    """Add one batch's rewards (one per trajectory) to ``metrics``; the metrics to log, by name (exact over ranks).

    Args:
        metrics: The stage's own metrics (the module's ``val_metrics`` or ``test_metrics``).
        scores: The rollout's scores.
        rollout: The batch's rollout (an agent rollout's reward of a trajectory is its last branch's).
        batch: The batch sampled (its ``"prompt"`` list).

    Example::

        >>> from types import SimpleNamespace
        >>> rollout = SimpleNamespace(columns={})  # a plain (not agent) rollout: one reward per row
        >>> scores = RewardScores(torch.tensor([1.0, 0.0]), {})
        >>> logged = update(ValidationMetrics(k=2, threshold=1.0), scores, rollout, {"prompt": ["1+1="]})
        >>> {name: metric.compute().item() for name, metric in logged.items()}
        {'val/reward_mean': 0.5, 'val/accuracy': 0.5, 'val/pass@2': 1.0}
    """
    trajectories = len(batch["prompt"]) * metrics.k
    rewards = agent_wiring.trajectory_rewards(scores.rewards, rollout, trajectories=trajectories)
    return metrics.update(rewards)


def unscorable(rewards: RewardFunctions, batch: Batch) -> str | None:
    """Why ``rewards`` cannot score rollouts of ``batch`` (no functions, or a keyword no column offers); ``None``
    when they can.

    Example::

        >>> def exact(completions, answer, **kwargs):
        ...     return [float(c == a) for c, a in zip(completions, answer)]
        >>> unscorable(RewardFunctions([exact]), {"prompt": ["1+1="], "answer": ["2"]}) is None
        True
        >>> unscorable(RewardFunctions([exact]), {"prompt": ["1+1="]}).startswith("reward function 'exact' needs")
        True
    """
    if len(rewards) == 0:
        return "the module has no reward functions"
    columns = sorted(set(batch) - {"prompt"})
    try:
        rewards.check_keywords([*columns, *STEP_KEYWORDS], where=f"the predict data (columns {columns})")
    except RewardInputError as error:
        return str(error)
    return None


def prediction_scores(
    rewards: RewardFunctions,
    batch: Batch,
    rollout: Rollout,
    score: Callable[[Rollout], RewardScores],
    warned: set[str],
) -> RewardScores | None:
    """``score(rollout)``, or ``None`` without reward functions or when they cannot score ``batch`` (then a warning
    says why, once per run: ``warned`` holds the run's warnings given).

    Args:
        rewards: The module's reward functions.
        batch: The predict batch.
        rollout: Its rollout.
        score: The module's ``score``.
        warned: The run's warnings given so far (updated).
    """
    why = unscorable(rewards, batch)
    if why is None:
        return score(rollout)
    if len(rewards) and "predict_rewards" not in warned:  # no reward functions: nothing to say
        warned.add("predict_rewards")
        rank_zero_warn(f"predictions are written without rewards: {why}")
    return None


def prediction_records(rollout: Rollout, scores: RewardScores | None) -> list[dict[str, Any]]:
    """One record per prompt of ``rollout``, in batch order: ``prompt``, its ``completions`` and, with ``scores``, their
    weighted ``rewards`` (``None`` where no reward function applied); ``dataset_index`` when the batch has it.

    An agent rollout gives each trajectory's final branch.

    Example::

        >>> from types import SimpleNamespace
        >>> rollout = SimpleNamespace(group_ids=torch.tensor([0, 0, 1, 1]), prompts=["a", "a", "b", "b"],
        ...                           completions=["x", "y", "z", "w"], columns={})
        >>> scores = RewardScores(torch.tensor([1.0, 0.0, float("nan"), 0.5]), {})
        >>> prediction_records(rollout, scores)[1]
        {'prompt': 'b', 'completions': ['z', 'w'], 'rewards': [None, 0.5]}
    """
    groups: dict[int, list[int]] = {}  # group id -> its rows, in batch order
    for row in _final_rows(rollout):
        groups.setdefault(int(rollout.group_ids[row]), []).append(row)
    rewards = None if scores is None else scores.rewards.tolist()
    index = rollout.columns.get("dataset_index")
    records = []
    for rows in groups.values():
        record: dict[str, Any] = {} if index is None else {"dataset_index": index[rows[0]]}
        record |= {"prompt": rollout.prompts[rows[0]], "completions": [rollout.completions[i] for i in rows]}
        if rewards is not None:
            record["rewards"] = [None if math.isnan(rewards[i]) else rewards[i] for i in rows]
        records.append(record)
    return records


def _final_rows(rollout: Rollout) -> list[int]:
    """The rows that are completions: every row, or an agent rollout's final branch of each trajectory."""
    if agent_client.is_agent_rollout(rollout):
        return [i for i, last in enumerate(rollout.columns["agent_last"]) if last]
    return list(range(len(rollout.completions)))
