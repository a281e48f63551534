"""The sampling seam of a rollout: a stateless :data:`~lightning_grpo.rollout.sampling_settings.SampleFn`, or a
:class:`RolloutSession` that a rollout backend opens for one rollout and samples every turn of it through.

A session sees which trajectories each sampling call continues (``request.rows``), so it can keep per-trajectory
state from one agent turn to the next (a KV cache, a server-side conversation) and drop it when the rollout ends
(:meth:`close`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.rollout.generation import sample_tokens
from lightning_grpo.rollout.sampling_settings import Sampled, SampleFn, SampleRequest

__all__ = ["RolloutSession", "as_sample_fn", "draw"]


@runtime_checkable
class RolloutSession(Protocol):
    """One rollout's sampler, opened by :meth:`RolloutBackend.session <lightning_grpo.backends.RolloutBackend>`.

    Every sampling call of the rollout goes through :meth:`sample`: one call for a single-turn rollout, one per turn
    for a multi-turn one; :meth:`close` is called once when the rollout is done, also when it failed.
    """

    def sample(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, request: SampleRequest) -> Sampled:
        """Sample one turn: the :data:`~lightning_grpo.rollout.sampling_settings.SampleFn` call, whose
        ``request.rows`` say which trajectories it continues.

        Args:
            model: The policy (a backend with its own copy of the weights may ignore it).
            tokenizer: Its tokenizer.
            request: The contexts, the settings and the trajectory of each returned row
                (:class:`~lightning_grpo.rollout.sampling_settings.SampleRequest`).

        Returns:
            ``(R * num_generations, P + T)`` sequences and ``(R * num_generations, T)`` token log-probs.
        """
        ...

    def close(self) -> None:
        """Drop the rollout's state; called once, when the rollout ends or fails."""
        ...


def draw(
    sample: SampleFn | RolloutSession | None,
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    request: SampleRequest,
) -> Sampled:
    """One sampling call through ``sample``: a session, a plain ``SampleFn``, or ``None`` (Hugging Face,
    :func:`~lightning_grpo.rollout.generation.sample_tokens`)."""
    sampler = as_sample_fn(sample)
    return (sample_tokens if sampler is None else sampler)(model, tokenizer, request)


def as_sample_fn(sample: SampleFn | RolloutSession | None) -> SampleFn | None:
    """The ``SampleFn`` of ``sample``: a session's bound :meth:`~RolloutSession.sample` (a request's default rows,
    ``0 .. R*G-1``, are the whole rollout), else ``sample`` itself."""
    return sample.sample if isinstance(sample, RolloutSession) else sample
