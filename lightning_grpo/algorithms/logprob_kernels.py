"""Memory-lean per-token log-probs and entropy from logits.

A ``(N, T, V)`` float32 log-softmax is never materialised: rows are processed in chunks, the normaliser
(``logsumexp``) is computed in float32 whatever the logits' dtype, and the backward pass recomputes each chunk's
softmax instead of keeping it. The only full-size tensor besides the logits themselves is their gradient, in the
logits' own dtype. With a 152k vocabulary and 1,024 completion tokens this keeps the extra memory of log-prob and
entropy computation within a small multiple of the final hidden states.

:func:`kept_log_mass` replays a sampler's kept set (top-k, top-p, min-p) on the logits from the margins it recorded.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KEPT_SLACK", "entropy_from_logits", "kept_log_mass", "kept_threshold", "selective_logprobs"]

#: Default number of (sequence, position) rows processed at once.
DEFAULT_CHUNK_SIZE = 1024

#: Relative slack of the kept-set threshold (:func:`kept_threshold`), so that another kernel or accumulation order
#: never drops the token the sampler kept at its boundary: measured float32 gaps between samplers and the trainer's
#: forward on CPU reach 5.2e-6 (vLLM against Hugging Face, |z| up to 5) and 1.9e-6 (two forwards of other batch
#: shapes), so 1e-4·max(1, |z|) leaves a factor of 20. A bfloat16 sampler differs by far more (not measured here).
KEPT_SLACK = 1e-4


def _check(logits: Tensor, temperature: float, chunk_size: int) -> None:
    if logits.ndim < 2:
        raise ValueError(f"logits must be (..., V); got shape {tuple(logits.shape)}")
    if not torch.is_floating_point(logits):
        raise TypeError(f"logits must be floating point, got dtype {logits.dtype}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


def _chunks(num_rows: int, chunk_size: int) -> list[slice]:
    return [slice(i, min(i + chunk_size, num_rows)) for i in range(0, num_rows, chunk_size)]


class _SelectiveLogProb(torch.autograd.Function):
    """``log_softmax(x / temperature)[y]`` per row; backward ``(onehot(y) - softmax) / temperature``, recomputed."""

    @staticmethod
    def forward(ctx, logits: Tensor, ids: Tensor, temperature: float, chunk_size: int) -> Tensor:
        out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)  # (R,)
        lse = torch.empty_like(out)
        for rows in _chunks(logits.shape[0], chunk_size):
            x = logits[rows].float() / temperature  # (r, V) float32, one chunk only
            lse[rows] = torch.logsumexp(x, dim=-1)
            out[rows] = x.gather(-1, ids[rows, None]).squeeze(-1) - lse[rows]
        ctx.save_for_backward(logits, ids, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, None, None, None]:
        logits, ids, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for rows in _chunks(logits.shape[0], ctx.chunk_size):
            p = torch.exp(logits[rows].float() / ctx.temperature - lse[rows, None])  # (r, V) softmax
            g = -p * grad_out[rows, None]
            g.scatter_add_(-1, ids[rows, None], grad_out[rows, None])
            grad[rows] = (g / ctx.temperature).to(grad.dtype)
        return grad, None, None, None


class _Entropy(torch.autograd.Function):
    """``H = logsumexp(x) - sum(p * x)`` with ``x = logits / temperature``; ``dH/dx = -p * (x - E_p[x])``."""

    @staticmethod
    def forward(ctx, logits: Tensor, temperature: float, chunk_size: int) -> Tensor:
        out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        for rows in _chunks(logits.shape[0], chunk_size):
            x = logits[rows].float() / temperature
            p = torch.softmax(x, dim=-1)
            out[rows] = torch.logsumexp(x, dim=-1) - (p * x).sum(-1)
        ctx.save_for_backward(logits)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, None, None]:
        (logits,) = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for rows in _chunks(logits.shape[0], ctx.chunk_size):
            x = logits[rows].float() / ctx.temperature
            p = torch.softmax(x, dim=-1)
            expected = (p * x).sum(-1, keepdim=True)
            grad[rows] = (-p * (x - expected) * grad_out[rows, None] / ctx.temperature).to(grad.dtype)
        return grad, None, None


def selective_logprobs(
    logits: Tensor, token_ids: Tensor, *, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Tensor:
    """Log-probability of each chosen token under ``softmax(logits / temperature)``.

    Args:
        logits: ``(..., V)`` logits in any floating dtype (e.g. ``(N, T, V)`` bfloat16).
        token_ids: ``(...)`` chosen token ids, the shape of ``logits`` without the vocabulary dimension.
        temperature: Sampling temperature; the log-probs are of the distribution that was sampled from.
        chunk_size: Rows (positions) processed at once; trades peak memory for kernel launches.

    Returns:
        float32 log-probs of shape ``token_ids.shape``, differentiable with respect to ``logits``.

    Raises:
        ValueError: Shapes do not match, or a non-positive ``temperature`` / ``chunk_size``.

    Example::

        >>> logits = torch.tensor([[[0.0, 0.0]]])
        >>> selective_logprobs(logits, torch.tensor([[1]]))  # log(1/2)
        tensor([[-0.6931]])
    """
    _check(logits, temperature, chunk_size)
    if tuple(token_ids.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"token_ids shape {tuple(token_ids.shape)} must equal logits shape without the vocabulary "
            f"dimension {tuple(logits.shape[:-1])}"
        )
    flat = _SelectiveLogProb.apply(
        logits.reshape(-1, logits.shape[-1]), token_ids.reshape(-1).long(), temperature, chunk_size
    )
    return flat.view(token_ids.shape)


def entropy_from_logits(logits: Tensor, *, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """Entropy of ``softmax(logits / temperature)`` at every position, computed in float32 chunks.

    Args:
        logits: ``(..., V)`` logits in any floating dtype.
        temperature: Sampling temperature.
        chunk_size: Rows (positions) processed at once.

    Returns:
        float32 entropy of shape ``logits.shape[:-1]``; differentiable, but call it under ``torch.no_grad()`` when
        the entropy is only logged (no entropy bonus) to skip the backward bookkeeping.

    Example::

        >>> entropy_from_logits(torch.zeros(1, 1, 4))  # uniform over 4: log 4
        tensor([[1.3863]])
    """
    _check(logits, temperature, chunk_size)
    flat = _Entropy.apply(logits.reshape(-1, logits.shape[-1]), temperature, chunk_size)
    return flat.view(logits.shape[:-1])


def kept_threshold(target: Tensor, margins: Tensor) -> Tensor:
    """Smallest scaled logit of the kept set replayed from a margin: ``z[t] - m - KEPT_SLACK·max(1, |z[t]|)``.

    Args:
        target: The sampled token's scaled logit ``z[t] = logit[t] / temperature`` (float32).
        margins: ``z[t] - min_{v in S} z[v]`` as the sampler recorded it (``>= 0``; ``inf``: the whole vocabulary).

    Returns:
        The threshold, the shape of ``target``: ``S = {v : z[v] >= threshold}`` (``-inf`` where the margin is
        ``inf``). The sampled token is added to ``S`` whatever the threshold by the callers.
    """
    slack = KEPT_SLACK * target.abs().clamp(min=1.0)
    return target - margins.to(target.dtype) - slack


def kept_log_mass(
    logits: Tensor,
    token_ids: Tensor,
    margins: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:
    """``log Σ_{v ∈ S} softmax(logits / temperature)[v]`` per position, ``S`` the kept set replayed from ``margins``.

    ``S = {v : z[v] >= kept_threshold(z[t], m)} ∪ {t}`` with ``z = logits / temperature`` and ``t`` the token of
    ``token_ids``; the value is ``<= 0`` and exactly 0 where the margin is ``inf``. Detached (no gradient), computed
    in float32 chunks like :func:`selective_logprobs`.

    Args:
        logits: ``(..., V)`` logits in any floating dtype.
        token_ids: ``(...)`` the sampled tokens.
        margins: ``(...)`` float margins (``Rollout.kept_margins``).
        temperature: Sampling temperature.
        chunk_size: Rows (positions) processed at once.

    Returns:
        float32 ``(...)``, the shape of ``token_ids``.

    Example::

        >>> logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
        >>> kept_log_mass(logits, torch.tensor([1]), torch.tensor([0.0])).exp()  # S = {0, 1}
        tensor([0.8000])
    """
    _check(logits, temperature, chunk_size)
    if tuple(token_ids.shape) != tuple(logits.shape[:-1]) or token_ids.shape != margins.shape:
        raise ValueError(
            f"token_ids {tuple(token_ids.shape)} and margins {tuple(margins.shape)} must equal logits shape without "
            f"the vocabulary dimension {tuple(logits.shape[:-1])}"
        )
    flat, ids, m = logits.detach().reshape(-1, logits.shape[-1]), token_ids.reshape(-1, 1).long(), margins.reshape(-1)
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        for rows in _chunks(flat.shape[0], chunk_size):
            x = flat[rows].float() / temperature  # (r, V)
            keep = x >= kept_threshold(x.gather(-1, ids[rows]), m[rows, None])
            keep.scatter_(-1, ids[rows], True)
            lse = torch.logsumexp(x, -1)
            kept = torch.logsumexp(x.masked_fill_(~keep, float("-inf")), -1) - lse
            out[rows] = torch.where(m[rows].isinf(), 0.0, kept.clamp(max=0.0))
    return out.view(token_ids.shape)
