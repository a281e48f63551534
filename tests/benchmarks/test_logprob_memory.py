"""Extra memory of log-prob + loss computation, measured on CPU.

Claim: with a 152k vocabulary and 1,024 completion tokens, the extra memory of log-prob + loss computation stays
within 2x the final hidden-state tensor. Checked here on a scaled shape (vocabulary /16, width /2, tokens /4, 8
sequences): the fused head sizes its tiles from the hidden states' bytes, so the ratio carries over (the full shape is
measured in docs/benchmarks.md).

Measurement (:func:`benchmarks.measure.profiled_peak_bytes`): PyTorch's memory profiler (``profile_memory=True`` +
``record_shapes`` + ``with_stack``) records every tensor allocation and free of the measured block on CPU; replaying
its timeline (``_memory_profile().timeline``: CREATE adds the bytes, DESTROY removes them; tensors that existed before
the block are not counted) gives the peak of the bytes the block itself held at once. That peak includes every
temporary, the tensors saved for backward that the block created, and the gradients the backward allocates.
``tracemalloc`` cannot see torch's allocator and ``ru_maxrss`` is too coarse at these sizes, hence the profiler.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.measure import profiled_peak_bytes
from lightning_grpo.algorithms import FusedHeadLogProbs, entropy_from_logits, selective_logprobs

pytest.importorskip("torch.profiler._memory_profiler")

VOCAB, HIDDEN, SEQUENCES, TOKENS = 151_936 // 16, 896 // 2, 8, 1024 // 4


peak_bytes = profiled_peak_bytes


def _inputs(sequences: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(sequences, TOKENS, HIDDEN, generator=generator).requires_grad_()  # final hidden states
    weight = torch.randn(VOCAB, HIDDEN, generator=generator) / HIDDEN**0.5  # the frozen output head
    targets = torch.randint(VOCAB, (sequences, TOKENS), generator=generator)
    mask = (torch.rand(sequences, TOKENS, generator=generator) > 0.1).float()
    return hidden, weight, targets, mask


def test_profiler_peak_counts_what_a_block_allocates():
    def block():
        a = torch.empty(1000, 1000)  # 4 MB
        b = torch.empty(500, 1000)  # 2 MB: 6 MB held at once
        del a
        c = torch.empty(250, 1000)  # 1 MB while 2 MB are held
        del b, c

    assert peak_bytes(block) == 6_000_000


def test_fused_head_extra_memory_is_within_twice_the_hidden_states():
    """Forward (log-probs and entropy), token-mean loss and backward through the fused head: no logits exist."""
    hidden, weight, targets, mask = _inputs(SEQUENCES)

    def block():
        logprobs, entropy = FusedHeadLogProbs.apply(hidden, weight, None, targets, 0.7, 1024, True)
        loss = -(logprobs * mask).sum() / mask.sum()  # token-mean of the policy-gradient term at ratio 1
        loss.backward()
        del logprobs, entropy, loss

    extra = peak_bytes(block)
    logits_bytes = SEQUENCES * TOKENS * VOCAB * 4  # what an unfused float32 log-softmax would hold, once
    assert extra <= 2 * hidden.nbytes, f"extra {extra / hidden.nbytes:.2f}x the hidden states"
    assert extra < logits_bytes / 8
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all()


def test_chunked_logprobs_hold_no_full_float32_copy_of_the_logits():
    """On materialised (bfloat16) logits: beyond their own gradient, only chunk-sized temporaries, whatever N*T."""
    chunk = 64
    extras = []
    for sequences in (2, 4):
        logits = torch.randn(sequences, TOKENS, VOCAB, dtype=torch.bfloat16).requires_grad_()
        targets = torch.randint(VOCAB, (sequences, TOKENS))

        def block(logits=logits, targets=targets):
            logprobs = selective_logprobs(logits, targets, temperature=0.7, chunk_size=chunk)
            with torch.no_grad():  # logged only: no entropy graph
                entropy_from_logits(logits, temperature=0.7, chunk_size=chunk)
            logprobs.mean().backward()

        extras.append(peak_bytes(block) - logits.nbytes)  # the gradient (logits' dtype) is the one full-size tensor
    chunk_temporaries = 4 * chunk * VOCAB * 4  # a few float32 (chunk, V) tiles
    assert max(extras) <= chunk_temporaries + 64 * 2 * TOKENS * 4  # + a few float32 (N*T,) vectors
    assert extras[1] - extras[0] < 0.05 * 2 * TOKENS * VOCAB * 2  # doubling N*T adds no logits-sized tensor


@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_entropy_has_a_graph_only_with_an_entropy_bonus(entropy_coef):
    from lightning_grpo.rollout.logprobs import _fused_output_head

    hidden, weight, targets, _ = _inputs(1)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    head.weight.data.copy_(weight)
    head.weight.requires_grad_(False)
    model = torch.nn.Module()
    model.get_output_embeddings = lambda: head
    with _fused_output_head(model, targets, 1.0, 1024, True, entropy_coef > 0) as result:
        head(hidden)
    assert result["logprobs"].requires_grad
    assert result["entropy"].requires_grad == (entropy_coef > 0)
