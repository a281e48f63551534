"""The compiled decode path (``GRPOConfig.sampling.decode: compiled``): one compiled callable per decode step, no
recompiles.

Each sampling call is rounded up to a shape bucket (:mod:`lightning_grpo.rollout.buckets`). A bucket owns a static KV
cache (transformers' ``StaticCache``) and fixed buffers (attention mask, tokens fed, tokens drawn with their log-probs
and kept-set margins, the finished flags, the random draws), allocated on its first call and reused by every later
one. A call:

1. prefills its ``B`` distinct prompts once, eagerly (prompt lengths vary), and copies the keys and values into the
   bucket's static cache repeated to ``B * G`` rows (the rows past them copy row 0 and are finished from the start);
2. draws the first token from the prefill's logits (eager: the same code as the compiled step's draw);
3. runs the compiled step until every row has finished or ``max_new_tokens`` is reached: the model's forward over the
   static cache, ``generate``'s processors (EOS barred before ``min_new_tokens``, temperature, top-k, top-p, min-p),
   the draw, and the drawn token's log-prob and margin (:func:`~lightning_grpo.rollout.truncation.behaviour`, as the
   eager loop records them), written into the bucket's buffers in place. A finished row keeps stepping
   with its token masked out of attention: no shape inside the step depends on the data.

The random numbers are drawn outside the graph, on the call's real rows only and in the order the eager loop draws
them: ``multinomial`` as ``torch.multinomial`` draws (one exponential variate per vocabulary entry and row, then
``argmax(p / q)``, torch's own algorithm), ``inverse_cdf`` one float64 uniform per row. So for the same seed both paths
sample the same tokens, up to the floating-point difference of the compiled forward (none in float64).

The step is compiled with ``fullgraph=True`` and ``dynamic=False`` (a graph break or a dynamic shape is an error, not a
slowdown); the policy is an input of the compiled callable, so its parameters are graph inputs: an optimizer step or a
``sampling_adapter`` swap of the LoRA weights is read by the next call without recompiling (inductor's ``freezing``
stays off).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo
from torch import nn
from transformers import PreTrainedTokenizerBase, StaticCache

from lightning_grpo.rollout.buckets import DecodeBuckets
from lightning_grpo.rollout.cache_keyword import cache_of, with_cache
from lightning_grpo.rollout.decode import prefill
from lightning_grpo.rollout.generation import sample_tokens
from lightning_grpo.rollout.sampling_settings import Sampled, SampleRequest, SamplingSettings, eos_token_ids
from lightning_grpo.rollout.truncation import behaviour, warp

__all__ = ["COMPILE_BACKEND", "CompiledDecoder", "compile_blocker"]

_log = logging.getLogger(__name__)

#: ``torch.compile``'s backend when none is given: inductor (tests set ``"eager"``: dynamo's tracing and guards, no
#: code generation).
COMPILE_BACKEND = "inductor"

#: Graphs dynamo keeps per compiled function: one per bucket; torch's default (8) is too few for a run's buckets.
_RECOMPILE_LIMIT = 64


def compile_blocker(model: nn.Module) -> str:
    """Why ``model`` cannot run the compiled decode path (``""``: it can), naming its class.

    Args:
        model: The policy (a ``PeftModel``) or the Hugging Face model under it.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    name = type(base).__name__
    if not hasattr(base, "config") or not hasattr(base, "generate"):
        return f"{name} is not a Hugging Face causal LM"
    if not getattr(base, "_can_compile_fullgraph", getattr(base, "_supports_static_cache", False)):
        return f"{name} does not support a static KV cache under torch.compile (transformers' _can_compile_fullgraph)"
    quantizer = getattr(base, "hf_quantizer", None)
    if quantizer is not None and not getattr(quantizer, "is_compileable", False):
        return f"{name} is quantized with {type(quantizer).__name__}, which torch.compile cannot trace"
    return ""


@dataclass(frozen=True)
class _Spec:
    """The constants of a step (guarded by dynamo: one graph per value, constant within a run)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    min_new_tokens: int
    sampler: str
    pad_id: int

    @property
    def settings(self) -> SamplingSettings:
        """Settings carrying the processors' values (for :mod:`~lightning_grpo.rollout.truncation`)."""
        return SamplingSettings(
            1, 1, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p
        )


@dataclass
class _Bucket:
    """One bucket's static cache and buffers (``R`` rows, ``L`` positions, vocabulary ``V``), reused every call."""

    cache: StaticCache
    mask: torch.Tensor  # (R, L) long: which cache positions each row reads
    last: torch.Tensor  # (R,) long: the tokens fed at the next step
    tokens: torch.Tensor  # (R, L) long: drawn tokens, step by step
    logprobs: torch.Tensor  # (R, L) float32: their log-probs
    margins: torch.Tensor  # (R, L) float32: their kept-set margins (0 when nothing truncates)
    finished: torch.Tensor  # (R,) bool
    step: torch.Tensor  # () long: tokens drawn so far
    slot: torch.Tensor  # () long: the cache position of the next token fed
    noise: torch.Tensor  # (R, V) float32 exponentials (multinomial) or (R, 1) float64 uniforms (inverse_cdf)
    eos: torch.Tensor  # (E,) long


def _choose(logits: torch.Tensor, b: _Bucket, spec: _Spec) -> None:
    """Draw each row's token from float32 ``logits`` ``(R, V)`` with ``b.noise``; record it, its log-prob and margin."""
    scores, settings = logits, spec.settings
    if spec.min_new_tokens:
        barred = logits.index_fill(-1, b.eos, float("-inf"))
        scores = torch.where(b.step < spec.min_new_tokens, barred, logits)
    warped = warp(scores, settings)
    probs = torch.softmax(warped, dim=-1)
    if spec.sampler == "multinomial":  # torch.multinomial's own algorithm, its exponentials drawn outside
        chosen = torch.argmax(probs / b.noise, dim=-1)
    else:
        cdf = probs.double().cumsum(-1)
        chosen = torch.searchsorted(cdf, b.noise * cdf[:, -1:], right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
    chosen = chosen.masked_fill(b.finished, spec.pad_id)
    column = b.step.expand(len(chosen), 1)
    logprobs, margins = behaviour(logits, warped, chosen, settings, b.finished)
    b.tokens.scatter_(1, column, chosen[:, None])
    b.logprobs.scatter_(1, column, logprobs[:, None])
    if margins is not None:  # a constant of the graph (the settings truncate or not)
        b.margins.scatter_(1, column, margins[:, None])
    b.finished.logical_or_(chosen[:, None].eq(b.eos).any(-1))
    b.last.copy_(chosen)
    b.step.add_(1)


def _decode_step(model: nn.Module, b: _Bucket, spec: _Spec) -> None:
    """One decode step, compiled: feed ``b.last`` (masked for finished rows), then :func:`_choose` the next token."""
    b.mask.scatter_(1, b.slot.expand(len(b.mask), 1), (~b.finished).long()[:, None])
    out = model(
        input_ids=b.last[:, None],
        attention_mask=b.mask,
        position_ids=b.mask.sum(-1, keepdim=True) - 1,
        use_cache=True,
        logits_to_keep=1,
        **with_cache(b.cache),
    )
    b.slot.add_(1)
    _choose(out.logits[:, -1].float(), b, spec)


class CompiledDecoder:
    """Samples with a compiled decode step over per-bucket static KV caches; kept for the run (by the HF backend).

    Args:
        buckets: The run's length buckets (rows are rounded to powers of two).
        backend: ``torch.compile``'s backend; ``None``: :data:`COMPILE_BACKEND` (``"inductor"``).
        mode: ``torch.compile``'s mode; ``None``: ``"reduce-overhead"`` (CUDA graphs) on CUDA, the default elsewhere.

    Example::

        decoder = CompiledDecoder(DecodeBuckets.for_run(None, max_prompt_length=64, max_new_tokens=64))
        request = SampleRequest(prompt_ids, prompt_mask, settings)
        sampled = decoder.sample(policy, tokenizer, request)  # as sample_tokens
    """

    def __init__(self, buckets: DecodeBuckets, *, backend: str | None = None, mode: str | None = None) -> None:
        self.buckets = buckets
        self.backend, self.mode = backend or COMPILE_BACKEND, mode
        self._buckets: dict[tuple[Any, ...], _Bucket] = {}
        self._compiled: dict[str | None, Any] = {}
        self._warned: set[str] = set()
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, _RECOMPILE_LIMIT)

    def release(self) -> None:
        """Free every bucket's cache and buffers (the compiled graphs stay; a later call allocates again)."""
        self._buckets.clear()

    @torch.no_grad()
    def sample(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, request: SampleRequest) -> Sampled:
        """As :func:`~lightning_grpo.rollout.generation.sample_tokens` (call in eval mode); a call longer than every
        length bucket, or under ``synced_gpus``, is sampled by the eager path (logged once)."""
        prompt_ids, prompt_mask, settings = request.prompt_ids, request.prompt_mask, request.settings
        length = self.buckets.length(prompt_ids.shape[1], settings.max_new_tokens)
        if length is None or settings.synced_gpus:
            self._warn_once(
                "compiled decode: a call of "
                f"{prompt_ids.shape[1]} + {settings.max_new_tokens} positions is longer than every length bucket "
                f"{list(self.buckets.lengths)}: the eager loop samples it (list a longer bucket in decode_lengths)"
                if length is None
                else "compiled decode: synced_gpus (FSDP2) samples with generate, which keeps every rank stepping"
            )
            return sample_tokens(model, tokenizer, request)
        g, eos = settings.num_generations, eos_token_ids(tokenizer).to(prompt_ids.device)
        spec = _Spec(
            settings.temperature,
            settings.top_k,
            settings.top_p,
            settings.min_p,
            settings.min_new_tokens,
            settings.sampler,
            tokenizer.pad_token_id,
        )
        logits = self._prefill(model, prompt_ids, prompt_mask, g, length, spec, eos)
        n = len(prompt_ids) * g
        b = self._bucket_of(model, n, length, spec, eos, vocab=logits.shape[-1])
        self._draw_noise(b, n, spec)
        _choose(logits, b, spec)  # the first token, from the prefill's logits (eager)
        step = self._step_fn(prompt_ids.device.type)
        for _ in range(settings.max_new_tokens - 1):
            if bool(b.finished.all()):  # the step's one host sync (padding rows are finished from the start)
                break
            self._draw_noise(b, n, spec)
            step(model, b, spec)
        width = settings.max_new_tokens
        tokens, logprobs = b.tokens[:n, :width].clone(), b.logprobs[:n, :width].clone()
        margins = b.margins[:n, :width].clone() if settings.truncates else None
        return Sampled(torch.cat([prompt_ids.repeat_interleave(g, dim=0), tokens], dim=1), logprobs, margins)

    def _step_fn(self, device_type: str) -> Any:
        """The compiled step for a call on ``device_type`` (one ``torch.compile`` per mode; graphs per bucket)."""
        mode = self.mode
        if mode is None and self.backend == "inductor" and device_type == "cuda":
            mode = "reduce-overhead"
        if mode not in self._compiled:
            options = {"backend": self.backend, "fullgraph": True, "dynamic": False}
            self._compiled[mode] = torch.compile(_decode_step, mode=mode, **options)
        return self._compiled[mode]

    def _prefill(
        self,
        model: nn.Module,
        ids: torch.Tensor,
        mask: torch.Tensor,
        g: int,
        length: int,
        spec: _Spec,
        eos: torch.Tensor,
    ) -> torch.Tensor:
        """Prefill the prompts once, copy their keys and values into the bucket's cache; the first logits ``(R, V)``."""
        out = prefill(model, ids, mask)
        n = len(ids) * g
        b = self._bucket_of(model, n, length, spec, eos, vocab=out.logits.shape[-1])
        rows = len(b.mask)
        pad = lambda t: _pad_rows(t.repeat_interleave(g, dim=0), rows)  # noqa: E731
        for layer, source in zip(b.cache.layers, cache_of(out).layers, strict=True):
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.zero_()  # the stale keys and values stay, masked out
            layer.update(pad(source.keys), pad(source.values))
        width = ids.shape[1]
        b.mask.zero_()
        b.mask[:, :width] = pad(mask)
        b.slot.fill_(width)
        b.step.zero_()
        b.finished.zero_()
        b.finished[n:] = True
        b.tokens.fill_(spec.pad_id)
        b.logprobs.zero_()
        b.margins.zero_()
        return pad(out.logits[:, -1].float())

    def _bucket_of(
        self, model: nn.Module, n: int, length: int, spec: _Spec, eos: torch.Tensor, *, vocab: int
    ) -> _Bucket:
        rows, param = DecodeBuckets.rows(n), next(model.parameters())
        key = (rows, length, vocab, spec.sampler, param.dtype, param.device)
        if key not in self._buckets:
            self._announce_compile(rows, length)
            self._buckets[key] = _allocate(model, rows, length, vocab, spec.sampler, eos)
        bucket = self._buckets[key]
        if bucket.eos.shape != eos.shape:  # another tokenizer's EOS list: a new input (one more graph)
            bucket.eos = _static(eos.clone())
        elif not torch.equal(bucket.eos, eos):
            bucket.eos.copy_(eos)
        return bucket

    @staticmethod
    def _draw_noise(b: _Bucket, n: int, spec: _Spec) -> None:
        """The step's random numbers for the call's ``n`` rows, drawn as the eager loop draws them."""
        if spec.sampler == "multinomial":
            b.noise[:n].exponential_(1)
        else:
            b.noise[:n].uniform_()

    def _announce_compile(self, rows: int, length: int) -> None:
        """Say (rank zero) that the next decode step compiles for a new bucket, and about how long that takes."""
        if self.backend == "eager":  # tracing only (the tests' backend): seconds at most
            return
        from lightning.fabric.utilities.rank_zero import rank_zero_info

        rank_zero_info(
            f"compiled decode: torch.compile builds the decode step for a new shape ({rows} rows x {length} "
            "positions), once per shape: about 10-60 s (docs/benchmarks.md: 10-17 s on a CPU), then it is reused"
        )

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            _log.warning(message)


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with rows appended up to ``rows``, copies of its first row."""
    extra = rows - len(tensor)
    return torch.cat([tensor, tensor[:1].expand(extra, *tensor.shape[1:])]) if extra else tensor


def _static(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` marked as a fixed address (CUDA graphs replay it in place)."""
    torch._dynamo.mark_static_address(tensor)
    return tensor


def _allocate(model: nn.Module, rows: int, length: int, vocab: int, sampler: str, eos: torch.Tensor) -> _Bucket:
    """A bucket's static cache (allocated at its first prefill) and buffers."""
    config = (model.get_base_model() if hasattr(model, "get_base_model") else model).config
    device = eos.device
    long = lambda *shape: _static(torch.zeros(shape, dtype=torch.long, device=device))  # noqa: E731
    if sampler == "multinomial":
        noise = torch.ones((rows, vocab), dtype=torch.float32, device=device)
    else:
        noise = torch.full((rows, 1), 0.5, dtype=torch.float64, device=device)
    return _Bucket(
        cache=StaticCache(config=config, max_cache_len=length),
        mask=long(rows, length),
        last=long(rows),
        tokens=long(rows, length),
        logprobs=_static(torch.zeros((rows, length), dtype=torch.float32, device=device)),
        margins=_static(torch.zeros((rows, length), dtype=torch.float32, device=device)),
        finished=_static(torch.zeros(rows, dtype=torch.bool, device=device)),
        step=long(),
        slot=long(),
        noise=_static(noise),
        eos=_static(eos.clone()),
    )
