"""The entry point of all sampling: :func:`sample_rollout` draws G completions per prompt, single- or multi-turn.

String prompts are sampled as plain text (:func:`~lightning_grpo.rollout.generation.generate_rollout`);
conversational prompts (lists of chat messages) go through the chat template, with tools or an environment when set
(:func:`~lightning_grpo.rollout.multi_turn.generate_conversations`). Both return the same :class:`Rollout`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.agents import validate_messages
from lightning_grpo.agents.message_checks import string_prompts_refused
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.batch import Rollout
from lightning_grpo.rollout.generation import generate_rollout
from lightning_grpo.rollout.multi_turn import generate_conversations
from lightning_grpo.rollout.sampling_settings import SampleFn, SamplingSettings
from lightning_grpo.rollout.session import RolloutSession, as_sample_fn

__all__ = ["sample_rollout"]


def sample_rollout(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str | list[dict[str, Any]]],
    settings: SamplingSettings,
    agent: AgentSettings,
    *,
    max_prompt_length: int,
    columns: dict[str, Sequence[Any]] | None = None,
    any_rank_active: Callable[[bool], bool] | None = None,
    sample: SampleFn | RolloutSession | None = None,
) -> Rollout:
    """Sample G completions per prompt: string prompts as plain text, conversational prompts through the template.

    ``sample`` draws the tokens of every sampling call: a :data:`~lightning_grpo.rollout.sampling_settings.SampleFn`, a
    backend's :class:`~lightning_grpo.rollout.session.RolloutSession` (told which trajectories each call continues),
    or ``None``: Hugging Face ``generate`` through :func:`~lightning_grpo.rollout.generation.sample_tokens`.

    Raises:
        ValueError: Prompts mix strings and message lists, or a message is malformed.
        SettingError: Tools or an environment are set with string prompts (one line naming the fix; a
            :class:`~lightning_grpo.data.PromptDataModule` refuses them earlier, when it is set up).
    """
    prompts = list(prompts)
    if all(isinstance(p, str) for p in prompts):
        if agent.multi_turn:
            raise string_prompts_refused("prompt 0", prompts[0] if prompts else "")
        return generate_rollout(
            model,
            tokenizer,
            prompts,
            settings,
            max_prompt_length=max_prompt_length,
            columns=columns,
            sample=as_sample_fn(sample),
        )
    if not all(isinstance(p, list | tuple) for p in prompts):
        kinds = sorted({type(p).__name__ for p in prompts})
        raise ValueError(f"prompts must be all strings or all lists of chat messages; got a mix of {kinds}")
    messages = [validate_messages(p, name=f"prompt {i}") for i, p in enumerate(prompts)]
    return generate_conversations(
        model,
        tokenizer,
        messages,
        settings,
        agent,
        max_prompt_length=max_prompt_length,
        columns=columns,
        any_rank_active=any_rank_active,
        sample=sample,
    )
