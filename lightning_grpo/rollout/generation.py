"""Sampling G completions per prompt with a Hugging Face model (KV cache on, dropout off).

By default each prompt is prefilled once and its KV cache is shared by its G samples: the prompt minus its last token
runs through the model on the ``B`` distinct prompts, the cache is repeated to ``B * G`` rows, and ``generate``
continues from it. The sampling distribution and the random draws are those of plain ``generate`` with
``num_return_sequences=G`` (``share_prompt=False``), which recomputes every prompt G times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase
from transformers.generation import (
    LogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from lightning_grpo.rollout.batch import Rollout, completion_mask_from_ids
from lightning_grpo.rollout.cache_keyword import cache_of, with_cache
from lightning_grpo.rollout.logprobs import position_ids_from_mask

__all__ = [
    "SAMPLERS",
    "DecodeState",
    "SampleFn",
    "Sampled",
    "Sampler",
    "SamplingSettings",
    "decode_loop",
    "decode_steps",
    "eos_token_ids",
    "eval_mode",
    "generate_rollout",
    "sample_sequences",
    "sample_tokens",
    "tokenize_prompts",
]

#: How the next token is drawn (``SamplingSettings.sampler``, ``GRPOConfig.sampler``).
Sampler = Literal["multinomial", "inverse_cdf"]
SAMPLERS: tuple[str, ...] = get_args(Sampler)


@dataclass(frozen=True)
class Sampled:
    """What one sampling call returns.

    Attributes:
        sequences: ``(N, P+T)`` prompt and sampled tokens.
        logprobs: ``(N, T)`` float32 log-probability of each sampled token under ``softmax(logits / temperature)``
            (the distribution training scores, before top-k/top-p truncation and ``min_new_tokens``); values after a
            row's end are meaningless (masked by the caller).
    """

    sequences: torch.Tensor
    logprobs: torch.Tensor


#: What samples the tokens of a rollout: :func:`sample_tokens` (Hugging Face) or a rollout engine's ``sample``
#: (:class:`~lightning_grpo.backends.vllm_engine.VLLMEngine`), called as ``sample(model, tokenizer, prompt_ids,
#: prompt_mask, settings)``.
SampleFn = Callable[..., Sampled]


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode (dropout off; gradient checkpointing, active only in train mode, off), then restored."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


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
    synced_gpus: bool = False
    min_new_tokens: int = 0
    share_prompt: bool = True
    static_cache: bool = False
    sampler: Sampler = "multinomial"
    drop_finished: bool = False

    @property
    def own_loop(self) -> bool:
        """Decode with :func:`decode_loop` rather than ``generate`` (a non-default sampler or ``drop_finished``)."""
        custom = self.sampler != "multinomial" or self.drop_finished
        return custom and not (self.synced_gpus or self.static_cache)

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
        A :class:`Rollout` of ``B * G`` samples, samples of one prompt consecutive.
    """
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts, max_prompt_length, device)
    with eval_mode(model):
        sampled = (sample or sample_tokens)(model, tokenizer, prompt_ids, prompt_mask, settings)
    completion_ids = sampled.sequences[:, prompt_ids.shape[1] :]
    return _rollout(tokenizer, prompt_ids, prompt_mask, completion_ids, sampled.logprobs, prompts, columns or {})


def _rollout(
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    logprobs: torch.Tensor,
    prompts: Sequence[str],
    columns: dict[str, Sequence[Any]],
) -> Rollout:
    """The :class:`Rollout` of ``(B*G, T)`` sampled tokens: masks after EOS, pads, texts, repeated prompt data."""
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
        logprobs=logprobs * completion_mask,
    )


def sample_sequences(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    settings: SamplingSettings,
) -> torch.Tensor:
    """``(B*G, P+T)`` prompt and sampled tokens: :func:`sample_tokens` without the log-probs."""
    return sample_tokens(model, tokenizer, prompt_ids, prompt_mask, settings).sequences


def sample_tokens(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    settings: SamplingSettings,
) -> Sampled:
    """Prompt and sampled tokens ``(B*G, P+T)``, G consecutive rows per prompt, with each sampled token's log-prob.

    Call under ``no_grad``, in eval mode. With ``settings.share_prompt`` (and prompts of at least two positions) the
    prompt minus its last token is run once per prompt, its KV cache repeated G times, and ``generate`` continues from
    that cache; it computes the same logits and consumes the random stream in the same order as ``generate`` with
    ``num_return_sequences=G``.
    """
    if settings.own_loop:
        return decode_loop(model, prompt_ids, prompt_mask, settings, eos_token_ids(tokenizer), tokenizer.pad_token_id)
    config = settings.generation_config(tokenizer)
    if not getattr(getattr(model, "generation_config", None), "min_p", None):
        config.min_p = None  # no model default to override: skip generate's no-op min-p pass (a softmax per step)
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
    recorder = _LogprobRecorder(settings.temperature)
    processors = LogitsProcessorList([recorder])
    if settings.min_new_tokens:
        eos = eos_token_ids(tokenizer).to(prompt_ids.device)
        processors.append(MinNewTokensLengthLogitsProcessor(prompt_ids.shape[1], settings.min_new_tokens, eos))
    sequences = model.generate(**kwargs, logits_processor=processors)
    return Sampled(sequences, recorder.logprobs(sequences[:, prompt_ids.shape[1] :]))


class _LogprobRecorder(LogitsProcessor):
    """Records ``log_softmax(logits / temperature)`` of each drawn token, as ``generate`` hands the logits over.

    It runs before the warpers (temperature, top-k, top-p) and before ``min_new_tokens``: the distribution it records
    is the one training scores. A step's token is known only at the next call (or at the end), so the logits of one
    step are kept until then: one ``(N, V)`` tensor, never the whole history.
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.values: list[torch.Tensor] = []  # (N,) per settled step
        self.pending: torch.Tensor | None = None  # the last step's logits (N, V), float32

    def _settle(self, chosen: torch.Tensor) -> None:
        if self.pending is not None:
            self.values.append(token_logprobs(self.pending, chosen, self.temperature))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._settle(input_ids[:, -1])
        self.pending = scores.float()  # generate's processors return new tensors: this one stays as it is
        return scores

    def logprobs(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """``(N, T)`` log-probs of ``new_tokens``, the ``T`` tokens ``generate`` added."""
        if new_tokens.shape[1] > len(self.values):
            self._settle(new_tokens[:, len(self.values)])
            self.pending = None
        steps = self.values[: new_tokens.shape[1]]
        return torch.stack(steps, dim=1) if steps else new_tokens.new_zeros(new_tokens.shape, dtype=torch.float32)


def decode_loop(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    settings: SamplingSettings,
    eos_ids: torch.Tensor,
    pad_id: int,
) -> Sampled:
    """Our own sampling loop: ``(B*G, P+T)`` tokens, G consecutive rows per prompt, and their log-probs.

    Each prompt is prefilled once and its KV cache repeated G times; each step applies ``generate``'s processors (EOS
    forbidden before ``min_new_tokens``, temperature, top-k, top-p), draws with ``settings.sampler``, and with
    ``settings.drop_finished`` removes the rows that have produced EOS from the batch and the cache. Call under
    ``no_grad``, in eval mode.
    """
    g, eos_ids = settings.num_generations, eos_ids.to(prompt_ids.device)
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position_ids_from_mask(prompt_mask),
                use_cache=True, logits_to_keep=1)  # fmt: skip
    cache, logits = cache_of(out), out.logits[:, -1].float().repeat_interleave(g, dim=0)  # (N, V)
    cache.batch_repeat_interleave(g)
    state = DecodeState(cache, logits, alive=prompt_ids.new_empty(0), mask=prompt_mask.repeat_interleave(g, dim=0))
    tokens, logprobs = decode_steps(model, state, settings, eos_ids, pad_id)
    return Sampled(torch.cat([prompt_ids.repeat_interleave(g, dim=0), tokens], dim=1), logprobs)


@dataclass
class DecodeState:
    """What :func:`decode_steps` continues from and leaves behind.

    Attributes:
        cache: The KV cache of the rows in the batch.
        logits: ``(n, V)`` float32 next-token logits of those rows.
        alive: Which of the call's rows are in the batch (set by :func:`decode_steps`: all of them at the start).
        mask: ``(n, K)`` attention mask over the cache's positions (zeros: padding, or a token that is never read).
    """

    cache: Any
    logits: torch.Tensor
    alive: torch.Tensor
    mask: torch.Tensor


#: Called with the rows about to leave the batch (``drop_finished``): their call rows, cache rows and mask rows.
LeaveFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


def decode_steps(
    model: nn.Module,
    state: DecodeState,
    settings: SamplingSettings,
    eos_ids: torch.Tensor,
    pad_id: int,
    on_leave: LeaveFn | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoding steps of :func:`decode_loop` from a prefilled ``state``: ``(N, T)`` tokens and log-probs.

    Each step applies ``generate``'s processors, draws with ``settings.sampler``, feeds the drawn tokens (masked once a
    row has produced EOS), and with ``settings.drop_finished`` removes finished rows from the batch and the cache
    (``on_leave`` sees them first). ``state`` is updated in place: at the end its cache holds the rows in
    ``state.alive``, and ``state.mask`` marks which cache positions hold tokens the rows read.
    """
    mask, logits, cache = state.mask, state.logits, state.cache
    tokens = torch.full((len(mask), settings.max_new_tokens), pad_id, dtype=torch.long, device=mask.device)
    logprobs = torch.zeros(tokens.shape, dtype=torch.float32, device=mask.device)
    alive = torch.arange(len(mask), device=mask.device)  # rows still in the batch
    finished = torch.zeros(len(mask), dtype=torch.bool, device=mask.device)
    for step in range(settings.max_new_tokens):
        scores = logits.index_fill(-1, eos_ids, float("-inf")) if step < settings.min_new_tokens else logits
        chosen = _draw(_warpers(settings)(None, scores), settings.sampler).masked_fill(finished[alive], pad_id)
        tokens[alive, step] = chosen
        logprobs[alive, step] = token_logprobs(logits, chosen, settings.temperature)
        done = finished[alive] | torch.isin(chosen, eos_ids)  # (n,) the rows in the batch
        finished[alive] = done
        if step == settings.max_new_tokens - 1:
            break
        running = int((~done).sum())  # the step's one host sync: stop, and how many rows to keep
        if running == 0:
            break
        mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
        if settings.drop_finished and running < len(alive):
            order = torch.argsort(done.byte(), stable=True)  # the running rows first, in order; no nonzero
            keep = order[:running]
            if on_leave is not None:
                on_leave(alive[order[running:]], order[running:], mask[order[running:], :-1])
            alive, mask, chosen = alive[keep], mask[keep], chosen[keep]
            cache.batch_select_indices(keep)
        out = model(input_ids=chosen[:, None], attention_mask=mask, position_ids=mask.sum(-1, keepdim=True) - 1,
                    **with_cache(cache), use_cache=True, logits_to_keep=1)  # fmt: skip
        logits = out.logits[:, -1].float()
    state.alive, state.mask = alive, mask
    return tokens, logprobs


def token_logprobs(logits: torch.Tensor, chosen: torch.Tensor, temperature: float) -> torch.Tensor:
    """``(n,)`` log-prob of ``chosen`` under ``softmax(logits / temperature)`` (``logits`` float32, ``(n, V)``)."""
    scaled = logits / temperature
    return scaled.gather(-1, chosen[:, None]).squeeze(-1) - scaled.logsumexp(-1)


def _warpers(settings: SamplingSettings) -> LogitsProcessorList:
    """Temperature, top-k and top-p in ``generate``'s order (each only when it changes the distribution)."""
    warpers = LogitsProcessorList()
    if settings.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(settings.temperature))
    if settings.top_k > 0:
        warpers.append(TopKLogitsWarper(settings.top_k))
    if settings.top_p < 1.0:
        warpers.append(TopPLogitsWarper(settings.top_p))
    return warpers


def _draw(scores: torch.Tensor, sampler: str) -> torch.Tensor:
    """One token per row from ``softmax(scores)``."""
    probs = torch.softmax(scores, dim=-1)  # (n, V) float32
    if sampler == "multinomial":
        return torch.multinomial(probs, 1).squeeze(-1)
    cdf = probs.double().cumsum(-1)  # (n, V); a zero-probability token never owns an interval
    u = torch.rand(len(cdf), 1, dtype=torch.float64, device=cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
