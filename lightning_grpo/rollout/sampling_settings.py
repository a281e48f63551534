"""What a sampling call takes and gives back: :class:`SampleRequest` (with its :class:`SamplingSettings`),
:class:`Sampled`, the samplers, and the ids that end a completion.

Every sampler is called the same way, ``sample(model, tokenizer, request)`` (:data:`SampleFn`): Hugging Face
``generate`` (:mod:`~lightning_grpo.rollout.generation`), our own decode loops (:mod:`~lightning_grpo.rollout.decode`,
:mod:`~lightning_grpo.rollout.compiled_decode`, :mod:`~lightning_grpo.rollout.turn_cache`) and the backends
(``lightning_grpo.backends``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase

__all__ = ["SAMPLERS", "SampleFn", "SampleRequest", "Sampled", "Sampler", "SamplingSettings", "eos_token_ids"]

#: How the next token is drawn (``SamplingSettings.sampler``, ``GRPOConfig.sampling.sampler``).
Sampler = Literal["multinomial", "inverse_cdf"]
SAMPLERS: tuple[str, ...] = get_args(Sampler)


@dataclass(frozen=True)
class Sampled:
    """What one sampling call returns.

    Attributes:
        sequences: ``(N, P+T)`` prompt and sampled tokens.
        logprobs: ``(N, T)`` float32 log-probability of each sampled token under the distribution it was drawn
            from: ``softmax(logits / temperature)`` renormalised over the kept set (the tokens top-k, top-p and
            min-p leave; the whole vocabulary when nothing truncates), ``min_new_tokens`` aside; values after a row's
            end are meaningless (masked by the caller).
        margins: ``(N, T)`` float32 kept set of each sampled token, as a margin: with ``z = logits / temperature``,
            ``z[token] - min(z[v] for v in the kept set)`` (>= 0; ``inf`` where the whole vocabulary is kept). The
            trainer replays the kept set as ``{v: z'[v] >= z'[token] - margin}`` on its own logits ``z'``: one
            number per token, however many tokens top-p keeps. ``None`` when the settings truncate nothing
            (:attr:`SamplingSettings.truncates`).
    """

    sequences: torch.Tensor
    logprobs: torch.Tensor
    margins: torch.Tensor | None = None


@dataclass(frozen=True)
class SamplingSettings:
    """How completions are sampled.

    Attributes:
        num_generations: Completions per prompt (G).
        max_new_tokens: Longest completion.
        temperature: Softmax temperature (log-probs are computed at the same temperature).
        top_p: Nucleus sampling threshold; 1.0 disables it.
        top_k: Keep the k most likely tokens; 0 disables it.
        min_p: Keep the tokens whose probability is at least ``min_p`` times the most likely one's; 0 disables it.
        synced_gpus: Keep every rank stepping until all finish (required under FSDP).
        min_new_tokens: Forbid EOS before this many tokens. This changes the sampling distribution (EOS masked),
            which the training log-probs do not model: meant for benchmarks that need fixed-length completions.
        share_prompt: Prefill each prompt once and share its KV cache among its G samples (same distribution and
            draws as ``False``, which lets ``generate`` prefill every prompt G times).
        static_cache: Sample with a static KV cache, which lets ``generate`` compile the decode step with
            ``torch.compile`` on CUDA (Hugging Face's auto-compile). Implies ``share_prompt=False``.
        sampler: ``"multinomial"`` draws as ``generate`` does (``torch.multinomial``: one exponential variate per
            vocabulary entry and row, the same draws as ``generate`` for a given seed); ``"inverse_cdf"`` draws one
            uniform per row and inverts the float64 cumulative distribution (the same distribution, other draws,
            much cheaper on CPU). Anything but the default uses our own decoding loop.
        drop_finished: In our own decoding loop, drop rows that have produced EOS from the batch and the KV cache,
            so finished samples stop costing compute (``generate`` keeps computing them until every row is done).
    """

    num_generations: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    synced_gpus: bool = False
    min_new_tokens: int = 0
    share_prompt: bool = True
    static_cache: bool = False
    sampler: Sampler = "multinomial"
    drop_finished: bool = False

    @property
    def truncates(self) -> bool:
        """Whether top-k, top-p or min-p leave out part of the vocabulary (the sampler then records margins)."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def own_loop(self) -> bool:
        """Decode with :func:`~lightning_grpo.rollout.decode.decode_loop` rather than ``generate`` (a non-default
        sampler or ``drop_finished``)."""
        custom = self.sampler != "multinomial" or self.drop_finished
        return custom and not (self.synced_gpus or self.static_cache)

    def generation_config(self, tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
        """A complete generation config: every sampling knob is set, so no model default can change the distribution."""
        return GenerationConfig(
            do_sample=True,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=1.0,
            max_new_tokens=self.max_new_tokens,
            min_new_tokens=self.min_new_tokens or None,
            num_return_sequences=self.num_generations,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos_token_ids(tokenizer).tolist(),
            use_cache=True,
            cache_implementation="static" if self.static_cache else None,
        )


def eos_token_ids(tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    """The ids that end a completion: the tokenizer's EOS (and ``<|im_end|>``-style ids it lists)."""
    ids = tokenizer.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if not ids:
        raise ValueError("the tokenizer has no eos_token_id; set tokenizer.eos_token before training")
    return torch.tensor(ids, dtype=torch.long)


@dataclass(frozen=True, eq=False)
class SampleRequest:
    """One sampling call: the contexts to continue, how, and which trajectories the returned rows are.

    Every sampler takes one (:data:`SampleFn`, :meth:`RolloutSession.sample
    <lightning_grpo.rollout.session.RolloutSession.sample>`); a sampler without per-trajectory state ignores ``rows``.

    Attributes:
        prompt_ids: ``(R, P)`` left-padded contexts: ``R`` prompts, each sampled ``settings.num_generations`` times
            (G on a rollout's first call when a group shares its prompt, else 1).
        prompt_mask: ``(R, P)`` their attention mask.
        settings: Sampling settings of this call (``max_new_tokens`` is the turn's budget).
        rows: The trajectory of each returned row (``R * settings.num_generations`` of them, rows of a group
            consecutive): the same number always names the same trajectory within a session. Empty for a call that
            only keeps this rank in step with the others (FSDP, ``synced_gpus``): its result is dropped. ``None``
            (the default) becomes ``range(R * settings.num_generations)``: a rollout sampled in one call.

    Example::

        >>> request = SampleRequest(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3), SamplingSettings(4, 8))
        >>> request.rows
        range(0, 8)
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    settings: SamplingSettings
    rows: Sequence[int] = None  # type: ignore[assignment]  # None: every row, set in __post_init__

    def __post_init__(self) -> None:
        if self.rows is None:
            object.__setattr__(self, "rows", range(len(self.prompt_ids) * self.settings.num_generations))


#: What samples the tokens of a rollout, called as ``sample(model, tokenizer, request)``: Hugging Face's
#: :func:`~lightning_grpo.rollout.generation.sample_tokens`, a rollout engine's ``sample``
#: (:class:`~lightning_grpo.backends.vllm.engine.VLLMEngine`), or a session's bound
#: :meth:`~lightning_grpo.rollout.session.RolloutSession.sample`.
SampleFn = Callable[[nn.Module, PreTrainedTokenizerBase, SampleRequest], Sampled]
