"""Rollouts with mixed prompt and completion lengths, and the tiny policy, for the packing tests."""

from __future__ import annotations

import torch

from lightning_grpo.policy import PolicyConfig, load_policy
from lightning_grpo.rollout import Rollout
from lightning_grpo.testing import build_tiny_model


def mixed_rollout(
    vocab: int, prompt_lengths: list[int], completion_lengths: list[list[int]], *, seed: int = 0, pad: int = 0
) -> Rollout:
    """Groups of rows sharing a left-padded prompt, each row a right-padded completion of its own length."""
    gen = torch.Generator().manual_seed(seed)
    p, t = max(prompt_lengths), max(n for group in completion_lengths for n in group)
    rows = []
    for group, (length, completions) in enumerate(zip(prompt_lengths, completion_lengths, strict=True)):
        prompt = torch.randint(4, vocab, (length,), generator=gen)
        for n in completions:
            rows.append((group, prompt, torch.randint(4, vocab, (n,), generator=gen)))
    left = lambda x: torch.cat([torch.full((p - len(x),), pad), x])  # noqa: E731
    right = lambda x: torch.cat([x, torch.full((t - len(x),), pad)])  # noqa: E731
    ones = lambda x, n: (torch.arange(n) >= n - len(x)).long()  # noqa: E731
    return Rollout(
        prompt_ids=torch.stack([left(r[1]) for r in rows]),
        prompt_mask=torch.stack([ones(r[1], p) for r in rows]),
        completion_ids=torch.stack([right(r[2]) for r in rows]),
        completion_mask=torch.stack([(torch.arange(t) < len(r[2])).long() for r in rows]),
        truncated=torch.zeros(len(rows), dtype=torch.bool),
        group_ids=torch.tensor([r[0] for r in rows]),
        prompts=[""] * len(rows),
        completions=[""] * len(rows),
    )


def tiny_policy(tokenizer, attn: str = "sdpa"):
    """The tiny Qwen2 with a non-zero LoRA adapter, on the attention implementation ``attn``."""
    model = build_tiny_model(tokenizer)
    model.set_attn_implementation(attn)
    policy = load_policy(model, PolicyConfig(lora_r=4, lora_alpha=8))
    gen = torch.Generator().manual_seed(1)
    for name, param in policy.named_parameters():
        if "lora_B" in name:  # a non-zero adapter: the gradients of A are non-zero too
            param.data.normal_(std=0.1, generator=gen)
    return policy
