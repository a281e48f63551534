"""Per-token log-probs (and entropy) of a rollout's completions under a causal LM.

Rows that share a prompt (the G samples of one prompt) share its forward pass: the prompt minus its last token runs
once per distinct prompt with the KV cache on, the cache is indexed out to every row (differentiably: the gradient of
each row flows back into its prompt's single pass), and the rows continue from it with their completions. The logits
are those of the full ``(N, P+T)`` forward, computed on ``U·(P-1) + N·T`` positions instead of ``N·(P+T)``.
When gradient checkpointing is enabled (it turns the KV cache off in training mode) every pass uses the full forward.

With ``fused_head`` the output head never produces logits: it is swapped, for the duration of the forward, for
:class:`FusedHeadLogProbs`, which projects the final hidden states tile by tile (rows x vocabulary slices), folds each
tile into an online log-sum-exp, and recomputes the tiles in the backward pass. The extra memory of log-prob, entropy
and loss is then the gradient of the hidden states plus tiles sized from a fraction of them, instead of a
``(N, T, V)`` logits tensor and its gradient.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_grpo.algorithms import entropy_from_logits, selective_logprobs
from lightning_grpo.rollout.batch import Rollout

__all__ = [
    "FusedHeadLogProbs",
    "TokenLogProbs",
    "completion_logits",
    "completion_logprobs",
    "fused_head_supported",
    "position_ids_from_mask",
]


@dataclass(frozen=True)
class TokenLogProbs:
    """Log-probs ``(N, T)`` of the completion tokens and, when asked, the entropy ``(N, T)`` at those positions."""

    logprobs: Tensor
    entropy: Tensor | None = None


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

    Returns:
        :class:`TokenLogProbs` with ``(N, T)`` float32 tensors.
    """
    if fused_head and fused_head_supported(model):
        head_settings = (temperature, chunk_size, with_entropy, entropy_grad)
        with _fused_output_head(model, rollout.completion_ids, *head_settings) as result:
            _run_model(model, rollout, share_prompt)
        return TokenLogProbs(result["logprobs"], result.get("entropy"))
    logits = completion_logits(model, rollout, share_prompt=share_prompt)  # (N, T, V)
    logprobs = selective_logprobs(logits, rollout.completion_ids, temperature=temperature, chunk_size=chunk_size)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = entropy_from_logits(logits, temperature=temperature, chunk_size=chunk_size) if with_entropy else None
    return TokenLogProbs(logprobs, entropy)


def completion_logits(model: nn.Module, rollout: Rollout, *, share_prompt: bool = True) -> Tensor:
    """``(N, T, V)`` logits in the model's dtype: position t predicts completion token t.

    Args:
        model: Causal LM.
        rollout: The samples.
        share_prompt: Run each distinct prompt once (see the module docstring).
    """
    logits = _run_model(model, rollout, share_prompt)
    return logits[:, : rollout.completion_ids.shape[1]]


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
    cache = prefix.past_key_values
    cache.batch_select_indices(inverse)  # (U, ...) -> (N, ...); indexing is differentiable
    inputs = torch.cat([rollout.prompt_ids[:, -1:], rollout.completion_ids[:, :-1]], dim=1)  # (N, T)
    output = model(
        input_ids=inputs,
        attention_mask=mask,
        position_ids=positions[:, p - 1 :],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=t,
    )
    return output.logits


def _distinct_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
    """The first row of each distinct (prompt, mask) ``(U,)`` and the distinct prompt of every row ``(N,)``."""
    _, inverse = torch.unique(torch.cat([prompt_ids, prompt_mask.long()], dim=1), dim=0, return_inverse=True)
    rows = torch.arange(len(inverse), device=inverse.device)
    first = torch.full((int(inverse.max()) + 1,), len(inverse), device=inverse.device, dtype=torch.long)
    return first.scatter_reduce(0, inverse, rows, reduce="amin"), inverse


def _checkpointing(model: nn.Module) -> bool:
    """Gradient checkpointing is enabled (a layer has ``gradient_checkpointing`` set), whatever the mode.

    Every pass then takes the full forward, so the update, old and reference log-probs of a row come from the same
    computation (another path differs in the last bits, which Adam turns into a visible step where a gradient is 0).
    """
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


# ---------------------------------------------------------------- the fused output head

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
    model: nn.Module, targets: Tensor, temperature: float, chunk_size: int, with_entropy: bool, entropy_grad: bool
) -> Iterator[dict[str, Tensor]]:
    """Swap the head's forward for :class:`FusedHeadLogProbs` on the ``T`` positions that predict ``targets``."""
    head, result = model.get_output_embeddings(), {}

    def forward(hidden: Tensor) -> Tensor:  # (N, T or T+1, H)
        hidden = hidden[:, : targets.shape[1]]
        logprobs, entropy = FusedHeadLogProbs.apply(
            hidden, head.weight, head.bias, targets, temperature, chunk_size, with_entropy
        )
        result["logprobs"] = logprobs
        if with_entropy:
            result["entropy"] = entropy if entropy_grad and torch.is_grad_enabled() else entropy.detach()
        return logprobs[..., None]

    with _head_forward(model, forward):
        yield result


def _blocks(n: int, t: int, rows: int) -> list[tuple[slice, slice]]:
    """``(sequences, positions)`` blocks of about ``rows`` rows of an ``(n, t)`` grid.

    Whole sequences when ``rows >= t``, else slices of one sequence; each block is a small copy of a strided view.
    """
    if rows >= t:
        step = rows // t
        return [(slice(i, min(i + step, n)), slice(0, t)) for i in range(0, n, step)]
    return [(slice(i, i + 1), slice(j, min(j + rows, t))) for i in range(n) for j in range(0, t, rows)]


def _tiles(rows: int, hidden_size: int, vocab: int, itemsize: int, chunk_size: int) -> tuple[int, int]:
    """Tile shape ``(rows, vocabulary slice)`` sized from the bytes ``S`` of the hidden states.

    A float32 tile holds about ``S / 8`` bytes (within [256 KiB, 64 MiB]) and a block's float32 gradient accumulator
    at most ``S / 8``, so the two or three tile-sized temporaries and the accumulator stay well under ``S``.
    """
    budget = rows * hidden_size * itemsize // 8
    elements = min(max(budget, 1 << 18), 1 << 26) // 4
    block = max(1, min(rows, chunk_size, max(16, budget // (hidden_size * 4))))
    return block, min(vocab, max(256, elements // block))


class FusedHeadLogProbs(torch.autograd.Function):
    """``log_softmax((hidden @ W.T + b) / T)[target]`` and the entropy, without materialising the logits.

    Forward: per tile, project, scale, and fold into a running max, ``Σ exp`` and ``Σ exp·x`` (online log-sum-exp);
    the target's logit is read in the tile that holds it. Backward: recompute each tile, form
    ``∂/∂x = g_lp·(onehot − p) − g_H·p·(x − E_p[x])`` and multiply back through ``W`` (and into ``W``, ``b`` only if
    they require grad). The hidden states' gradient is accumulated in float32 per block of rows.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, with_entropy):  # type: ignore[override]
        n, t, h = hidden.shape
        rows, width = _tiles(n * t, h, weight.shape[0], hidden.element_size(), chunk_size)
        lse = torch.empty(n, t, device=hidden.device, dtype=torch.float32)
        target, mean_x = torch.empty_like(lse), torch.empty_like(lse)
        for seqs, pos in _blocks(n, t, rows):
            x_rows = hidden[seqs, pos].reshape(-1, h)
            ids = targets[seqs, pos].reshape(-1)
            folded = _fold(x_rows, weight, bias, ids, temperature, width)
            for out, value in zip((lse, target, mean_x), folded, strict=True):
                out[seqs, pos] = value.view(out[seqs, pos].shape)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, mean_x)
        ctx.settings = (temperature, rows, width)
        ctx.set_materialize_grads(False)
        entropy = lse - mean_x if with_entropy else torch.zeros_like(lse)
        return target - lse, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):  # type: ignore[override]
        hidden, weight, bias, targets, lse, mean_x = ctx.saved_tensors
        temperature, rows, width = ctx.settings
        n, t, h = hidden.shape
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grads = {
            "weight": torch.zeros_like(weight, dtype=torch.float32) if need_w else None,
            "bias": torch.zeros_like(bias, dtype=torch.float32) if need_b and bias is not None else None,
        }
        for seqs, pos in _blocks(n, t, rows):
            pick = lambda x: None if x is None else x[seqs, pos].reshape(-1).float()  # noqa: B023, E731
            x_rows = hidden[seqs, pos].reshape(-1, h)
            stats = (targets[seqs, pos].reshape(-1), pick(lse), pick(mean_x), pick(grad_logprobs), pick(grad_entropy))
            acc = _unfold(x_rows, weight, bias, stats, temperature, width, grads)
            if grad_h is not None:
                grad_h[seqs, pos] = acc.to(hidden.dtype).view(grad_h[seqs, pos].shape)
        cast = lambda g, like: None if g is None else g.to(like.dtype)  # noqa: E731
        return grad_h, cast(grads["weight"], weight), cast(grads["bias"], bias), None, None, None, None


def _logits(x_rows: Tensor, weight: Tensor, bias: Tensor | None, v0: int, width: int, temperature: float) -> Tensor:
    """One float32 tile ``(x W[v0:v0+width].T + b) / T`` (projected in the model's dtype, as ``lm_head`` does)."""
    tile = x_rows @ weight[v0 : v0 + width].t()
    if bias is not None:
        tile += bias[v0 : v0 + width]
    return tile.float().div_(temperature) if tile.dtype != torch.float32 else tile.div_(temperature)


def _fold(
    x_rows: Tensor, weight: Tensor, bias: Tensor | None, ids: Tensor, temperature: float, width: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Online log-sum-exp over vocabulary slices: ``(lse, target logit, E_p[x])`` per row, float32."""
    r, device = len(x_rows), x_rows.device
    peak = torch.full((r,), float("-inf"), device=device)
    total, weighted, target = (torch.zeros(r, device=device) for _ in range(3))
    for v0 in range(0, weight.shape[0], width):
        x = _logits(x_rows, weight, bias, v0, width, temperature)  # (r, w)
        inside = (ids >= v0) & (ids < v0 + x.shape[1])
        picked = x.gather(-1, (ids - v0).clamp(0, x.shape[1] - 1)[:, None]).squeeze(-1)
        target = torch.where(inside, picked, target)
        new_peak = torch.maximum(peak, x.amax(-1))
        scale = torch.exp(peak - new_peak)
        e = (x - new_peak[:, None]).exp_()
        total = total * scale + e.sum(-1)
        weighted = weighted * scale + e.mul_(x).sum(-1)
        peak = new_peak
    return peak + total.log(), target, weighted / total


def _unfold(
    x_rows: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stats: tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None],
    temperature: float,
    width: int,
    grads: dict[str, Tensor | None],
) -> Tensor:
    """Backward of one block: the float32 gradient of ``x_rows``; adds into ``grads["weight"]``/``["bias"]``.

    ``∂/∂x = g_lp·onehot − p·(g_lp + g_H·(x − E_p[x]))``, then divided by the temperature.
    """
    ids, lse, mean_x, g_lp, g_ent = stats
    g_lp = torch.zeros_like(lse) if g_lp is None else g_lp
    acc = torch.zeros(x_rows.shape, device=x_rows.device, dtype=torch.float32)
    for v0 in range(0, weight.shape[0], width):
        x = _logits(x_rows, weight, bias, v0, width, temperature)
        p = (x - lse[:, None]).exp_()
        if g_ent is None:
            d = p.mul_(-g_lp[:, None])
        else:
            d = p.mul_(x.sub_(mean_x[:, None]).mul_(g_ent[:, None]).add_(g_lp[:, None])).neg_()
        inside = ((ids >= v0) & (ids < v0 + x.shape[1])).nonzero().squeeze(-1)
        d[inside, ids[inside] - v0] += g_lp[inside]
        d = d.div_(temperature).to(weight.dtype)
        acc += d @ weight[v0 : v0 + x.shape[1]]
        if grads["weight"] is not None:
            grads["weight"][v0 : v0 + x.shape[1]] += d.t() @ x_rows
        if grads["bias"] is not None:
            grads["bias"][v0 : v0 + x.shape[1]] += d.float().sum(0)
    return acc
