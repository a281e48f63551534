"""The fused output head: per-token log-probs and entropy from the final hidden states, without logits.

``log_softmax((hidden @ W.T + b) / T)[target]`` is computed tile by tile (rows x vocabulary slices): each tile is
projected, scaled and folded into an online log-sum-exp, and recomputed in the backward pass. The extra memory of
log-prob, entropy and loss is then the gradient of the hidden states plus tiles sized from a fraction of them, instead
of a ``(N, T, V)`` logits tensor and its gradient. Pure torch; :mod:`lightning_grpo.rollout.logprobs` swaps it into a
Hugging Face model's output head.

Given the sampler's margins, the forward also folds a masked online log-sum-exp over the kept set (the tokens whose
scaled logit is at least the sampled token's minus its margin, :func:`~lightning_grpo.algorithms.logprob_kernels.
kept_threshold`) in the same tiles: the log of the kept set's probability mass, detached.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_grpo.algorithms.logprob_kernels import kept_threshold

__all__ = ["ACCELERATOR_TILE_BYTES", "FusedHeadLogProbs", "fused_head_logprobs", "tile_shape"]

#: Float32 bytes of one tile on a GPU (any device but the CPU): a few large tiles, since each tile costs about 30
#: kernel launches. 512 MiB holds 883 rows of Qwen2.5's 151,936-token vocabulary: the 0.5B recipe's micro-batch of
#: 16 x 512 completion positions is 16 tiles (docs/benchmarks.md, "GPU readiness").
ACCELERATOR_TILE_BYTES = 512 * 2**20


def fused_head_logprobs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    tile_bytes: int | None = None,
    margins: Tensor | None = None,
) -> tuple[Tensor, ...]:
    """Log-probs ``(N, T)`` of ``targets`` and the entropy under ``(hidden @ weight.T + bias) / temperature``.

    Equal to :func:`~lightning_grpo.algorithms.selective_logprobs` and
    :func:`~lightning_grpo.algorithms.entropy_from_logits` of the explicit logits (to float32 rounding), with
    gradients into ``hidden`` and, when they require grad, ``weight`` and ``bias``.

    Args:
        hidden: ``(N, T, H)`` final hidden states (any float dtype; may be a strided view).
        weight: ``(V, H)`` output projection.
        bias: ``(V,)`` or ``None``.
        targets: ``(N, T)`` token ids.
        temperature: Logits are divided by it.
        chunk_size: Most rows per tile.
        with_entropy: Compute the entropy; otherwise the second tensor is zeros.
        tile_bytes: Float32 bytes of one tile; ``None``: :data:`ACCELERATOR_TILE_BYTES` off the CPU, and on the CPU
            about an eighth of the hidden states' bytes (see :func:`tile_shape`).
        margins: ``(N, T)`` the sampler's kept-set margins (``Rollout.kept_margins``); with them a third tensor is
            returned, equal to :func:`~lightning_grpo.algorithms.logprob_kernels.kept_log_mass` of the explicit
            logits.

    Returns:
        ``(logprobs, entropy)``, float32; ``(logprobs, entropy, kept_log_mass)`` with ``margins`` (the last one
        detached: ``<= 0``, exactly 0 where the margin is ``inf``).

    Example::

        >>> hidden, weight = torch.randn(2, 3, 8), torch.randn(50, 8)
        >>> targets = torch.randint(50, (2, 3))
        >>> logprobs, _ = fused_head_logprobs(hidden, weight, None, targets)
        >>> explicit = torch.log_softmax(hidden @ weight.T, -1).gather(-1, targets[..., None]).squeeze(-1)
        >>> torch.allclose(logprobs, explicit, atol=1e-5)
        True
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if tile_bytes is not None and tile_bytes < 1:
        raise ValueError(f"tile_bytes must be >= 1 or None, got {tile_bytes}")
    if hidden.ndim != 3 or targets.shape != hidden.shape[:2] or weight.ndim != 2 or weight.shape[1] != hidden.shape[2]:
        raise ValueError(
            f"need hidden (N, T, H), weight (V, H) and targets (N, T); got hidden {tuple(hidden.shape)}, "
            f"weight {tuple(weight.shape)}, targets {tuple(targets.shape)}"
        )
    if margins is not None and margins.shape != targets.shape:
        raise ValueError(f"margins {tuple(margins.shape)} must have the shape of targets {tuple(targets.shape)}")
    settings = (temperature, chunk_size, with_entropy, tile_bytes, margins)
    return FusedHeadLogProbs.apply(hidden, weight, bias, targets, *settings)


def _blocks(n: int, t: int, rows: int) -> list[tuple[slice, slice]]:
    """``(sequences, positions)`` blocks of about ``rows`` rows of an ``(n, t)`` grid.

    Whole sequences when ``rows >= t``, else slices of one sequence; each block is a small copy of a strided view.
    """
    if rows >= t:
        step = rows // t
        return [(slice(i, min(i + step, n)), slice(0, t)) for i in range(0, n, step)]
    return [(slice(i, i + 1), slice(j, min(j + rows, t))) for i in range(n) for j in range(0, t, rows)]


def tile_shape(
    rows: int, hidden_size: int, vocab: int, itemsize: int, chunk_size: int, tile_bytes: int | None = None
) -> tuple[int, int]:
    """Tile shape ``(rows, vocabulary slice)`` of the fused head over ``rows`` positions.

    With ``tile_bytes`` (a GPU): as many rows of the whole vocabulary as ``tile_bytes`` of float32 hold (at most
    ``chunk_size``), so a micro-batch is a few tiles and a few hundred kernel launches. Without (the CPU): sized from
    the bytes ``S`` of the hidden states: a float32 tile holds about ``S / 8`` bytes (within [256 KiB, 64 MiB]) and a
    block's float32 gradient accumulator at most ``S / 8``, so the two or three tile-sized temporaries and the
    accumulator stay well under ``S``.

    Example::

        >>> tile_shape(16 * 512, 896, 151_936, 2, 1024, ACCELERATOR_TILE_BYTES)  # 0.5B recipe on a GPU
        (883, 151936)
        >>> tile_shape(16 * 512, 896, 151_936, 2, 1024)  # the same on the CPU
        (512, 896)
    """
    if tile_bytes is not None:
        elements = max(tile_bytes // 4, 256)
        block = max(1, min(rows, chunk_size, elements // vocab))
    else:
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

    With ``margins`` (a ninth input, ``(N, T)``) the forward returns a third, non-differentiable output: the kept
    set's log mass (see :func:`fused_head_logprobs`); the backward is the same.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, hidden, weight, bias, targets, temperature, chunk_size, with_entropy, tile_bytes=None, margins=None
    ):
        n, t, h = hidden.shape
        tile_bytes = tile_bytes if tile_bytes is not None or hidden.device.type == "cpu" else ACCELERATOR_TILE_BYTES
        rows, width = tile_shape(n * t, h, weight.shape[0], hidden.element_size(), chunk_size, tile_bytes)
        lse = torch.empty(n, t, device=hidden.device, dtype=torch.float32)
        target, mean_x = torch.empty_like(lse), torch.empty_like(lse)
        kept = None if margins is None else torch.empty_like(lse)
        for seqs, pos in _blocks(n, t, rows):
            x_rows = hidden[seqs, pos].reshape(-1, h)
            ids = targets[seqs, pos].reshape(-1)
            block_margins = None if margins is None else margins[seqs, pos].reshape(-1)
            folded = _fold(x_rows, weight, bias, ids, temperature, width, block_margins)
            for out, value in zip((lse, target, mean_x, kept), folded, strict=True):
                if out is not None:
                    out[seqs, pos] = value.view(out[seqs, pos].shape)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, mean_x)
        ctx.settings = (temperature, rows, width)
        ctx.set_materialize_grads(False)
        entropy = lse - mean_x if with_entropy else torch.zeros_like(lse)
        if kept is None:
            return target - lse, entropy
        ctx.mark_non_differentiable(kept)
        return target - lse, entropy, kept

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy, grad_kept=None):  # type: ignore[override]
        hidden, weight, bias, targets, lse, mean_x = ctx.saved_tensors
        temperature, rows, width = ctx.settings
        n, t, h = hidden.shape
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grads = {
            "weight": torch.zeros_like(weight, dtype=torch.promote_types(weight.dtype, torch.float32))
            if need_w
            else None,
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
        return grad_h, cast(grads["weight"], weight), cast(grads["bias"], bias), *(None,) * 6


def _logits(x_rows: Tensor, weight: Tensor, bias: Tensor | None, v0: int, width: int, temperature: float) -> Tensor:
    """One float32 tile ``(x W[v0:v0+width].T + b) / T`` (projected in the model's dtype, as ``lm_head`` does)."""
    tile = x_rows @ weight[v0 : v0 + width].t()
    if bias is not None:
        tile += bias[v0 : v0 + width]
    return tile.float().div_(temperature) if tile.dtype != torch.float32 else tile.div_(temperature)


def _fold(
    x_rows: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    ids: Tensor,
    temperature: float,
    width: int,
    margins: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Online log-sum-exp over vocabulary slices: ``(lse, target logit, E_p[x], kept log mass)`` per row, float32.

    The kept log mass (``None`` without ``margins``) comes from a second, masked online log-sum-exp over the kept set
    ``{v : x[v] >= kept_threshold(z[t], m)} ∪ {t}``, whose threshold needs the target's logit before the first
    tile (:func:`_target_logits`). Its running max starts there, so it is finite from the first tile on.
    """
    r, device = len(x_rows), x_rows.device
    peak = torch.full((r,), float("-inf"), device=device)
    total, weighted, target = (torch.zeros(r, device=device) for _ in range(3))
    if margins is not None:
        kept_peak = _target_logits(x_rows, weight, bias, ids, temperature)
        kept = (kept_threshold(kept_peak, margins), kept_peak, torch.zeros(r, device=device))
    for v0 in range(0, weight.shape[0], width):
        x = _logits(x_rows, weight, bias, v0, width, temperature)  # (r, w)
        inside = (ids >= v0) & (ids < v0 + x.shape[1])
        local = (ids - v0).clamp(0, x.shape[1] - 1)[:, None]
        target = torch.where(inside, x.gather(-1, local).squeeze(-1), target)
        new_peak = torch.maximum(peak, x.amax(-1))
        scale = torch.exp(peak - new_peak)
        e = (x - new_peak[:, None]).exp_()
        total = total * scale + e.sum(-1)
        weighted = weighted * scale + e.mul_(x).sum(-1)
        peak = new_peak
        if margins is not None:
            kept = _fold_kept(x, e, inside, local, kept)
    lse = peak + total.log()
    if margins is None:
        return lse, target, weighted / total, None
    _, kept_peak, kept_total = kept
    kept_mass = (kept_peak + kept_total.log() - lse).clamp(max=0.0)
    return lse, target, weighted / total, torch.where(margins.isinf(), 0.0, kept_mass)


def _target_logits(x_rows: Tensor, weight: Tensor, bias: Tensor | None, ids: Tensor, temperature: float) -> Tensor:
    """``(x · W[t] + b[t]) / T`` per row, float32, projected in the model's dtype as a tile is (a gather of rows)."""
    z = torch.bmm(x_rows[:, None, :], weight[ids][:, :, None]).view(-1)  # (r,)
    if bias is not None:
        z = z + bias[ids]
    return z.float() / temperature


def _fold_kept(
    x: Tensor, buffer: Tensor, inside: Tensor, local: Tensor, kept: tuple[Tensor, Tensor, Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """Fold one tile ``x`` into the kept set's online log-sum-exp ``(threshold, running max, Σ exp)``.

    ``buffer`` is a spent tile-sized float32 temporary (overwritten); the target is kept where its slice is this one.
    """
    threshold, peak, total = kept
    keep = x >= threshold[:, None]
    keep.scatter_(1, local, keep.gather(1, local) | inside[:, None])
    masked = torch.where(keep, x, torch.full((), float("-inf"), device=x.device), out=buffer)
    new_peak = torch.maximum(peak, masked.amax(-1))
    total = total * torch.exp(peak - new_peak) + masked.sub_(new_peak[:, None]).exp_().sum(-1)
    return threshold, new_peak, total


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
    acc = torch.zeros(x_rows.shape, device=x_rows.device, dtype=torch.promote_types(x_rows.dtype, torch.float32))
    for v0 in range(0, weight.shape[0], width):
        x = _logits(x_rows, weight, bias, v0, width, temperature)
        p = (x - lse[:, None]).exp_()
        if g_ent is None:
            d = p.mul_(-g_lp[:, None])
        else:
            d = p.mul_(x.sub_(mean_x[:, None]).mul_(g_ent[:, None]).add_(g_lp[:, None])).neg_()
        inside = (ids >= v0) & (ids < v0 + x.shape[1])  # rows whose target is in this slice; no host sync
        local = (ids - v0).clamp(0, x.shape[1] - 1)[:, None]
        d.scatter_add_(1, local, torch.where(inside, g_lp, 0.0)[:, None])
        d = d.div_(temperature).to(weight.dtype)
        acc += d @ weight[v0 : v0 + x.shape[1]]
        if grads["weight"] is not None:
            grads["weight"][v0 : v0 + x.shape[1]] += d.t() @ x_rows
        if grads["bias"] is not None:
            grads["bias"][v0 : v0 + x.shape[1]] += d.float().sum(0)
    return acc
