"""Plain-loop, float64 references for the policy-loss tests: random inputs and the five loss aggregations.

Nothing here calls the package: the aggregations are written from docs/math.md's definitions, one token at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from lightning_grpo.algorithms import aggregate_loss

MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
NORM = 7.0
F64 = torch.float64


def random_batch(seed: int, per_token_adv: bool, n: int = 6, t: int = 7, spread: float = 0.5) -> dict:
    """Probabilities in (0.02, 0.98), old ones moved by up to ``spread`` in log space, uneven lengths, an empty row."""
    gen = torch.Generator().manual_seed(seed)
    p = 0.02 + 0.96 * torch.rand(n, t, generator=gen, dtype=F64)
    old = (p.log() + spread * (2 * torch.rand(n, t, generator=gen, dtype=F64) - 1)).clamp(max=-1e-3)
    lengths = [int(v) for v in torch.randint(1, t + 1, (n,), generator=gen)]
    lengths[2] = 0  # a row without a valid token
    mask = torch.tensor([[1.0 if j < length else 0.0 for j in range(t)] for length in lengths], dtype=F64)
    adv = 2 * torch.randn((n, t) if per_token_adv else (n,), generator=gen, dtype=F64)
    return {"logprobs": p.log(), "old": old, "mask": mask, "lengths": lengths, "adv": adv}


def advantage(adv: torch.Tensor, i: int, j: int) -> float:
    return float(adv[i, j] if adv.ndim == 2 else adv[i])


def aggregate_loops(values: list[list[torch.Tensor]], mode: str, norm: float = NORM) -> torch.Tensor:
    """Aggregate per-token values (one list per row, valid tokens only) as docs/math.md defines each mode."""
    rows = [row for row in values if row]
    total = sum((v for row in rows for v in row), torch.zeros((), dtype=F64))
    tokens = sum(len(row) for row in rows)
    if mode == "token-mean":
        return total / tokens
    if mode == "token-sum":
        return total
    if mode == "seq-mean-token-mean":
        return sum((sum(row) / len(row) for row in rows), torch.zeros((), dtype=F64)) / len(rows)
    if mode == "seq-mean-token-sum":
        return total / len(rows)
    return total / (len(rows) * norm)


def per_token_loops(batch: dict, lp: torch.Tensor, token: Callable[..., torch.Tensor]) -> list[list[torch.Tensor]]:
    """``token(lp_ij, old_ij, A_ij)`` for every valid token, row by row."""
    old, adv = batch["old"], batch["adv"]
    return [
        [token(lp[i, j], float(old[i, j]), advantage(adv, i, j)) for j in range(length)]
        for i, length in enumerate(batch["lengths"])
    ]


def check_against_loops(batch: dict, ours: Callable, reference: Callable, mode: str) -> None:
    """Value and gradient wrt the log-probs of ``aggregate_loss(ours(lp))`` equal the loop reference's."""
    lp = batch["logprobs"].clone().requires_grad_()
    got = aggregate_loss(ours(lp), batch["mask"], mode, norm=NORM)
    (got_grad,) = torch.autograd.grad(got, lp)
    lp_ref = batch["logprobs"].clone().requires_grad_()
    want = aggregate_loops(reference(lp_ref), mode)
    (want_grad,) = torch.autograd.grad(want, lp_ref, allow_unused=True)
    want_grad = torch.zeros_like(lp_ref) if want_grad is None else want_grad
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-9, atol=1e-9)
    assert float(got_grad.abs().sum()) > 0  # a real gradient was compared


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


def exp(x: float) -> float:
    return math.exp(x)
