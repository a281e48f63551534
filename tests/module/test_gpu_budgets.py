"""Host syncs and kernel counts of the hot paths, held to the budgets of docs/benchmarks.md ("GPU readiness").

A GPU runs a kernel per ATen call and stalls the host at every sync; a CPU shows neither, so the suite counts them
(:class:`~lightning_grpo.testing.dispatch.DispatchCounter`). The fused head is counted at the Qwen2.5-0.5B recipe's
micro-batch on the ``meta`` device (shapes only), the rest on the tiny model.
"""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.algorithms.fused_head import FusedHeadLogProbs
from lightning_grpo.iteration import LossCounts
from lightning_grpo.iteration.context import IterationContext
from lightning_grpo.iteration.nonfinite import gradient_flag, step_is_finite
from lightning_grpo.rollout.decode import decode_loop
from lightning_grpo.rollout.generation import tokenize_prompts
from lightning_grpo.rollout.sampling_settings import SamplingSettings, eos_token_ids
from lightning_grpo.testing import build_tiny_model
from lightning_grpo.testing.dispatch import DispatchCounter
from tests.conftest import count_a, tiny_sampling
from tests.module.helpers import fixed_rollout

# The budgets (docs/benchmarks.md, "GPU readiness"): before this work the head's forward was 2,720 tiles and 76,533
# ATen calls at this shape, and its backward synced once per tile.
HEAD_TILES, HEAD_CALLS = 16, 2_000
MICRO_BATCH_SYNCS, MICRO_BATCH_CALLS = 2, 1_200
SCORE_SYNCS = 4


def _head_pass(tile_bytes=None):
    """Forward and backward of the fused head at the 0.5B recipe's micro-batch (16 x 512, hidden 896, V 151,936)."""
    hidden = torch.empty(16, 512, 896, device="meta", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.empty(151_936, 896, device="meta", dtype=torch.bfloat16)
    targets = torch.zeros(16, 512, dtype=torch.long, device="meta")
    with DispatchCounter() as forward:
        logprobs, entropy = FusedHeadLogProbs.apply(hidden, weight, None, targets, 1.0, 1024, True, tile_bytes)
    with DispatchCounter() as backward:
        (logprobs.sum() + entropy.sum()).backward()
    return forward, backward


def test_fused_head_on_a_gpu_is_a_few_tiles_without_syncs():
    forward, backward = _head_pass()  # meta, like CUDA, is sized by ACCELERATOR_TILE_BYTES
    assert forward.ops["aten.mm.default"] <= HEAD_TILES  # one projection per tile
    assert forward.calls <= HEAD_CALLS and backward.calls <= HEAD_CALLS
    assert forward.syncs == 0 and backward.syncs == 0
    assert backward.ops["aten.mm.default"] == 2 * forward.ops["aten.mm.default"]  # recompute + gradient per tile


def test_a_smaller_tile_setting_means_more_tiles():
    forward, _ = _head_pass(tile_bytes=64 * 2**20)
    assert forward.ops["aten.mm.default"] > HEAD_TILES


def test_fused_head_backward_on_cpu_tiles_has_no_sync():
    hidden = torch.randn(4, 256, 64, requires_grad=True)  # the CPU sizing: 128 tiles of 64 rows x 512 tokens
    weight, targets = torch.randn(8192, 64), torch.randint(8192, (4, 256))
    logprobs, entropy = FusedHeadLogProbs.apply(hidden, weight, None, targets, 1.0, 1024, True, None)
    with DispatchCounter() as backward:
        (logprobs.sum() + entropy.sum()).backward()
    assert backward.ops["aten.mm.default"] >= 128 and backward.syncs == 0


@pytest.fixture
def rollout_of(tokenizer):
    def build(copies: int):
        prompts = ["1+1=", "1+1=", "2+3=", "2+3="] * copies
        return fixed_rollout(tokenizer, prompts, ["aab", "b...", "aaaa", "ba"] * copies, group_size=2)

    return build


def test_score_syncs_do_not_grow_with_the_rows(make_module, rollout_of):
    module = make_module([count_a], sampling=tiny_sampling(num_generations=2))
    counts = []
    for copies in (1, 8):
        with DispatchCounter() as counter:
            module.score(rollout_of(copies))
        counts.append(counter.syncs)
    assert counts[0] == counts[1] <= SCORE_SYNCS


def test_one_micro_batch_update(make_module, rollout_of):
    module = make_module([count_a], sampling=tiny_sampling(num_generations=2))
    rollout = rollout_of(2)
    batch = module.prepare_update(rollout, torch.linspace(-1, 1, len(rollout)))
    counts = LossCounts.of(batch.loss_mask, 6.0, lambda value: value)
    with DispatchCounter() as forward:
        loss, _ = module.compute_loss(batch, counts)
    with DispatchCounter() as backward:
        loss.backward()
    # forward: unique's output size (the distinct prompts) and transformers' padding-mask check of the prompt pass
    assert forward.syncs <= MICRO_BATCH_SYNCS and backward.syncs == 0
    assert forward.calls <= MICRO_BATCH_CALLS and backward.calls <= MICRO_BATCH_CALLS


def test_the_finite_check_syncs_once_per_optimizer_step(make_module):
    module = make_module([count_a])
    for parameter in module.policy.parameters():
        if parameter.requires_grad:
            parameter.grad = torch.ones_like(parameter)
    context = IterationContext(device=torch.device("cpu"), global_step=0, seed=0, grad_scale=1.0,
                          sum_across_ranks=lambda value: value, log=lambda *a, **k: None, timer=None,
                          warned=set(), skipped=[])  # fmt: skip
    with DispatchCounter() as counter:
        flags = torch.cat([torch.zeros(4), gradient_flag(module.policy.parameters(), torch.device("cpu"))])
        assert step_is_finite(context, flags, on_nonfinite="stop", max_skipped=0)
    assert counter.syncs == 1
    assert sum(p.requires_grad for p in module.policy.parameters()) > 8  # one sync per parameter before


@pytest.mark.parametrize("drop_finished", [False, True])
def test_our_decode_loop_syncs_once_per_token(tokenizer, drop_finished):
    model = build_tiny_model(tokenizer).eval()
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, ["1+1=", "12+3="], 16, torch.device("cpu"))
    settings = SamplingSettings(num_generations=4, max_new_tokens=12, sampler="inverse_cdf",
                                drop_finished=drop_finished)  # fmt: skip
    torch.manual_seed(0)
    with torch.no_grad(), DispatchCounter() as counter:
        decode_loop(model, prompt_ids, prompt_mask, settings, eos_token_ids(tokenizer), tokenizer.pad_token_id)
    # ours: one per token; transformers' padding-mask check: one per model call (the prefill and each token)
    assert counter.syncs <= 2 * settings.max_new_tokens + 1
    assert counter.sync_ops.keys() == {"aten._local_scalar_dense.default"}
