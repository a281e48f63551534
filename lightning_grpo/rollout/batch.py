"""The :class:`Rollout` batch: G sampled completions per prompt, with their masks and row data."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

__all__ = ["Rollout", "completion_mask_from_ids"]


def completion_mask_from_ids(completion_ids: Tensor, eos_token_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Mask every token after the first end-of-sequence token.

    Args:
        completion_ids: ``(N, T)`` sampled tokens (anything may follow the first EOS).
        eos_token_ids: 1-D tensor of the token ids that end a completion.

    Returns:
        ``(completion_mask, truncated)``: ``(N, T)`` long mask, 1 up to and including the first EOS; ``(N,)`` bool,
        true where no EOS was produced (the completion hit ``max_new_tokens``).

    Example::

        >>> mask, truncated = completion_mask_from_ids(torch.tensor([[5, 1, 7], [5, 6, 7]]), torch.tensor([1]))
        >>> mask.tolist(), truncated.tolist()
        ([[1, 1, 0], [1, 1, 1]], [False, True])
    """
    is_eos = torch.isin(completion_ids, eos_token_ids.to(completion_ids.device))  # (N, T)
    eos_seen_before = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # an EOS strictly earlier in the row
    completion_mask = (~eos_seen_before).long()
    truncated = ~is_eos.any(-1)
    return completion_mask, truncated


@dataclass
class Rollout:
    """``N = B*G`` sampled completions: token tensors, masks, texts and the dataset columns of their prompts.

    Prompts are left-padded and completions right-padded, so ``cat([prompt_ids, completion_ids], 1)`` is the model
    input and the last ``T`` positions are the completion.

    Attributes:
        prompt_ids: ``(N, P)`` left-padded prompt tokens (each prompt repeated G times, consecutively).
        prompt_mask: ``(N, P)`` attention mask of the prompts.
        completion_ids: ``(N, T)`` sampled tokens.
        completion_mask: ``(N, T)`` 1 up to and including the first EOS.
        truncated: ``(N,)`` bool, true where no EOS was produced within ``max_new_tokens``.
        group_ids: ``(N,)`` the prompt each sample belongs to (unique within this rank's batch).
        prompts: The N prompt texts.
        completions: The N decoded completion texts (special tokens removed).
        columns: Dataset row fields, each a list of N values (repeated per sample).
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    completion_ids: Tensor
    completion_mask: Tensor
    truncated: Tensor
    group_ids: Tensor
    prompts: list[str]
    completions: list[str]
    columns: dict[str, list[Any]] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def input_ids(self) -> Tensor:
        """``(N, P+T)`` prompt and completion tokens."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:
        """``(N, P+T)`` attention mask (padding after the first EOS is masked out)."""
        return torch.cat([self.prompt_mask, self.completion_mask.to(self.prompt_mask.dtype)], dim=1)

    @property
    def completion_lengths(self) -> Tensor:
        """``(N,)`` number of valid completion tokens (EOS included)."""
        return self.completion_mask.sum(-1)

    def select(self, index: Tensor) -> Rollout:
        """The rows ``index`` (a 1-D long tensor) as a new rollout, e.g. one micro-batch."""
        rows = index.tolist()
        pick = [self.prompts[i] for i in rows], [self.completions[i] for i in rows]
        return replace(
            self,
            prompt_ids=self.prompt_ids[index],
            prompt_mask=self.prompt_mask[index],
            completion_ids=self.completion_ids[index],
            completion_mask=self.completion_mask[index],
            truncated=self.truncated[index],
            group_ids=self.group_ids[index],
            prompts=pick[0],
            completions=pick[1],
            columns={k: [v[i] for i in rows] for k, v in self.columns.items()},
        )

    def to(self, device: torch.device | str) -> Rollout:
        """The rollout with its tensors on ``device``."""
        tensors = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated", "group_ids")
        return replace(self, **{name: getattr(self, name).to(device) for name in tensors})
