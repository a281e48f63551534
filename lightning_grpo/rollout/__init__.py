"""Hugging Face glue for sampling: the :class:`Rollout` batch, generation, and completion log-probs."""

from lightning_grpo.rollout.batch import Rollout, completion_mask_from_ids
from lightning_grpo.rollout.generation import SamplingSettings, eos_token_ids, generate_rollout, tokenize_prompts
from lightning_grpo.rollout.logprobs import TokenLogProbs, completion_logprobs, position_ids_from_mask

__all__ = [
    "Rollout",
    "SamplingSettings",
    "TokenLogProbs",
    "completion_logprobs",
    "completion_mask_from_ids",
    "eos_token_ids",
    "generate_rollout",
    "position_ids_from_mask",
    "tokenize_prompts",
]
