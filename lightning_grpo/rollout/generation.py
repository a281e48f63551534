"""Sampling G completions per prompt with a Hugging Face model (KV cache on, dropout off)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase

from lightning_grpo.rollout.batch import Rollout, completion_mask_from_ids

__all__ = ["SamplingSettings", "eos_token_ids", "generate_rollout", "tokenize_prompts"]


@dataclass(frozen=True)
class SamplingSettings:
    """How completions are sampled.

    Attributes:
        num_generations: Completions per prompt (G).
        max_new_tokens: Longest completion.
        temperature: Softmax temperature (log-probs are computed at the same temperature).
        top_p: Nucleus sampling threshold; 1.0 disables it.
        top_k: Keep the k most likely tokens; 0 disables it.
        synced_gpus: Keep every rank stepping until all finish (required under FSDP).
    """

    num_generations: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    synced_gpus: bool = False

    def generation_config(self, tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
        """A complete generation config: every sampling knob is set, so no model default can change the distribution."""
        return GenerationConfig(
            do_sample=True,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=0.0,
            repetition_penalty=1.0,
            max_new_tokens=self.max_new_tokens,
            num_return_sequences=self.num_generations,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos_token_ids(tokenizer).tolist(),
            use_cache=True,
        )


def eos_token_ids(tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    """The ids that end a completion: the tokenizer's EOS (and ``<|im_end|>``-style ids it lists)."""
    ids = tokenizer.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if not ids:
        raise ValueError("the tokenizer has no eos_token_id; set tokenizer.eos_token before training")
    return torch.tensor(ids, dtype=torch.long)


def tokenize_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], max_prompt_length: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt tokens ``(B, P)`` and attention mask; a prompt over ``max_prompt_length`` is an error."""
    encoded = tokenizer(list(prompts), add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt")
    lengths = encoded["attention_mask"].sum(-1)
    if int(lengths.max()) > max_prompt_length:
        row = int(lengths.argmax())
        raise ValueError(
            f"prompt {row} has {int(lengths[row])} tokens, more than max_prompt_length={max_prompt_length}; "
            "raise max_prompt_length or let PromptDataModule drop long prompts"
        )
    return encoded["input_ids"].to(device), encoded["attention_mask"].to(device)


@torch.no_grad()
def generate_rollout(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    settings: SamplingSettings,
    *,
    max_prompt_length: int,
    columns: dict[str, Sequence[Any]] | None = None,
) -> Rollout:
    """Sample ``settings.num_generations`` completions for each prompt.

    The model is put in eval mode for sampling (dropout off; gradient checkpointing, active only in train mode, off)
    and restored afterwards; the KV cache is on.

    Args:
        model: A causal LM with ``generate`` (e.g. the ``PeftModel`` policy or the HF model under it).
        tokenizer: Its tokenizer; must have a pad token.
        prompts: ``B`` prompt texts.
        settings: Sampling settings.
        max_prompt_length: Longest allowed prompt in tokens.
        columns: Dataset row fields, one list of ``B`` values each; repeated G times into the rollout.

    Returns:
        A :class:`Rollout` of ``B * G`` samples, samples of one prompt consecutive.
    """
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts, max_prompt_length, device)
    was_training = model.training
    model.eval()
    try:
        sequences = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            generation_config=settings.generation_config(tokenizer),
            synced_gpus=settings.synced_gpus,
        )
    finally:
        model.train(was_training)
    g = settings.num_generations
    completion_ids = sequences[:, prompt_ids.shape[1] :]  # (B*G, T)
    completion_mask, truncated = completion_mask_from_ids(completion_ids, eos_token_ids(tokenizer))
    completion_ids = completion_ids.masked_fill(completion_mask == 0, tokenizer.pad_token_id)
    repeat = lambda values: [v for v in values for _ in range(g)]  # noqa: E731
    return Rollout(
        prompt_ids=prompt_ids.repeat_interleave(g, dim=0),
        prompt_mask=prompt_mask.repeat_interleave(g, dim=0),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        truncated=truncated,
        group_ids=torch.arange(len(prompts), device=device).repeat_interleave(g),
        prompts=repeat(prompts),
        completions=tokenizer.batch_decode(completion_ids, skip_special_tokens=True),
        columns={name: repeat(values) for name, values in (columns or {}).items()},
    )
