"""Sampling G completions per prompt with a Hugging Face model (KV cache on, dropout off).

By default each prompt is prefilled once and its KV cache is shared by its G samples: the prompt minus its last token
runs through the model on the ``B`` distinct prompts, the cache is repeated to ``B * G`` rows, and ``generate``
continues from it. The sampling distribution and the random draws are those of plain ``generate`` with
``num_return_sequences=G`` (``share_prompt=False``), which recomputes every prompt G times.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase
from transformers.generation import LogitsProcessor, LogitsProcessorList, MinNewTokensLengthLogitsProcessor

from lightning_grpo.rollout.batch import Rollout, completion_mask_from_ids
from lightning_grpo.rollout.cache_keyword import cache_of, with_cache
from lightning_grpo.rollout.decode import decode_loop
from lightning_grpo.rollout.logprobs import position_ids_from_mask
from lightning_grpo.rollout.sampling_settings import Sampled, SampleFn, SampleRequest, SamplingSettings, eos_token_ids
from lightning_grpo.rollout.truncation import behaviour, full_logprobs, warp

__all__ = ["eval_mode", "generate_rollout", "sample_tokens", "tokenize_prompts"]


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode (dropout off; gradient checkpointing, active only in train mode, off), then restored."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


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
    sample: SampleFn | None = None,
) -> Rollout:
    """Sample ``settings.num_generations`` completions for each prompt.

    The model is put in eval mode for sampling (dropout off; gradient checkpointing, active only in train mode, off)
    and restored afterwards; the KV cache is on, and each prompt is prefilled once for its G samples unless
    ``settings.share_prompt`` is off.

    Args:
        model: A causal LM with ``generate`` (e.g. the ``PeftModel`` policy or the HF model under it).
        tokenizer: Its tokenizer; must have a pad token.
        prompts: ``B`` prompt texts.
        settings: Sampling settings.
        max_prompt_length: Longest allowed prompt in tokens.
        columns: Dataset row fields, one list of ``B`` values each; repeated G times into the rollout.
        sample: The sampler (:data:`SampleFn`); ``None``: :func:`sample_tokens`.

    Returns:
        A :class:`Rollout` of ``B * G`` samples, samples of one prompt consecutive, with the sampler's behaviour
        log-probs and (when the settings truncate) kept-set margins, 0 past each completion's end.
    """
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts, max_prompt_length, device)
    with eval_mode(model):
        sampled = (sample or sample_tokens)(model, tokenizer, SampleRequest(prompt_ids, prompt_mask, settings))
    completion_ids = sampled.sequences[:, prompt_ids.shape[1] :]
    return _rollout(tokenizer, prompt_ids, prompt_mask, completion_ids, sampled, prompts, columns or {})


def _rollout(
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    sampled: Sampled,
    prompts: Sequence[str],
    columns: dict[str, Sequence[Any]],
) -> Rollout:
    """The :class:`Rollout` of ``(B*G, T)`` sampled tokens: masks after EOS, pads, texts, repeated prompt data, and
    ``sampled``'s log-probs and margins (0 on padding)."""
    g = len(completion_ids) // len(prompts)
    completion_mask, truncated = completion_mask_from_ids(completion_ids, eos_token_ids(tokenizer))
    completion_ids = completion_ids.masked_fill(completion_mask == 0, tokenizer.pad_token_id)
    repeat = lambda values: [v for v in values for _ in range(g)]  # noqa: E731
    return Rollout(
        prompt_ids=prompt_ids.repeat_interleave(g, dim=0),
        prompt_mask=prompt_mask.repeat_interleave(g, dim=0),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        truncated=truncated,
        group_ids=torch.arange(len(prompts), device=prompt_ids.device).repeat_interleave(g),
        prompts=repeat(prompts),
        completions=tokenizer.batch_decode(completion_ids, skip_special_tokens=True),
        columns={name: repeat(values) for name, values in columns.items()},
        logprobs=sampled.logprobs * completion_mask,
        kept_margins=None if sampled.margins is None else sampled.margins.masked_fill(completion_mask == 0, 0.0),
    )


def sample_tokens(model: nn.Module, tokenizer: PreTrainedTokenizerBase, request: SampleRequest) -> Sampled:
    """Prompt and sampled tokens ``(B*G, P+T)``, G consecutive rows per prompt, with each sampled token's log-prob
    and (when the settings truncate) kept-set margin (:class:`Sampled`).

    Call under ``no_grad``, in eval mode. With ``settings.share_prompt`` (and prompts of at least two positions) the
    prompt minus its last token is run once per prompt, its KV cache repeated G times, and ``generate`` continues from
    that cache; it computes the same logits and consumes the random stream in the same order as ``generate`` with
    ``num_return_sequences=G``. ``request.rows`` is not read (no state is kept between calls).
    """
    prompt_ids, prompt_mask, settings = request.prompt_ids, request.prompt_mask, request.settings
    if settings.own_loop:
        return decode_loop(model, prompt_ids, prompt_mask, settings, eos_token_ids(tokenizer), tokenizer.pad_token_id)
    config = settings.generation_config(tokenizer)
    if not settings.min_p and not getattr(getattr(model, "generation_config", None), "min_p", None):
        config.min_p = None  # no min-p, no model default to override: skip generate's no-op min-p pass (a softmax)
    config.min_new_tokens = None  # applied after the recorder, which sees the logits training scores
    g = settings.num_generations
    kwargs: dict[str, Any] = {"generation_config": config, "synced_gpus": settings.synced_gpus}
    if not settings.share_prompt or settings.static_cache or g == 1 or prompt_ids.shape[1] < 2:
        kwargs.update(input_ids=prompt_ids, attention_mask=prompt_mask)
    else:
        prefix = model(
            input_ids=prompt_ids[:, :-1],
            attention_mask=prompt_mask[:, :-1],
            position_ids=position_ids_from_mask(prompt_mask[:, :-1]),
            use_cache=True,
            logits_to_keep=1,
        )
        cache = cache_of(prefix)
        cache.batch_repeat_interleave(g)  # (B, ...) -> (B*G, ...), samples of one prompt consecutive
        config.num_return_sequences = 1
        kwargs.update(
            input_ids=prompt_ids.repeat_interleave(g, dim=0),
            attention_mask=prompt_mask.repeat_interleave(g, dim=0),
            **with_cache(cache),
        )
    eos = eos_token_ids(tokenizer).to(prompt_ids.device)
    recorder = _LogprobRecorder(settings, eos)
    processors = LogitsProcessorList([recorder])
    if settings.min_new_tokens:
        processors.append(MinNewTokensLengthLogitsProcessor(prompt_ids.shape[1], settings.min_new_tokens, eos))
    sequences = model.generate(**kwargs, logits_processor=processors)
    return Sampled(sequences, *recorder.recorded(sequences[:, prompt_ids.shape[1] :]))


class _LogprobRecorder(LogitsProcessor):
    """Records each drawn token's log-prob and margin (:func:`~lightning_grpo.rollout.truncation.behaviour`), as
    ``generate`` hands the logits over.

    It runs before ``min_new_tokens`` and the warpers (temperature, top-k, top-p, min-p), on the logits training
    scores. When nothing truncates it records ``log_softmax(logits / temperature)``, as it always did; otherwise it
    replays ``min_new_tokens``' EOS ban and the warpers on those logits (deterministic: the kept set ``generate`` drew
    from) and records the log-prob over the kept set and the margin; a row that has ended records 0 and 0. A step's
    token is known only at the next call (or at the end), so the logits of one step are kept until then: one
    ``(N, V)`` tensor, never the whole history.
    """

    def __init__(self, settings: SamplingSettings, eos: torch.Tensor) -> None:
        self.settings, self.eos = settings, eos
        self.values: list[torch.Tensor] = []  # (N,) log-probs per settled step
        self.margins: list[torch.Tensor] = []  # (N,) margins per settled step (truncating settings only)
        self.ended: torch.Tensor | None = None  # (N,) rows that have produced EOS in the settled steps
        self.pending: torch.Tensor | None = None  # the last step's logits (N, V), float32

    def _settle(self, chosen: torch.Tensor) -> None:
        settings, logits = self.settings, self.pending
        if logits is None:
            return
        if not settings.truncates:  # the full vocabulary: nothing to replay
            self.values.append(full_logprobs(logits, chosen, settings.temperature))
            return
        if self.ended is None:
            self.ended = torch.zeros(len(chosen), dtype=torch.bool, device=chosen.device)
        barred = len(self.values) < settings.min_new_tokens
        warped = warp(logits.index_fill(-1, self.eos, float("-inf")) if barred else logits, settings)
        logprob, margin = behaviour(logits, warped, chosen, settings, self.ended)
        self.values.append(logprob)
        self.margins.append(margin)
        self.ended = self.ended | torch.isin(chosen, self.eos)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._settle(input_ids[:, -1])
        self.pending = scores.float()  # generate's processors return new tensors: this one stays as it is
        return scores

    def recorded(self, new_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(N, T)`` log-probs and margins (``None`` when nothing truncates) of ``new_tokens``, the ``T`` tokens
        ``generate`` added."""
        if new_tokens.shape[1] > len(self.values):
            self._settle(new_tokens[:, len(self.values)])
            self.pending = None
        zeros = new_tokens.new_zeros(new_tokens.shape, dtype=torch.float32)
        logprobs = _stacked(self.values, new_tokens.shape[1], zeros)
        return logprobs, _stacked(self.margins, new_tokens.shape[1], zeros) if self.settings.truncates else None


def _stacked(steps: list[torch.Tensor], width: int, empty: torch.Tensor) -> torch.Tensor:
    """The first ``width`` of ``steps`` ``(N,)`` as ``(N, width)``; ``empty`` when there are none."""
    return torch.stack(steps[:width], dim=1) if steps[:width] else empty
