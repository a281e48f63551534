"""A user's own GRPOModule subclass, data module, policy loss, KL and advantage estimators, importable by class or
import path from a YAML config in the CLI tests."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_grpo import GRPOModule, Rollout
from lightning_grpo.algorithms import AdvantageSettings, GroupStats, PolicyLossSettings, PolicyLossTerms


class ShortAnswerGRPO(GRPOModule):
    """Subtracts ``length_penalty`` times the completion length (in tokens) from the rewards before the advantages.

    Args:
        length_penalty: Penalty per completion token.
        *args: Passed to :class:`~lightning_grpo.GRPOModule`.
        **kwargs: Passed to :class:`~lightning_grpo.GRPOModule`.
    """

    def __init__(self, *args: Any, length_penalty: float = 0.01, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.length_penalty = length_penalty
        self.calls = 0

    def compute_advantages(self, rewards: Tensor, rollout: Rollout) -> Tensor:
        self.calls += 1
        penalty = self.length_penalty * rollout.completion_lengths.to(rewards)
        return super().compute_advantages(rewards - penalty, rollout)


class FixedPrompts(LightningDataModule):
    """Batches of fixed ``{"prompt": [...], "answer": [...]}``: a data module that is not a PromptDataModule.

    Args:
        prompts: Prompt texts.
        answers: One answer per prompt.
        batch_size: Prompts per batch.
    """

    def __init__(self, prompts: list[str], answers: list[str], batch_size: int = 2) -> None:
        super().__init__()
        self.rows = [{"prompt": p, "answer": a} for p, a in zip(prompts, answers, strict=True)]
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.rows, batch_size=self.batch_size, collate_fn=_collate)


def _collate(rows: list[dict[str, str]]) -> dict[str, list[str]]:
    return {key: [row[key] for row in rows] for key in rows[0]}


#: How often each user-written variant below was called (the CLI test reads it).
CALLS: dict[str, int] = {"loss": 0, "kl": 0, "advantages": 0}


def reinforce_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, settings: PolicyLossSettings
) -> PolicyLossTerms:
    """A user's own policy loss: REINFORCE with the importance ratio and no clipping (the docs' example)."""
    CALLS["loss"] += 1
    ratio = torch.exp(logprobs - old_logprobs)  # (N, T)
    return PolicyLossTerms(loss=-advantages * ratio, ratio=ratio)


#: The ``max_ratio`` each call of :func:`capped_reinforce_loss` received (the CLI test reads it).
SEEN_MAX_RATIO: list[float] = []


def capped_reinforce_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, settings: PolicyLossSettings,
    *, max_ratio: float = 10.0,
) -> PolicyLossTerms:  # fmt: skip
    """A user's own policy loss with a setting of its own (``loss_kind_args: {max_ratio: ...}``, docs/index.md)."""
    SEEN_MAX_RATIO.append(max_ratio)
    ratio = torch.exp(logprobs - old_logprobs)  # (N, T)
    return PolicyLossTerms(loss=-advantages * ratio.clamp(max=max_ratio), ratio=ratio, clipped=ratio > max_ratio)


def squared_kl(d: Tensor) -> Tensor:
    """A user's own KL estimator of ``d = ref_logprobs - logprobs``: k2 under another name."""
    CALLS["kl"] += 1
    return 0.5 * d.square()


def centred_advantages(stats: GroupStats, completion_mask: Tensor | None, settings: AdvantageSettings) -> Tensor:
    """A user's own advantage estimator: reward minus the group mean (Dr. GRPO's, under another name)."""
    CALLS["advantages"] += 1
    return stats.rewards - stats.mean


def string_reward(prompts: list[str], completions: list[str], **_: Any) -> list[str]:
    """A user's mistake: a reward function that returns its numbers as strings."""
    return ["1.0" for _ in completions]
