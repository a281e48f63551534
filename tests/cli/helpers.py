"""A user's own GRPOModule subclass and data module, importable by class path from a YAML config in the CLI tests."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_grpo import GRPOModule, Rollout


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
