"""Per-token log-probs (and entropy) of a rollout's completions under a causal LM.

Rows that share a prompt (the G samples of one prompt) share its forward pass: the prompt minus its last token runs
once per distinct prompt with the KV cache on, the cache is indexed out to every row (differentiably: the gradient of
each row flows back into its prompt's single pass), and the rows continue from it with their completions. The logits
are those of the full ``(N, P+T)`` forward, computed on ``U·(P-1) + N·T`` positions instead of ``N·(P+T)``.
When gradient checkpointing is enabled (it turns the KV cache off in training mode) every pass uses the full forward.

With ``fused_head`` the output head never produces logits: its ``forward`` is swapped, for the duration of the model's
forward, for the pure-torch kernel :class:`~lightning_grpo.algorithms.FusedHeadLogProbs`, which projects the final
hidden states tile by tile. This module holds only the Hugging Face side: finding the head, checking that its output
is the logits as they are, and swapping its ``forward`` in and out.

Every route also computes :attr:`TokenLogProbs.kept_log_mass` when the rollout has margins: inside the fused head's
tiles, or from the materialised logits (:func:`~lightning_grpo.algorithms.logprob_kernels.kept_log_mass`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from lightning_grpo.algorithms import FusedHeadLogProbs, entropy_from_logits, selective_logprobs
from lightning_grpo.algorithms.logprob_kernels import kept_log_mass
from lightning_grpo.rollout.batch import Rollout
from lightning_grpo.rollout.cache_keyword import cache_of, with_cache
from lightning_grpo.rollout.packing import (
    PackingRoute,
    pack_rollout,
    packed_row_chunks,
    packing_route,
    shared_prompt_mask,
    unpack,
)

__all__ = [
    "TokenLogProbs",
    "completion_logits",
    "completion_logprobs",
    "fused_head_supported",
    "position_ids_from_mask",
]


@dataclass(frozen=True)
class TokenLogProbs:
    """Log-probs ``(N, T)`` of the completion tokens and, when asked, the entropy ``(N, T)`` at those positions.

    ``kept_log_mass`` ``(N, T)``, detached, is ``log Σ_{v ∈ S} p(v)`` under this model, with ``S`` the sampler's kept
    set replayed from ``Rollout.kept_margins``: the log-prob over the kept set is ``logprobs - kept_log_mass``.
    ``None`` when the rollout has no margins (nothing was truncated) or it was not asked for.

    With ``z = logits / temperature``, ``t`` the sampled token and ``m`` its margin, ``S = {v : z[v] >= z[t] - m -
    1e-4·max(1, |z[t]|)} ∪ {t}`` (the slack, :data:`~lightning_grpo.algorithms.logprob_kernels.KEPT_SLACK`, keeps a
    boundary token that rounding would drop); ``<= 0``, exactly 0 where ``m`` is ``inf``.
    """

    logprobs: Tensor
    entropy: Tensor | None = None
    kept_log_mass: Tensor | None = None


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, as ``generate`` uses them: ``cumsum(mask) - 1``, 0 on padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def completion_logprobs(
    model: nn.Module,
    rollout: Rollout,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_size: int = 1024,
    share_prompt: bool = True,
    fused_head: bool = True,
    tile_bytes: int | None = None,
    packing: bool | str = False,
    with_kept_mass: bool = True,
) -> TokenLogProbs:
    """Log-probs of the sampled completion tokens under ``model``, at the sampling temperature.

    Only completion positions reach the output head. With ``fused_head`` (and a plain linear head) no logits tensor
    exists; otherwise the ``(N, T, V)`` logits are materialised in the model's dtype and the log-softmax is chunked
    (:func:`~lightning_grpo.algorithms.selective_logprobs`). No float32 ``(N, T, V)`` tensor is ever held.

    Args:
        model: Causal LM (the policy, or the policy with its adapter disabled for the reference).
        rollout: The samples.
        temperature: Sampling temperature.
        with_entropy: Also return the per-token entropy.
        entropy_grad: Keep the entropy differentiable (only needed for an entropy bonus).
        chunk_size: Positions per chunk of the log-softmax (rows of a tile of the fused head).
        share_prompt: Run each distinct prompt once for all its rows (see the module docstring).
        fused_head: Compute log-probs inside the output head, tile by tile (see the module docstring).
        tile_bytes: Float32 bytes of one tile of the fused head (``None``: by device, see
            :func:`~lightning_grpo.algorithms.fused_head.tile_shape`).
        packing: Run the rows packed, without padding (:mod:`~lightning_grpo.rollout.packing`): ``True``, ``False``
            or ``"auto"`` (packed where the model's attention implementation takes packed rows, padded elsewhere).
            Values on padding are then 0.
        with_kept_mass: Compute :attr:`TokenLogProbs.kept_log_mass` when the rollout has ``kept_margins`` (a pass
            that needs no comparison with the sampler, such as the reference pass, skips it).

    Returns:
        :class:`TokenLogProbs` with ``(N, T)`` float32 tensors.

    Raises:
        ValueError: ``packing=True`` and the model's attention implementation cannot take packed rows.
    """
    route = _packing(model, share_prompt, packing)
    if not with_kept_mass:
        rollout = replace(rollout, kept_margins=None)
    head_settings = (temperature, chunk_size, with_entropy, entropy_grad, tile_bytes)
    if route is not None:
        return _packed_logprobs(model, rollout, route, fused_head, head_settings)
    if fused_head and fused_head_supported(model):
        with _fused_output_head(model, rollout.completion_ids, *head_settings, rollout.kept_margins) as result:
            _run_model(model, rollout, share_prompt)
        return TokenLogProbs(result["logprobs"], result.get("entropy"), result.get("kept_log_mass"))
    if fused_head:
        _log_fused_head_fallback(model)
    logits = completion_logits(model, rollout, share_prompt=share_prompt)  # (N, T, V)
    return _from_logits(logits, rollout.completion_ids, *head_settings[:4], rollout.kept_margins)


def _from_logits(
    logits: Tensor,
    targets: Tensor,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
    entropy_grad: bool,
    margins: Tensor | None = None,
) -> TokenLogProbs:
    """Log-probs of ``targets`` (and entropy, and the kept log mass with ``margins``) from materialised logits."""
    logprobs = selective_logprobs(logits, targets, temperature=temperature, chunk_size=chunk_size)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = entropy_from_logits(logits, temperature=temperature, chunk_size=chunk_size) if with_entropy else None
    kept = None
    if margins is not None:
        kept = kept_log_mass(logits, targets, margins, temperature=temperature, chunk_size=chunk_size)
    return TokenLogProbs(logprobs, entropy, kept)


def completion_logits(model: nn.Module, rollout: Rollout, *, share_prompt: bool = True) -> Tensor:
    """``(N, T, V)`` logits in the model's dtype: position t predicts completion token t.

    Args:
        model: Causal LM.
        rollout: The samples.
        share_prompt: Run each distinct prompt once (see the module docstring).
    """
    logits = _run_model(model, rollout, share_prompt)
    return logits[:, : rollout.completion_ids.shape[1]]


def _packing(model: nn.Module, share_prompt: bool, packing: bool | str) -> PackingRoute:
    """The packing route to take (``None``: padded rows), from the ``packing`` setting."""
    if not (packing is True or packing is False or packing == "auto"):
        raise ValueError(f"packing={packing!r} is not valid; choose one of True, False, 'auto'")
    if packing is False:
        return None
    route = packing_route(model, share_prompt)
    if route is None and packing is True:
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
        raise ValueError(
            f"packing=True: the model's attention implementation {impl!r} cannot take packed rows (those that can: "
            "'sdpa', 'eager', 'flash_attention_2', 'flash_attention_3'); load the model with one of them, or set "
            "packing='auto' (padded rows where packing is not possible) or packing=False"
        )
    return route


def _packed_logprobs(
    model: nn.Module, rollout: Rollout, route: PackingRoute, fused_head: bool, head_settings: tuple
) -> TokenLogProbs:
    """Log-probs (and entropy) over packed rows (``route``: see :func:`packing_route`), one forward each."""
    chunks = packed_row_chunks(rollout, share_prompt=route == "mask")
    if len(chunks) == 1:
        return _packed_row_logprobs(model, rollout, route, fused_head, head_settings)
    parts = [_packed_row_logprobs(model, rollout.select(rows), route, fused_head, head_settings) for rows in chunks]
    order = torch.argsort(torch.cat(chunks)).to(rollout.completion_ids.device)

    def joined(name: str) -> Tensor | None:
        values = [getattr(part, name) for part in parts]
        return None if values[0] is None else torch.cat(values)[order]

    return TokenLogProbs(joined("logprobs"), joined("entropy"), joined("kept_log_mass"))


def _packed_row_logprobs(
    model: nn.Module, rollout: Rollout, route: PackingRoute, fused_head: bool, head_settings: tuple
) -> TokenLogProbs:
    """Log-probs (and entropy) from one forward over one packed row."""
    packed = pack_rollout(rollout, share_prompt=route == "mask")
    inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids, "use_cache": False}
    if route == "mask":  # SDPA takes booleans, eager adds the mask to the scores
        dtype = model.get_input_embeddings().weight.dtype
        additive = getattr(model.config, "_attn_implementation", None) == "eager"
        inputs["attention_mask"] = shared_prompt_mask(packed, dtype, additive=additive)
    targets = packed.targets[None]  # (1, K)
    margins = None if rollout.kept_margins is None else rollout.kept_margins[packed.rows, packed.cols][None]
    if fused_head and fused_head_supported(model):
        with _fused_output_head(model, targets, *head_settings, margins) as result:
            model(**inputs, logits_to_keep=packed.predict)
        out = TokenLogProbs(result["logprobs"], result.get("entropy"), result.get("kept_log_mass"))
    else:
        if fused_head:
            _log_fused_head_fallback(model)
        logits = model(**inputs, logits_to_keep=packed.predict).logits  # (1, K, V)
        out = _from_logits(logits, targets, *head_settings[:4], margins)
    back = lambda values: None if values is None else unpack(values[0], packed)  # noqa: E731
    return TokenLogProbs(back(out.logprobs), back(out.entropy), back(out.kept_log_mass))


def _run_model(model: nn.Module, rollout: Rollout, share_prompt: bool) -> Tensor:
    """The head's output at the positions that predict the completion tokens, from one forward or the shared pair.

    The full forward returns ``T + 1`` positions (the last one predicts past the completion), the shared pair ``T``.
    """
    if share_prompt and rollout.prompt_ids.shape[1] >= 2 and not _checkpointing(model):
        return _shared_prompt_forward(model, rollout)
    attention_mask = rollout.attention_mask
    output = model(
        input_ids=rollout.input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        logits_to_keep=rollout.completion_ids.shape[1] + 1,
        use_cache=False,
    )
    return output.logits


def _shared_prompt_forward(model: nn.Module, rollout: Rollout) -> Tensor:
    """The prompt minus its last token once per distinct prompt, then every row from the indexed-out KV cache."""
    p, t = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    mask = rollout.attention_mask[:, : p + t - 1]  # (N, P+T-1): the last completion token is never an input
    positions = position_ids_from_mask(mask)
    first, inverse = _distinct_prompts(rollout.prompt_ids, rollout.prompt_mask)  # (U,), (N,)
    with _output_head_off(model):
        prefix = model(
            input_ids=rollout.prompt_ids[first, : p - 1],
            attention_mask=mask[first, : p - 1],
            position_ids=positions[first, : p - 1],
            use_cache=True,
            logits_to_keep=1,
        )
    cache = cache_of(prefix)
    cache.batch_select_indices(inverse)  # (U, ...) -> (N, ...); indexing is differentiable
    inputs = torch.cat([rollout.prompt_ids[:, -1:], rollout.completion_ids[:, :-1]], dim=1)  # (N, T)
    output = model(
        input_ids=inputs,
        attention_mask=mask,
        position_ids=positions[:, p - 1 :],
        **with_cache(cache),
        use_cache=True,
        logits_to_keep=t,
    )
    return output.logits


def _distinct_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
    """The first row of each distinct (prompt, mask) ``(U,)`` and the distinct prompt of every row ``(N,)``."""
    distinct, inverse = torch.unique(torch.cat([prompt_ids, prompt_mask.long()], dim=1), dim=0, return_inverse=True)
    rows = torch.arange(len(inverse), device=inverse.device)  # the one host sync is unique's output size
    first = torch.full((len(distinct),), len(inverse), device=inverse.device, dtype=torch.long)
    return first.scatter_reduce(0, inverse, rows, reduce="amin"), inverse


def _checkpointing(model: nn.Module) -> bool:
    """Gradient checkpointing is enabled (a layer has ``gradient_checkpointing`` set), whatever the mode.

    Every pass then takes the full forward, so the update, old and reference log-probs of a row come from the same
    computation (another path differs in the last bits, which Adam turns into a visible step where a gradient is 0).
    """
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


# ---------------------------------------------------------------- swapping the output head

_log = logging.getLogger(__name__)
_FALLBACK_LOGGED: set[str] = set()  # head types already reported: the fallback is logged once per process and type


def _log_fused_head_fallback(model: nn.Module) -> None:
    """One log line when ``fused_head`` is asked for but the head cannot take it (e.g. a quantized output head)."""
    get_head = getattr(model, "get_output_embeddings", None)
    kind = type(get_head() if get_head is not None else None).__name__
    if kind not in _FALLBACK_LOGGED:
        _FALLBACK_LOGGED.add(kind)
        _log.warning(
            "fused_head: the output head (%s) is not a plain nn.Linear whose logits are used as they are (a quantized "
            "head, logit softcapping or scaling); log-probs are computed from the materialised logits instead",
            kind,
        )


_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "logits_scaling")


def fused_head_supported(model: nn.Module) -> bool:
    """The output head is a plain ``nn.Linear`` whose logits the model uses as they are (no softcapping or scaling)."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    config = getattr(model, "config", None)
    transformed = any(getattr(config, name, None) is not None for name in _LOGIT_TRANSFORMS)
    return type(head) is nn.Linear and not transformed


@contextmanager
def _head_forward(model: nn.Module, forward: object) -> Iterator[None]:
    """Replace the output head's ``forward`` for the duration (nested swaps restore the outer one)."""
    head = model.get_output_embeddings()
    previous = head.__dict__.get("forward")
    head.forward = forward
    try:
        yield
    finally:
        if previous is None:
            del head.forward
        else:
            head.forward = previous


@contextmanager
def _output_head_off(model: nn.Module) -> Iterator[None]:
    """The output head returns an empty ``(N, k, 0)`` tensor: the prefix pass needs no logits."""
    if not fused_head_supported(model):
        yield
        return
    with _head_forward(model, lambda hidden: hidden[..., :0]):
        yield


@contextmanager
def _fused_output_head(
    model: nn.Module,
    targets: Tensor,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
    entropy_grad: bool,
    tile_bytes: int | None = None,
    margins: Tensor | None = None,
) -> Iterator[dict[str, Tensor]]:
    """Swap the head's forward for :class:`FusedHeadLogProbs` on the ``T`` positions that predict ``targets``.

    The result holds ``logprobs``, ``entropy`` (with ``with_entropy``) and ``kept_log_mass`` (with ``margins``).
    """
    head, result = model.get_output_embeddings(), {}

    def forward(hidden: Tensor) -> Tensor:  # (N, T or T+1, H)
        hidden = hidden[:, : targets.shape[1]]
        settings = (temperature, chunk_size, with_entropy, tile_bytes)
        logprobs, entropy, *kept = FusedHeadLogProbs.apply(hidden, head.weight, head.bias, targets, *settings, margins)
        result["logprobs"] = logprobs
        if kept:
            result["kept_log_mass"] = kept[0]
        if with_entropy:
            result["entropy"] = entropy if entropy_grad and torch.is_grad_enabled() else entropy.detach()
        return logprobs[..., None]

    with _head_forward(model, forward):
        yield result
