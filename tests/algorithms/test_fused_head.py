"""The fused output head alone (pure torch): values and gradients equal those through explicit logits."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.algorithms import entropy_from_logits, fused_head_logprobs, selective_logprobs
from lightning_grpo.algorithms.fused_head import _blocks, tile_shape


def _explicit(hidden, weight, bias, targets, temperature):
    logits = hidden @ weight.t() + (0 if bias is None else bias)
    return selective_logprobs(logits, targets, temperature=temperature), entropy_from_logits(
        logits, temperature=temperature
    )


def _values_and_grads(compute, hidden, weight, bias, targets, g_lp, g_ent):
    logprobs, entropy = compute(hidden, weight, bias, targets, 0.7)
    ((logprobs * g_lp).sum() + (entropy * g_ent).sum()).backward()
    leaves = [x for x in (hidden, weight, bias) if x is not None]
    result = [logprobs.detach(), entropy.detach(), *(x.grad.clone() for x in leaves)]
    for x in leaves:
        x.grad = None
    return result


def _fused(chunk_size):
    def compute(hidden, weight, bias, targets, temperature):
        return fused_head_logprobs(
            hidden, weight, bias, targets, temperature=temperature, chunk_size=chunk_size, with_entropy=True
        )

    return compute


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("chunk_size", [1, 4, 1024])  # sliced sequences, several whole sequences, one block
def test_values_and_gradients_equal_explicit_logits(dtype, with_bias, chunk_size):
    generator = torch.Generator().manual_seed(0)
    n, t, h, v = 3, 7, 16, 1000
    hidden = torch.randn(n, t + 1, h, generator=generator).to(dtype)[:, :t].requires_grad_()  # a strided view
    weight = torch.randn(v, h, generator=generator).to(dtype).requires_grad_()
    bias = torch.randn(v, generator=generator).to(dtype).requires_grad_() if with_bias else None
    targets = torch.randint(v, (n, t), generator=generator)
    g_lp, g_ent = torch.randn(n, t, generator=generator), torch.randn(n, t, generator=generator)
    args = (hidden, weight, bias, targets, g_lp, g_ent)
    got = _values_and_grads(_fused(chunk_size), *args)
    want = _values_and_grads(_explicit, *args)
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.05, "rtol": 0.02}
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.float(), b.float(), **tolerance)


def test_frozen_weight_gets_no_gradient_and_entropy_off_is_zero():
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    weight, targets = torch.randn(300, 8), torch.randint(300, (2, 5))
    logprobs, entropy = fused_head_logprobs(hidden, weight, None, targets)
    logprobs.sum().backward()
    assert weight.grad is None and hidden.grad is not None
    assert torch.equal(entropy, torch.zeros(2, 5))
    assert (logprobs <= 0).all()


def test_blocks_cover_every_position_once():
    for n, t, rows in [(3, 7, 4), (3, 7, 7), (3, 7, 15), (5, 2, 1), (1, 9, 100)]:
        seen = torch.zeros(n, t, dtype=torch.long)
        for seqs, pos in _blocks(n, t, rows):
            seen[seqs, pos] += 1
            assert seen[seqs, pos].numel() <= max(rows, t)
        assert (seen == 1).all(), (n, t, rows)


def test_tiles_stay_within_their_bounds():
    rows, width = tile_shape(rows=4096, hidden_size=896, vocab=151_936, itemsize=2, chunk_size=1024)
    assert 1 <= rows <= 1024 and 256 <= width <= 151_936
    assert rows * width * 4 <= 64 * 2**20  # a float32 tile is at most 64 MiB
    assert tile_shape(rows=3, hidden_size=8, vocab=100, itemsize=4, chunk_size=1024) == (3, 100)  # never past the vocab


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"chunk_size": 0}, "chunk_size must be >= 1"),
        ({"targets": torch.zeros(2, 4, dtype=torch.long)}, r"need hidden \(N, T, H\)"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    args = {"hidden": torch.randn(2, 3, 8), "weight": torch.randn(50, 8), "bias": None}
    args["targets"] = kwargs.pop("targets", torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=message):
        fused_head_logprobs(**args, **kwargs)
