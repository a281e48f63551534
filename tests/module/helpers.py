"""Test helpers: a fixed rollout built from texts, and a module that trains on it instead of sampling."""

from __future__ import annotations

import torch

from lightning_grpo import GRPOModule, Rollout
from lightning_grpo.rollout import completion_mask_from_ids, eos_token_ids


def fixed_rollout(tokenizer, prompts: list[str], completions: list[str], group_size: int) -> Rollout:
    """A rollout of the given texts: each completion gets an EOS unless it ends in ``...`` (then it is truncated)."""
    prompt = tokenizer(prompts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt")
    rows = [tokenizer(c.removesuffix("..."), add_special_tokens=False)["input_ids"] for c in completions]
    rows = [
        ids if c.endswith("...") else [*ids, tokenizer.eos_token_id] for ids, c in zip(rows, completions, strict=True)
    ]
    width = max(map(len, rows))
    completion_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    for i, ids in enumerate(rows):
        completion_ids[i, : len(ids)] = torch.tensor(ids)
    mask, truncated = completion_mask_from_ids(completion_ids, eos_token_ids(tokenizer))
    mask = mask * (completion_ids != tokenizer.pad_token_id)  # a truncated row ends at its last real token
    return Rollout(
        prompt_ids=prompt["input_ids"],
        prompt_mask=prompt["attention_mask"],
        completion_ids=completion_ids,
        completion_mask=mask,
        truncated=truncated,
        group_ids=torch.arange(len(prompts)) // group_size,
        prompts=prompts,
        completions=[c.removesuffix("...") for c in completions],
    )


class FixedRolloutModule(GRPOModule):
    """Trains on ``self.fixed`` (a Rollout) instead of sampling: the one overridden step is ``generate``."""

    fixed: Rollout

    def generate(self, batch, *, num_generations=None, temperature=None) -> Rollout:
        return self.fixed.to(self.device)
