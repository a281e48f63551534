"""Hugging Face glue for sampling: the :class:`Rollout` batch, generation, and completion log-probs.

:func:`sample_rollout` is the entry point of all sampling: single-turn, or multi-turn with tools or an environment
(:class:`AgentSettings`). What draws the tokens is a :data:`SampleFn` or a backend's :class:`RolloutSession`
(``lightning_grpo.backends``), each called as ``sample(model, tokenizer, request)`` with a :class:`SampleRequest`.
"""

from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.batch import Rollout, completion_mask_from_ids
from lightning_grpo.rollout.generation import generate_rollout, tokenize_prompts
from lightning_grpo.rollout.logprobs import TokenLogProbs, completion_logprobs, position_ids_from_mask
from lightning_grpo.rollout.sampling import sample_rollout
from lightning_grpo.rollout.sampling_settings import Sampled, SampleFn, SampleRequest, SamplingSettings, eos_token_ids
from lightning_grpo.rollout.session import RolloutSession

__all__ = [
    "AgentSettings",
    "Rollout",
    "RolloutSession",
    "SampleFn",
    "SampleRequest",
    "Sampled",
    "SamplingSettings",
    "TokenLogProbs",
    "completion_logprobs",
    "completion_mask_from_ids",
    "eos_token_ids",
    "generate_rollout",
    "position_ids_from_mask",
    "sample_rollout",
    "tokenize_prompts",
]
