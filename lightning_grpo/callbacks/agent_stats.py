"""Multi-turn rollouts: turns, tool calls, tool errors and timeouts, context tokens, per-turn rewards."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor
from typing_extensions import override

from lightning_grpo.callbacks._arguments import check_prefix
from lightning_grpo.callbacks._step_output import step_output
from lightning_grpo.metrics import reduce_across_ranks
from lightning_grpo.rollout.batch import Rollout

__all__ = ["AgentStats", "agent_metrics"]


class AgentStats(Callback):
    r"""Log how the policy uses its tools and environments (see ``docs/agents.md``).

    Metrics, each under ``<prefix>agent/``, all global (sums reduced across ranks by :mod:`lightning_grpo.metrics`):

    * ``turns_mean``: policy turns per trajectory.
    * ``tool_calls_mean``: tool calls per trajectory.
    * ``tool_error_rate``, ``tool_timeout_rate``: per tool call, the fraction that ended in an error the model saw
      (bad JSON, unknown tool, exception) and the fraction that ran past the timeout (0 when no tool was called).
    * ``context_token_frac``: fraction of trajectory tokens inserted by tools or environments (context, not trained).
    * ``max_turns_frac``: fraction of trajectories cut because they reached ``max_turns``.
    * ``turn_reward_mean/<k>``: mean environment reward of turn ``k`` (from 0) over the trajectories whose turn ``k``
      gave one; logged for the turns that some trajectory of some rank reached with a reward.

    Nothing is logged for single-turn rollouts (``Rollout.turns`` is ``None``, or the module has neither tools nor
    an environment: chat prompts alone). Validation rollouts give the same
    metrics over the whole validation epoch, under ``<val_prefix>agent/``.

    Args:
        prefix: Prepended to every training metric name: ``"train/"`` logs ``train/agent/turns_mean``.
        val_prefix: Prepended to every validation metric name.

    Raises:
        TypeError: If ``prefix`` or ``val_prefix`` is not a string.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_grpo.callbacks import AgentStats
        >>> trainer = Trainer(callbacks=[AgentStats()], logger=False)
    """

    def __init__(self, prefix: str = "train/", val_prefix: str = "val/") -> None:
        self.prefix = check_prefix(prefix)
        self.val_prefix = check_prefix(val_prefix)
        self._val: _Sums | None = None

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        rollout = step_output(outputs, self, ("rollout",))["rollout"]
        if rollout.turns is not None and _multi_turn(pl_module):
            self._log(pl_module, self.prefix, _Sums.of(rollout))

    @override
    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._val = None

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        rollout = step_output(outputs, self, ("rollout",))["rollout"]
        if rollout.turns is not None and _multi_turn(pl_module):
            sums = _Sums.of(rollout)
            self._val = sums if self._val is None else self._val + sums

    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._val is not None and not trainer.sanity_checking:
            self._log(pl_module, self.val_prefix, self._val)
        self._val = None

    def _log(self, pl_module: LightningModule, prefix: str, sums: _Sums) -> None:
        metrics = sums.metrics()
        pl_module.log_dict({f"{prefix}agent/{key}": value.float() for key, value in metrics.items()})  # global


def _multi_turn(pl_module: LightningModule) -> bool:
    """Whether the module can run several turns (tools or an environment): conversational prompts alone cannot."""
    agent = getattr(pl_module, "agent", None)
    return getattr(agent, "multi_turn", True)


def agent_metrics(rollout: Rollout) -> dict[str, Tensor]:
    """The global agent metrics of a multi-turn rollout (a collective: every rank calls it), named as logged.

    Raises:
        ValueError: If the rollout has no :class:`~lightning_grpo.rollout.batch.TurnStats` (a single-turn rollout).
    """
    if rollout.turns is None:
        raise ValueError("agent_metrics needs a multi-turn rollout (Rollout.turns is None)")
    return _Sums.of(rollout).metrics()


@dataclass
class _Sums:
    """This rank's sums: trajectories, turns, calls, errors, timeouts, cut, tokens, context; per-turn rewards."""

    totals: Tensor  # (8,) float64
    reward_sums: list[float]
    reward_counts: list[float]
    device: torch.device  # where the collectives run (the rollout's device: NCCL needs GPU tensors)

    @classmethod
    def of(cls, rollout: Rollout) -> _Sums:
        turns = rollout.turns
        assert turns is not None
        completion = rollout.completion_mask.double()
        sampled = rollout.sampled_mask.double().to(completion.device) * completion
        counts = [turns.num_turns, turns.tool_calls, turns.tool_errors, turns.tool_timeouts, turns.max_turns_reached]
        rows = torch.full((), len(rollout), dtype=torch.float64, device=completion.device)
        sums = [c.double().sum().to(completion.device) for c in counts]
        totals = torch.stack([rows, *sums, completion.sum(), (completion - sampled).sum()])  # no host sync
        width = max((len(rewards) for rewards in turns.turn_rewards), default=0)
        sums, seen = [0.0] * width, [0.0] * width
        for rewards in turns.turn_rewards:
            for k, reward in enumerate(rewards):
                if reward is not None:
                    sums[k], seen[k] = sums[k] + float(reward), seen[k] + 1
        return cls(totals, sums, seen, rollout.completion_mask.device)

    def __add__(self, other: _Sums) -> _Sums:
        width = max(len(self.reward_sums), len(other.reward_sums))
        pad = lambda values: values + [0.0] * (width - len(values))  # noqa: E731
        add = lambda a, b: [x + y for x, y in zip(pad(a), pad(b), strict=True)]  # noqa: E731
        return _Sums(
            self.totals + other.totals,
            add(self.reward_sums, other.reward_sums),
            add(self.reward_counts, other.reward_counts),
            self.device,
        )

    def metrics(self) -> dict[str, Tensor]:
        """The metrics over every rank (collectives: every rank calls this)."""
        totals = reduce_across_ranks(self.totals.to(self.device))
        count, num_turns, calls, errors, timeouts, cut, tokens, context = totals
        metrics = {
            "turns_mean": num_turns / count.clamp(min=1),
            "tool_calls_mean": calls / count.clamp(min=1),
            "tool_error_rate": errors / calls.clamp(min=1),
            "tool_timeout_rate": timeouts / calls.clamp(min=1),
            "context_token_frac": context / tokens.clamp(min=1),
            "max_turns_frac": cut / count.clamp(min=1),
        }
        return {**metrics, **self._turn_reward_means()}

    def _turn_reward_means(self) -> dict[str, Tensor]:
        """``turn_reward_mean/<k>``; ranks agree on the number of turns first (the shapes must match)."""
        width = int(reduce_across_ranks(torch.tensor([float(len(self.reward_sums))], device=self.device), "max").item())
        if width == 0:
            return {}
        pad = [0.0] * (width - len(self.reward_sums))
        rows = [self.reward_sums + pad, self.reward_counts + pad]
        sums, counts = reduce_across_ranks(torch.tensor(rows, dtype=torch.float64, device=self.device))
        return {f"turn_reward_mean/{k}": sums[k] / counts[k] for k in range(width) if counts[k] > 0}
