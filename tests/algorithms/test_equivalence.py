"""Micro-batch independence of the loss (docs/math.md, global loss normalization and aggregation).

A mini-batch is shuffled and cut into micro-batches of random, uneven sizes. Each micro-batch
loss is aggregated with the *global* counts of the whole mini-batch (num_tokens = Σ M,
num_sequences = number of rows with a valid token, a fixed norm), and backward() accumulates into
a shared parameter. Because every mode is a sum over rows divided by a batch-wide constant,

    Σ_k Σ_{i in k} f_i / C = Σ_i f_i / C,

both the summed values and the accumulated gradients equal those of one whole-batch pass.
Splitting across ranks is the same sum (with the counts all-reduced), so this also covers world
size. Everything is float64, so "equal" means 1e-6 with a wide margin.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lightning_grpo.algorithms import aggregate_loss, compute_advantages, kl_penalty, policy_loss

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
F64 = torch.float64


@st.composite
def mini_batches(draw):
    """A (N, T) mask with varying lengths (some rows fully masked), a shuffle and micro-batch cuts."""
    n = draw(st.integers(1, 9))
    t = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, t), min_size=n, max_size=n))
    assume(sum(lengths) > 0)  # an all-masked mini-batch has no defined token mean
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).to(F64)  # (N, T)
    order = draw(st.permutations(range(n)))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1))) if n > 1 else []
    bounds = [0, *cuts, n]
    micro = [list(order[lo:hi]) for lo, hi in itertools.pairwise(bounds)]
    return {
        "mask": mask,
        "micro": micro,  # row indices of each micro-batch, in shuffled order
        "norm": draw(st.integers(1, 10)),  # e.g. the max completion length of the config
        "counts_as_tensors": draw(st.booleans()),  # all-reduced counts arrive as tensors
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def global_counts(batch: dict) -> dict:
    mask = batch["mask"]
    num_tokens = mask.sum()  # Σ M over the whole mini-batch
    num_sequences = (mask.sum(-1) > 0).sum()  # rows with at least one valid token
    if not batch["counts_as_tensors"]:
        num_tokens, num_sequences = int(num_tokens), int(num_sequences)
    return {"num_tokens": num_tokens, "num_sequences": num_sequences, "norm": batch["norm"]}


def run_split(loss_fn, params, batch, mode):
    """(whole value, whole grads), (Σ micro values, Σ micro grads) with grads accumulated in .grad."""
    n = batch["mask"].shape[0]
    whole = loss_fn(list(range(n)), mode, {"norm": batch["norm"]})  # default counts = the batch's own
    whole_grads = torch.autograd.grad(whole, params)
    counts = global_counts(batch)
    # Passing the whole batch's own counts explicitly changes nothing.
    with_counts = loss_fn(list(range(n)), mode, counts)
    torch.testing.assert_close(with_counts, whole, rtol=1e-12, atol=1e-12)

    total = torch.zeros((), dtype=F64)
    for rows in batch["micro"]:
        loss = loss_fn(rows, mode, counts)
        loss.backward()  # accumulates into p.grad, as manual_backward does per micro-batch
        total = total + loss.detach()
    return (whole.detach(), whole_grads), (total, tuple(p.grad for p in params))


@pytest.mark.parametrize("mode", MODES)
@SETTINGS
@given(batch=mini_batches())
def test_aggregation_is_micro_batch_independent(mode, batch):
    # Per-token loss L = w·x + 0.5·w²·y with w a (T,) leaf shared by all rows (a parameter):
    # non-linear in w, so the gradient sees the per-row weighting, not just the value.
    mask = batch["mask"]
    n, t = mask.shape
    gen = torch.Generator().manual_seed(batch["seed"])
    x = torch.randn(n, t, generator=gen, dtype=F64)
    y = torch.randn(n, t, generator=gen, dtype=F64)
    w = torch.randn(t, generator=gen, dtype=F64).requires_grad_()

    def loss_fn(rows, mode, counts):
        values = w * x[rows] + 0.5 * w**2 * y[rows]  # (n_k, T)
        return aggregate_loss(values, mask[rows], mode, **counts)

    (whole, whole_grads), (total, grads) = run_split(loss_fn, [w], batch, mode)
    torch.testing.assert_close(total, whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads, whole_grads, rtol=1e-6, atol=1e-6)


# clip_cov and kl_cov are left out: they choose tokens from the micro-batch's covariance (verl's behaviour,
# docs/math.md), so other cuts choose other tokens; test_covariance_losses.py checks them on the batch they see.
@pytest.mark.parametrize("kind", ["clip", "gspo", "cispo", "sapo", "gmpo", "dppo_tv", "dppo_kl", "gpg"])
@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=mini_batches(), per_token_adv=st.booleans())
def test_composed_grpo_loss_is_micro_batch_independent(kind, mode, batch, per_token_adv):
    # The training loss: aggregate(policy_loss) + 0.1·aggregate(k3 KL to the reference).
    # logprobs = old + w·x with w a (T,) parameter and x of scale 1, so log-ratios span roughly ±2:
    # both clip branches (and the dual clip) are taken on some tokens, where the gradient is 0.
    # Every per-token term depends only on its own row, so the row-sum argument above applies.
    mask = batch["mask"]
    n, t = mask.shape
    gen = torch.Generator().manual_seed(batch["seed"])
    old = -5 * torch.rand(n, t, generator=gen, dtype=F64) - 0.01  # log-probs of real probabilities (dppo_kl)
    ref = old + 0.5 * torch.randn(n, t, generator=gen, dtype=F64)
    x = torch.randn(n, t, generator=gen, dtype=F64)
    adv = torch.randn((n, t) if per_token_adv else (n,), generator=gen, dtype=F64)
    w = torch.randn(t, generator=gen, dtype=F64).requires_grad_()
    bias = torch.zeros((), dtype=F64, requires_grad=True)  # a second parameter, shared by all tokens

    def loss_fn(rows, mode, counts):
        logprobs = old[rows] + w * x[rows] + bias  # (n_k, T)
        pg, _ = policy_loss(logprobs, old[rows], adv[rows], mask[rows], kind=kind)
        kl = kl_penalty(logprobs, ref[rows], "k3")
        return aggregate_loss(pg, mask[rows], mode, **counts) + 0.1 * aggregate_loss(kl, mask[rows], mode, **counts)

    (whole, whole_grads), (total, grads) = run_split(loss_fn, [w, bias], batch, mode)
    torch.testing.assert_close(total, whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads, whole_grads, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- advantages: 1 rank vs 2 ranks (issue 37)


def _two_ranks(call):
    """``call(rank, sum_across_ranks)`` on two threads whose ``sum_across_ranks`` adds both ranks' tensors (an
    all-reduce, as the module's ``_sum_across_ranks``); returns both ranks' results."""
    import threading

    barrier, slots, results = threading.Barrier(2), [None, None], [None, None]

    def run(rank):
        def all_reduce(tensor):
            slots[rank] = tensor
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()  # both read before either writes again
            return total

        results[rank] = call(rank, all_reduce)

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


@pytest.mark.parametrize(
    ("estimator", "args"),
    [("gdpo", None), ("grpo_passk", None), ("grpo_passk", {"k": 2}), ("opo", None),
     ("reinforce_plus_plus", {"gamma": 0.9}), ("gpg", None), ("gpg", {"alpha": "nonzero"})],
)  # fmt: skip
@pytest.mark.parametrize("seed", range(4))
def test_new_advantages_on_two_ranks_equal_one_process(estimator, args, seed):
    # Whole groups go to each rank (groups never span ranks); the batch statistics (GDPO's and REINFORCE++'s
    # whitening, GPG's alpha) are summed over ranks, so each rank's rows get the one-process advantages.
    gen = torch.Generator().manual_seed(seed)
    groups = torch.arange(6).repeat_interleave(4)  # 6 groups of 4: ranks get groups 0-2 and 3-5
    n = groups.numel()
    f1 = (torch.rand(n, generator=gen, dtype=F64) < 0.5).to(F64)
    f2 = torch.rand(n, generator=gen, dtype=F64)
    f1[torch.randperm(n, generator=gen)[:3]] = float("nan")
    f2[torch.isnan(f1)] = float("nan")  # skipped rows: every function returned None
    rewards = f1 if estimator == "grpo_passk" else f1 + 0.5 * f2
    mask = (torch.rand(n, 5, generator=gen) < 0.8).to(F64)
    mask[:, 0] = 1.0

    def advantages(rows, sum_across_ranks=None):
        return compute_advantages(
            rewards[rows], groups[rows], estimator=estimator, estimator_args=args, completion_mask=mask[rows],
            sum_across_ranks=sum_across_ranks, function_rewards={"f1": f1[rows], "f2": f2[rows]},
            function_weights={"f1": 1.0, "f2": 0.5},
        )  # fmt: skip

    whole = advantages(slice(None))
    halves = _two_ranks(lambda rank, reduce: advantages(slice(rank * n // 2, (rank + 1) * n // 2), reduce))
    torch.testing.assert_close(torch.cat(halves), whole, rtol=1e-12, atol=1e-12)
    assert bool(whole.abs().sum() > 0)


class _Settings:
    """GRPOConfig's loss settings with the off-policy pieces of issue 38 on (every per-row piece at once)."""

    loss_kind, loss_kind_args, clip_low, clip_high, dual_clip, delta = "clip", None, 0.2, 0.28, 3.0, None
    kl_coef, kl_estimator, kl_estimator_args, entropy_coef = 0.1, "k3", None, 0.05
    token_selection, token_selection_args, kl_weighting, kl_weighting_args = None, None, "importance", None
    off_policy_mask, off_policy_mask_args = "opsm", {"threshold": 0.05}
    rollout_rejection, rollout_rejection_args = "geometric", {"min": 0.8, "max": 1.25}

    def __init__(self, correction: str) -> None:
        self.rollout_correction, self.rollout_correction_args = correction, {"min": 0.5, "max": 2.0}


@pytest.mark.parametrize("correction", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=mini_batches())
def test_rollout_correction_opsm_and_weighted_kl_are_micro_batch_independent(correction, mode, batch):
    # Rollout weights, rejection and OPSM are per token or per row (sequence statistics over the row's own tokens),
    # the importance-weighted KL per token: the row-sum argument holds for grpo_loss with all of them on.
    from lightning_grpo.algorithms.objective import grpo_loss

    mask = batch["mask"]
    n, t = mask.shape
    gen = torch.Generator().manual_seed(batch["seed"])
    old = -3 * torch.rand(n, t, generator=gen, dtype=F64)
    behaviour = old + 0.3 * torch.randn(n, t, generator=gen, dtype=F64)
    ref = old + 0.5 * torch.randn(n, t, generator=gen, dtype=F64)
    x = torch.randn(n, t, generator=gen, dtype=F64)
    adv = torch.randn(n, generator=gen, dtype=F64)
    w = (0.3 * torch.randn(t, generator=gen, dtype=F64)).requires_grad_()
    cfg = _Settings(correction)

    def loss_fn(rows, mode, counts):
        logprobs = old[rows] + w * x[rows]
        entropy = (1 + w.tanh() * x[rows]).abs()  # (n_k, T) with a gradient through w
        aggregate = lambda v: aggregate_loss(v, mask[rows], mode, **counts)  # noqa: E731
        loss, _ = grpo_loss(logprobs, entropy, adv[rows], mask[rows], cfg, aggregate, old_logprobs=old[rows],
                            ref_logprobs=ref[rows], behaviour_logprobs=behaviour[rows])  # fmt: skip
        return loss

    (whole, whole_grads), (total, grads) = run_split(loss_fn, [w], batch, mode)
    torch.testing.assert_close(total, whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads, whole_grads, rtol=1e-6, atol=1e-6)
