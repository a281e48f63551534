"""Property tests for ``lightning_grpo.algorithms``, derived from docs/math.md alone.

Each test states a property of the formulas and, in comments, the hand derivation that makes it
hold. Tensors that only need to be "generic" come from a seeded ``torch.Generator`` (hypothesis
draws the seed, the shapes and the hyper-parameters); rewards, whose ties and NaNs are the
interesting edge cases, are drawn value by value.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lightning_grpo.algorithms import (
    aggregate_loss,
    compute_advantages,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    selective_logprobs,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EPS = 1e-6
F64 = torch.float64
SEEDS = st.integers(0, 2**31 - 1)

# Rewards on a grid of quarters: exact in float32, and two unequal rewards differ by >= 0.25, so a
# group's spread is either exactly 0 or far above eps (no ill-conditioned near-ties). The narrow
# range makes ties and all-equal groups (binary-reward style) frequent.
GRID_REWARDS = st.one_of(st.integers(-2, 2), st.integers(-40, 40)).map(lambda k: k / 4)


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


@st.composite
def grouped_rewards(draw, *, reward=GRID_REWARDS, min_size=2, max_size=6, max_groups=4, equal_size=False):
    """``rewards`` (N,) float32 and ``group_ids`` (N,) int64.

    Groups get random sizes and sparse labels (not 0..B-1), and the rows are shuffled, so the
    members of a group are not contiguous.
    """
    n_groups = draw(st.integers(1, max_groups))
    if equal_size:
        sizes = [draw(st.integers(min_size, max_size))] * n_groups
    else:
        sizes = draw(st.lists(st.integers(min_size, max_size), min_size=n_groups, max_size=n_groups))
    labels = draw(st.lists(st.integers(0, 99), min_size=n_groups, max_size=n_groups, unique=True))
    rewards, ids = [], []
    for label, size in zip(labels, sizes, strict=False):
        rewards += draw(st.lists(reward, min_size=size, max_size=size))
        ids += [label] * size
    order = draw(st.permutations(range(len(ids))))
    return (
        torch.tensor([rewards[i] for i in order], dtype=torch.float32),
        torch.tensor([ids[i] for i in order], dtype=torch.int64),
    )


def prefix_mask(lengths: list[int], t: int) -> torch.Tensor:
    """(N, T) float mask with the first ``lengths[i]`` tokens of row i valid (tokens after EOS masked)."""
    return (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).float()


def reference_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, estimator: str, scale: str) -> torch.Tensor:
    """Scalar-by-scalar float64 transcription of the docs/math.md table (grpo and rloo)."""
    r, g = rewards.double().tolist(), group_ids.tolist()
    members = defaultdict(list)
    for x, gid in zip(r, g, strict=False):
        if not math.isnan(x):
            members[gid].append(x)
    valid = [x for x in r if not math.isnan(x)]
    std_batch = statistics.stdev(valid) if len(valid) >= 2 else 0.0  # unbiased (n-1)
    out = []
    for x, gid in zip(r, g, strict=False):
        m = members[gid]
        if math.isnan(x) or len(m) < 2 or min(m) == max(m):
            out.append(0.0)  # NaN row / singleton group / all-equal group
        elif estimator == "rloo":
            out.append(x - (sum(m) - x) / (len(m) - 1))
        elif scale == "none":
            out.append(x - statistics.fmean(m))
        elif scale == "group":
            out.append((x - statistics.fmean(m)) / (statistics.stdev(m) + EPS))
        else:
            out.append((x - statistics.fmean(m)) / (std_batch + EPS))
    return torch.tensor(out, dtype=F64)


def whitening_is_well_conditioned(rewards: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether reinforce++'s token whitening is numerically meaningful for this batch.

    With x = r - mean_g on the valid tokens (rows with a reward), the whitened value is
    (x - mu)/(sd + eps). When every valid token carries the same non-zero x (say one group whose
    other members are fully masked), mu equals x only up to float32 rounding and sd is that
    rounding noise, so the result is noise/(noise + 1e-6): ill-conditioned, not a spec question.
    Keep batches with a real spread (float64 sd > 1e-2) or with x = 0 everywhere.
    """
    x = reference_advantages(rewards, group_ids, "grpo", "none")[:, None].expand(mask.shape)
    m = mask.double() * (~rewards.isnan()).double()[:, None]
    count = m.sum()
    if count < 2:
        return False  # the unbiased token std is undefined
    mu = (x * m).sum() / count
    sd = (((x - mu) ** 2 * m).sum() / (count - 1)).sqrt()
    return bool(sd > 1e-2) or bool((x * m == 0).all())


def group_sums(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Σ of ``values`` over the rows of each group, one entry per distinct group id."""
    return torch.stack([values[group_ids == gid].sum() for gid in group_ids.unique()])


# ----------------------------------------------------------------------------------------------
# advantages
# ----------------------------------------------------------------------------------------------

GRPO_LIKE = [("grpo", "group"), ("grpo", "batch"), ("grpo", "none"), ("rloo", "group")]


@pytest.mark.parametrize(("estimator", "scale"), GRPO_LIKE)
@SETTINGS
@given(data=grouped_rewards(min_size=1), nan_rows=st.lists(st.booleans(), min_size=40, max_size=40))
def test_advantages_match_the_table(estimator, scale, data, nan_rows):
    # Direct transcription of the table, with NaN rows (skipped by every reward function) and
    # singleton groups mixed in: both must give 0 and be left out of every statistic.
    rewards, group_ids = data
    rewards = torch.where(torch.tensor(nan_rows[: len(rewards)]), torch.nan, rewards)
    out = compute_advantages(rewards, group_ids, estimator=estimator, scale=scale)
    assert out.shape == rewards.shape
    assert out.is_floating_point()
    assert torch.isfinite(out).all()
    expected = reference_advantages(rewards, group_ids, estimator, scale)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("estimator", "scale"), [("grpo", "group"), ("grpo", "none"), ("rloo", "group")])
@SETTINGS
@given(data=grouped_rewards())
def test_advantages_have_zero_mean_per_group(estimator, scale, data):
    # grpo/none: Σ_g (r - mean_g) = Σ_g r - G·mean_g = 0; grpo/group divides that by one positive
    # number per group, so still 0. rloo: Σ_i (r_i - (S - r_i)/(G-1)) = S - (G·S - S)/(G-1) = 0.
    rewards, group_ids = data
    out = compute_advantages(rewards, group_ids, estimator=estimator, scale=scale)
    sums = group_sums(out.double(), group_ids)
    torch.testing.assert_close(sums, torch.zeros_like(sums), rtol=0, atol=1e-4)


@pytest.mark.parametrize(("estimator", "scale"), [*GRPO_LIKE, ("reinforce_pp_baseline", "group")])
@SETTINGS
@given(
    sizes=st.lists(st.integers(1, 8), min_size=1, max_size=4),
    values=st.lists(st.floats(-1e3, 1e3, width=32), min_size=4, max_size=4),
)
def test_all_equal_groups_get_exactly_zero(estimator, scale, sizes, values):
    # Every group holds one repeated (arbitrary, not grid) value. Mathematically r - mean_g = 0,
    # but in float32 mean_g may differ from r by an ulp; divided by std_g + eps ≈ 1e-6 that noise
    # would become O(1e-2), so the spec's "all equal -> 0" needs an explicit case. Two groups may
    # share a value, so the batch std can be 0 as well.
    rewards = torch.tensor([values[g] for g, size in enumerate(sizes) for _ in range(size)], dtype=torch.float32)
    group_ids = torch.tensor([g for g, size in enumerate(sizes) for _ in range(size)])
    mask = torch.ones(len(rewards), 3)
    out = compute_advantages(rewards, group_ids, estimator=estimator, scale=scale, completion_mask=mask)
    torch.testing.assert_close(out, torch.zeros_like(out), rtol=0, atol=1e-6)


@pytest.mark.parametrize("scale", ["group", "batch"])
@SETTINGS
@given(
    data=grouped_rewards(),
    a=st.floats(0.1, 10.0),
    b=st.floats(-10.0, 10.0),
)
def test_std_scaled_grpo_is_invariant_to_affine_rewards(scale, data, a, b):
    # r' = a·r + b (a > 0): mean' = a·mean + b and std' = a·std, so
    # (r' - mean')/(std' + eps) = a(r - mean)/(a·std + eps) = (r - mean)/(std + eps/a).
    # The two differ only through eps: relative gap <= eps/(a·std) <= 1e-6/(0.1·0.18) ≈ 6e-5, as a
    # non-degenerate grid group has std >= 0.25/sqrt(2) (batch std likewise); float32 rounding of
    # a·r + b adds <= ulp(11)/0.025 ≈ 4e-5. All-equal groups stay exactly all-equal -> 0.
    rewards, group_ids = data
    base = compute_advantages(rewards, group_ids, estimator="grpo", scale=scale)
    moved = compute_advantages(a * rewards + b, group_ids, estimator="grpo", scale=scale)
    torch.testing.assert_close(moved, base, rtol=5e-4, atol=5e-4)


@SETTINGS
@given(data=grouped_rewards(equal_size=True))
def test_rloo_is_rescaled_dr_grpo_for_equal_groups(data):
    # r_i - (S - r_i)/(G-1) = ((G-1)r_i - S + r_i)/(G-1) = G/(G-1)·(r_i - S/G).
    rewards, group_ids = data
    size = int((group_ids == group_ids[0]).sum())
    rloo = compute_advantages(rewards, group_ids, estimator="rloo")
    dr_grpo = compute_advantages(rewards, group_ids, estimator="grpo", scale="none")
    torch.testing.assert_close(rloo, size / (size - 1) * dr_grpo, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("estimator", "scale"), [*GRPO_LIKE, ("reinforce_pp_baseline", "group")])
@SETTINGS
@given(
    data=grouped_rewards(),
    nan_rows=st.lists(st.booleans(), min_size=24, max_size=24),
    lengths=st.lists(st.integers(1, 4), min_size=24, max_size=24),
)
def test_nan_rows_get_zero_and_do_not_touch_other_rows(estimator, scale, data, nan_rows, lengths):
    # "Excluded from all statistics" means: the other rows' advantages are exactly those of the
    # batch with the NaN rows deleted (group means/stds, batch std, and the token whitening of
    # reinforce++ alike). Deleting rows may leave singleton groups: those get 0 in both runs.
    rewards, group_ids = data
    n = len(rewards)
    nan = torch.tensor(nan_rows[:n])
    assume(not nan.all())
    mask = prefix_mask(lengths[:n], 4)
    rewards = torch.where(nan, torch.nan, rewards)
    assume(estimator != "reinforce_pp_baseline" or whitening_is_well_conditioned(rewards, group_ids, mask))
    kwargs = {"estimator": estimator, "scale": scale}
    full = compute_advantages(rewards, group_ids, completion_mask=mask, **kwargs)
    kept = compute_advantages(rewards[~nan], group_ids[~nan], completion_mask=mask[~nan], **kwargs)
    assert torch.isfinite(full).all()
    assert (full[nan] == 0).all()
    torch.testing.assert_close(full[~nan], kept, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("estimator", "scale"), [*GRPO_LIKE, ("reinforce_pp_baseline", "group")])
@SETTINGS
@given(
    data=grouped_rewards(),
    nan_rows=st.lists(st.booleans(), min_size=24, max_size=24),
    lengths=st.lists(st.integers(0, 4), min_size=24, max_size=24),
    seed=SEEDS,
)
def test_advantages_are_permutation_equivariant(estimator, scale, data, nan_rows, lengths, seed):
    # Every statistic is a function of the multiset of (reward, group, mask row), so shuffling the
    # rows (rewards, group_ids and mask together) shuffles the advantages the same way.
    rewards, group_ids = data
    n = len(rewards)
    rewards = torch.where(torch.tensor(nan_rows[:n]), torch.nan, rewards)
    mask = prefix_mask(lengths[:n], 4)
    assume(estimator != "reinforce_pp_baseline" or whitening_is_well_conditioned(rewards, group_ids, mask))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    kwargs = {"estimator": estimator, "scale": scale}
    out = compute_advantages(rewards, group_ids, completion_mask=mask, **kwargs)
    shuffled = compute_advantages(rewards[perm], group_ids[perm], completion_mask=mask[perm], **kwargs)
    torch.testing.assert_close(shuffled, out[perm], rtol=1e-5, atol=1e-5)


@SETTINGS
@given(data=grouped_rewards(), lengths=st.lists(st.integers(0, 5), min_size=24, max_size=24))
def test_reinforce_pp_baseline_whitens_dr_grpo_over_valid_tokens(data, lengths):
    # x = r - mean_g (= grpo/none) broadcast to the valid tokens; mu = Σ x·M / Σ M;
    # sd = sqrt(Σ (x - mu)²·M / (Σ M - 1)); A = (x - mu)/(sd + eps) on valid tokens, 0 elsewhere.
    # Rows of all-equal groups count in mu and sd with x = 0 (they are valid tokens), but the
    # general rule "all-equal groups get 0" then sets their own advantage to 0. (verl's
    # reinforce_plus_plus_baseline would leave them at -mu/(sd + eps) instead.)
    rewards, group_ids = data
    n = len(rewards)
    mask = prefix_mask(lengths[:n], 5)
    assume(whitening_is_well_conditioned(rewards, group_ids, mask))
    count = mask.sum()
    x = reference_advantages(rewards, group_ids, "grpo", "none")[:, None].expand(-1, 5)
    mu = (x * mask).sum() / count
    sd = (((x - mu) ** 2 * mask).sum() / (count - 1)).sqrt()
    flat = torch.tensor([rewards[group_ids == gid].unique().numel() == 1 for gid in group_ids])  # (N,)
    expected = torch.where(flat[:, None], 0.0, (x - mu) / (sd + EPS) * mask)
    out = compute_advantages(rewards, group_ids, estimator="reinforce_pp_baseline", completion_mask=mask)
    assert out.shape == mask.shape
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    # One value per sequence: constant along the valid tokens of a row.
    out = out.double()
    first = out[:, :1].expand_as(out)
    torch.testing.assert_close(out * mask, first * mask, rtol=0, atol=1e-6)
    if not flat.any():
        # Whitened: masked mean 0 and unbiased masked std sd/(sd + eps) ≈ 1 over the valid tokens.
        mean = (out * mask).sum() / count
        std = (((out - mean) ** 2 * mask).sum() / (count - 1)).sqrt()
        torch.testing.assert_close(mean, torch.zeros((), dtype=F64), rtol=0, atol=1e-5)
        torch.testing.assert_close(std, sd / (sd + EPS), rtol=0, atol=1e-4)


def test_reinforce_pp_baseline_requires_completion_mask():
    with pytest.raises((ValueError, TypeError)):
        compute_advantages(torch.tensor([0.0, 1.0]), torch.tensor([0, 0]), estimator="reinforce_pp_baseline")


# ----------------------------------------------------------------------------------------------
# KL estimators
# ----------------------------------------------------------------------------------------------

KL_BASE = ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"]


def reference_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    d = ref_logprobs - logprobs
    if kind in ("k1", "kl"):
        return -d
    if kind == "abs":
        return d.abs()
    if kind in ("k2", "mse"):
        return 0.5 * d**2
    d = d.clamp(-20, 20)
    return (d.exp() - d - 1).clamp(-10, 10)


def kl_inputs(seed: int, n: int, t: int, spread: float):
    gen = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(n, t, generator=gen, dtype=F64) * 5).requires_grad_()
    ref = logprobs.detach() + spread * torch.randn(n, t, generator=gen, dtype=F64)
    return logprobs, ref


@pytest.mark.parametrize("kind", KL_BASE)
@SETTINGS
@given(seed=SEEDS, n=st.integers(1, 4), t=st.integers(1, 5), spread=st.sampled_from([0.01, 1.0, 15.0]))
def test_kl_values_match_the_table(kind, seed, n, t, spread):
    # spread 15 pushes |d| past 20 on some tokens, exercising both k3 clamps.
    logprobs, ref = kl_inputs(seed, n, t, spread)
    out = kl_penalty(logprobs, ref, kind)
    assert out.shape == (n, t)
    torch.testing.assert_close(out, reference_kl(logprobs.detach(), ref, kind), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["k1", "k3", "abs", "kl", "low_var_kl", "k2"])
@SETTINGS
@given(seed=SEEDS, n=st.integers(1, 4), t=st.integers(1, 5), spread=st.sampled_from([0.01, 1.0, 15.0]))
def test_straight_through_kl_has_base_value_and_k2_gradient(kind, seed, n, t, spread):
    # "<name>+" = base value + (k2 - k2.detach()): forward equals the base estimator, backward is
    # that of k2 = 0.5·d², d = ref - logp, i.e. d k2/d logp = -d = logp - ref (no clamp on k2).
    logprobs, ref = kl_inputs(seed, n, t, spread)
    weights = torch.randn(n, t, generator=torch.Generator().manual_seed(seed + 1), dtype=F64)
    out = kl_penalty(logprobs, ref, kind + "+")
    torch.testing.assert_close(out, kl_penalty(logprobs, ref, kind), rtol=1e-10, atol=1e-10)
    (grad,) = torch.autograd.grad((weights * out).sum(), logprobs)
    (grad_k2,) = torch.autograd.grad((weights * kl_penalty(logprobs, ref, "k2")).sum(), logprobs)
    torch.testing.assert_close(grad, grad_k2, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad, weights * (logprobs.detach() - ref), rtol=1e-10, atol=1e-10)


@SETTINGS
@given(
    logprobs=st.lists(st.floats(-60, 0, width=32), min_size=1, max_size=16),
    offsets=st.lists(
        st.one_of(st.floats(-(2**-20), 2**-20, width=32), st.floats(-60, 60, width=32)), min_size=16, max_size=16
    ),
)
def test_k3_is_nonnegative_and_bounded(logprobs, offsets):
    # f(d) = e^d - d - 1 >= 0 (convex, minimum 0 at d = 0), and the clamps keep it in [0, 10].
    # Tiny |d| is where float32 cancellation can push e^d - d - 1 an ulp of 1 (1.2e-7) below 0;
    # that is rounding, not a sign error, so allow 1e-6.
    lp = torch.tensor(logprobs)
    ref = lp + torch.tensor(offsets[: len(logprobs)])
    out = kl_penalty(lp, ref, "k3")
    assert torch.isfinite(out).all()
    assert (out >= -1e-6).all()
    assert (out <= 10).all()


# ----------------------------------------------------------------------------------------------
# policy losses
# ----------------------------------------------------------------------------------------------


def loss_inputs(seed: int, n: int, t: int, per_token: bool, max_log_ratio: float = 2.0, empty_row: bool = False):
    """logprobs (leaf), old_logprobs, advantages ((N,) or (N,T), some exactly 0) and a float mask."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=gen, dtype=F64) * 5
    log_ratio = (2 * torch.rand(n, t, generator=gen, dtype=F64) - 1) * max_log_ratio
    logprobs = (old + log_ratio).requires_grad_()
    adv = torch.randn((n, t) if per_token else (n,), generator=gen, dtype=F64)
    adv = torch.where(torch.rand(adv.shape, generator=gen) < 0.1, 0.0, adv)
    mask = (torch.rand(n, t, generator=gen) < 0.8).double()
    mask[0, 0] = 1.0  # at least one valid token
    if empty_row and n > 1:
        mask[-1] = 0.0
    return logprobs, old, adv, mask


def per_token(adv: torch.Tensor, shape) -> torch.Tensor:
    return (adv if adv.dim() == 2 else adv[:, None]).expand(shape)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x.double() * mask).sum() / mask.sum()


def clip_reference(logprobs, old, adv, clip_low, clip_high, dual_clip, delta):
    """The docs/math.md clipped surrogate, term by term (value only)."""
    ratio = torch.exp(torch.clamp(logprobs - old, -20, 20))
    unclipped_ratio = ratio if delta is None else torch.clamp(ratio, max=delta)
    loss = torch.maximum(-adv * unclipped_ratio, -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high))
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
    return loss


CLIP_PARAMS = st.tuples(
    st.sampled_from([0.1, 0.2, 0.3]),  # clip_low
    st.sampled_from([0.2, 0.28, 0.5]),  # clip_high ("clip-higher" when > clip_low)
    st.sampled_from([None, 3.0, 2.0]),  # dual_clip
    st.sampled_from([None, 4.0, 1.6]),  # delta (always >= 1 + clip_high here)
)


@SETTINGS
@given(seed=SEEDS, n=st.integers(1, 4), t=st.integers(1, 6), per_tok=st.booleans(), params=CLIP_PARAMS)
def test_clip_loss_value_and_gradient(seed, n, t, per_tok, params):
    clip_low, clip_high, dual_clip, delta = params
    logprobs, old, adv, mask = loss_inputs(seed, n, t, per_tok)
    loss, _ = policy_loss(
        logprobs, old, adv, mask, kind="clip", clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, delta=delta
    )
    assert loss.shape == (n, t)
    a = per_token(adv, (n, t))
    expected = clip_reference(logprobs.detach(), old, a, clip_low, clip_high, dual_clip, delta)
    torch.testing.assert_close(loss * mask, expected * mask, rtol=1e-9, atol=1e-9)

    # Gradient, by hand. Only token (i,t) of the loss depends on logp_it, and d ratio/d logp = ratio.
    # The loss is constant in logp (gradient 0) wherever a clipped branch is taken:
    #   A > 0, ratio > 1+clip_high: max picks -A(1+clip_high);
    #   A < 0, ratio < 1-clip_low:  max picks -A(1-clip_low);
    #   delta set, ratio > delta:   the unclipped term is -A·delta (and delta >= 1+clip_high);
    #   dual clip, A < 0 and the clipped value > -A·c: min picks -A·c.
    # Everywhere else the loss is -A·ratio, whose gradient is -A·ratio.
    ratio = (logprobs.detach() - old).exp()
    clipped = ((a > 0) & (ratio > 1 + clip_high)) | ((a < 0) & (ratio < 1 - clip_low))
    if delta is not None:
        clipped |= ratio > delta
    if dual_clip is not None:
        before_dual = clip_reference(logprobs.detach(), old, a, clip_low, clip_high, None, delta)
        clipped |= (a < 0) & (before_dual > -a * dual_clip)
    (grad,) = torch.autograd.grad((loss * mask).sum(), logprobs)
    expected_grad = torch.where(clipped, 0.0, -a * ratio) * mask
    torch.testing.assert_close(grad, expected_grad, rtol=1e-9, atol=1e-9)


@SETTINGS
@given(seed=SEEDS, n=st.integers(1, 4), t=st.integers(1, 6), per_tok=st.booleans(), params=CLIP_PARAMS)
def test_clip_loss_stats(seed, n, t, per_tok, params):
    # Masked means over valid tokens of: clip_frac_high = [A>0 & ratio>1+ε_high], clip_frac_low =
    # [A<0 & ratio<1-ε_low], clip_frac = either (without delta, those are exactly the tokens where
    # max() takes the clipped term), dual_clip_frac = [A<0 & clipped value > -A·c], and
    # approx_kl = mean(old - logp).
    clip_low, clip_high, dual_clip, _ = params
    logprobs, old, adv, mask = loss_inputs(seed, n, t, per_tok)
    _, stats = policy_loss(
        logprobs, old, adv, mask, kind="clip", clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    a = per_token(adv, (n, t))
    ratio = (logprobs.detach() - old).exp()
    high = ((a > 0) & (ratio > 1 + clip_high)).double()
    low = ((a < 0) & (ratio < 1 - clip_low)).double()
    clipped_value = torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip_low, 1 + clip_high))
    dual = (a < 0) & (clipped_value > -a * dual_clip) if dual_clip is not None else torch.zeros_like(low)
    expected = {
        "clip_frac": masked_mean(high + low, mask),
        "clip_frac_high": masked_mean(high, mask),
        "clip_frac_low": masked_mean(low, mask),
        "dual_clip_frac": masked_mean(dual.double(), mask),
        "approx_kl": masked_mean(old - logprobs.detach(), mask),
    }
    for name, value in expected.items():
        got = getattr(stats, name)
        assert isinstance(got, torch.Tensor) and got.dim() == 0, name
        assert not got.requires_grad, name
        torch.testing.assert_close(got.double(), value, rtol=1e-6, atol=1e-6, msg=name)


@SETTINGS
@given(
    seed=SEEDS,
    n=st.integers(1, 4),
    t=st.integers(1, 6),
    per_tok=st.booleans(),
    clip=st.sampled_from([(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)]),
)
def test_gspo_uses_the_sequence_ratio_with_token_gradients(seed, n, t, per_tok, clip):
    # s_i = Σ_t (logp - old)·M / Σ_t M, R_i = exp(s_i); token t of row i has value
    # max(-A·R_i, -A·clamp(R_i, 1-ε_low, 1+ε_high)). Because s is detached, the straight-through
    # ratio exp(s.detach() + logp_t - logp_t.detach()) gives d loss_t / d logp_t = -A·R_i when the
    # unclipped term is taken, 0 when the clipped one is, and nothing through other tokens.
    # The last row is fully masked: its s is 0/0, which must not leak NaN into values or gradients.
    clip_low, clip_high = clip
    logprobs, old, adv, mask = loss_inputs(seed, n, t, per_tok, max_log_ratio=0.6, empty_row=True)
    loss, _ = policy_loss(logprobs, old, adv, mask, kind="gspo", clip_low=clip_low, clip_high=clip_high, dual_clip=None)
    a = per_token(adv, (n, t))
    seq = ((logprobs.detach() - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    ratio = seq.exp()[:, None].expand(n, t)
    expected = torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip_low, 1 + clip_high))
    assert torch.isfinite(loss * mask).all()
    torch.testing.assert_close(loss * mask, expected * mask, rtol=1e-9, atol=1e-9)
    clipped = ((a > 0) & (ratio > 1 + clip_high)) | ((a < 0) & (ratio < 1 - clip_low))
    (grad,) = torch.autograd.grad((loss * mask).sum(), logprobs)
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(grad, torch.where(clipped, 0.0, -a * ratio) * mask, rtol=1e-9, atol=1e-9)


def test_gspo_log_ratio_is_capped_at_10():
    # logp - old = 15 on every token -> s = 15, capped to 10. With A = -1 (unclipped side, no dual
    # clip) the loss is -A·e^10 = e^10 on every valid token.
    old = torch.zeros(2, 3, dtype=F64)
    logprobs = old + 15.0
    adv = torch.tensor([-1.0, -1.0], dtype=F64)
    mask = torch.ones(2, 3, dtype=F64)
    loss, _ = policy_loss(logprobs, old, adv, mask, kind="gspo", dual_clip=None)
    torch.testing.assert_close(loss, torch.full((2, 3), math.exp(10.0), dtype=F64))


@SETTINGS
@given(seed=SEEDS, n=st.integers(1, 4), t=st.integers(1, 6), per_tok=st.booleans())
def test_cispo_is_clipped_weight_times_logprob(seed, n, t, per_tok):
    # loss = -A · sg(clamp(ratio, 1-ε_low, 1+ε_high)) · logp, so d loss/d logp = -A·clamp(ratio).
    logprobs, old, adv, mask = loss_inputs(seed, n, t, per_tok)
    loss, _ = policy_loss(logprobs, old, adv, mask, kind="cispo", clip_low=0.2, clip_high=0.28)
    a = per_token(adv, (n, t))
    weight = (logprobs.detach() - old).exp().clamp(0.8, 1.28)
    torch.testing.assert_close(loss * mask, -a * weight * logprobs.detach() * mask, rtol=1e-9, atol=1e-9)
    (grad,) = torch.autograd.grad((loss * mask).sum(), logprobs)
    torch.testing.assert_close(grad, -a * weight * mask, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kind", ["clip", "gspo", "cispo"])
@SETTINGS
@given(seed=SEEDS, n=st.integers(1, 4), t=st.integers(1, 6), per_tok=st.booleans())
def test_policy_loss_at_ratio_one(kind, seed, n, t, per_tok):
    # logp == old: ratio = 1 sits strictly inside [1-ε_low, 1+ε_high] (and below c), so
    #   clip:  value max(-A, -A) = -A,   gradient -A·ratio = -A;
    #   gspo:  s = 0, R = 1, same value -A and gradient -A·R = -A;
    #   cispo: value -A·1·logp,          gradient -A.
    logprobs, _, adv, mask = loss_inputs(seed, n, t, per_tok)
    old = logprobs.detach().clone()
    loss, stats = policy_loss(logprobs, old, adv, mask, kind=kind)
    a = per_token(adv, (n, t))
    value = -a * logprobs.detach() if kind == "cispo" else -a
    torch.testing.assert_close(loss * mask, value * mask, rtol=1e-9, atol=1e-9)
    (grad,) = torch.autograd.grad((loss * mask).sum(), logprobs)
    torch.testing.assert_close(grad, -a * mask, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(stats.approx_kl.double(), torch.zeros((), dtype=F64), rtol=0, atol=1e-9)


# ----------------------------------------------------------------------------------------------
# loss aggregation
# ----------------------------------------------------------------------------------------------

MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def reference_aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str) -> float:
    """The docs/math.md aggregation table with default counts, as plain Python sums."""
    rows = [
        [v for v, m in zip(vrow, mrow, strict=False) if m]
        for vrow, mrow in zip(values.tolist(), mask.bool().tolist(), strict=False)
    ]
    rows_with_tokens = [r for r in rows if r]
    if mode == "token-mean":
        return sum(map(sum, rows)) / sum(map(len, rows))
    if mode == "token-sum":
        return sum(map(sum, rows))
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows_with_tokens) / len(rows_with_tokens)
    if mode == "seq-mean-token-sum":
        return sum(map(sum, rows_with_tokens)) / len(rows_with_tokens)
    return sum(map(sum, rows)) / (len(rows_with_tokens) * values.shape[-1])


@pytest.mark.parametrize("mode", MODES)
@SETTINGS
@given(
    seed=SEEDS,
    n=st.integers(1, 6),
    t=st.integers(1, 6),
    lengths=st.lists(st.integers(0, 6), min_size=6, max_size=6),
    bool_mask=st.booleans(),
)
def test_aggregate_matches_the_table(mode, seed, n, t, lengths, bool_mask):
    # Fully masked rows (length 0) count as no sequence and contribute nothing; values under the
    # mask are garbage (large) and must not leak in.
    mask = prefix_mask([min(x, t) for x in lengths[:n]], t)
    assume(mask.sum() > 0)
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(n, t, generator=gen, dtype=F64)
    values = torch.where(mask.bool(), values, 1e6)
    out = aggregate_loss(values, mask.bool() if bool_mask else mask, mode)
    assert out.dim() == 0
    assert out.item() == pytest.approx(reference_aggregate(values, mask, mode), rel=1e-9, abs=1e-9)


# ----------------------------------------------------------------------------------------------
# log-prob and entropy kernels
# ----------------------------------------------------------------------------------------------


def kernel_inputs(seed: int, n: int, t: int, v: int, scale: float, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, t, v, generator=gen) * scale).to(dtype).requires_grad_()
    ids = torch.randint(0, v, (n, t), generator=gen)
    weights = torch.randn(n, t, generator=gen)  # random cotangent for the gradient checks
    return logits, ids, weights


def kernel_tolerance(logits: torch.Tensor, temperature: float) -> float:
    # float32 carries ~6e-8 relative precision, so a log-prob computed from scaled logits of size
    # M = max|logits|/T is good to a few ulps of M: 1e-6 absolute for M <= 1, 1e-6·M beyond.
    return 1e-6 * max(1.0, logits.detach().abs().max().item() / temperature)


def reference_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits.double() / temperature, -1).gather(-1, ids[..., None]).squeeze(-1)


def reference_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    logp = torch.log_softmax(logits.double() / temperature, -1)
    return -(logp.exp() * logp).sum(-1)


KERNEL_ARGS = {
    "seed": SEEDS,
    "n": st.integers(1, 3),
    "t": st.integers(1, 4),
    "v": st.integers(2, 17),
    "scale": st.sampled_from([0.1, 1.0, 5.0]),
    "temperature": st.floats(0.5, 2.0),
    "chunk": st.integers(1, 12),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@SETTINGS
@given(**KERNEL_ARGS)
def test_selective_logprobs_match_float64_reference(dtype, seed, n, t, v, scale, temperature, chunk):
    # Reference: float64 log_softmax of the *same* (possibly bf16-rounded) logits. The kernel
    # normalizes in float32, so bf16 inputs must come out as accurate as float32 ones; the only
    # bf16 loss allowed is in the gradient, which autograd returns in the logits' dtype.
    logits, ids, weights = kernel_inputs(seed, n, t, v, scale, dtype)
    chunk_size = min(chunk, n * t)  # any chunk size in 1..N*T
    out = selective_logprobs(logits, ids, temperature=temperature, chunk_size=chunk_size)
    assert out.shape == (n, t)
    assert out.dtype == torch.float32
    expected = reference_logprobs(logits.detach(), ids, temperature)
    tol = kernel_tolerance(logits, temperature)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=tol)

    (grad,) = torch.autograd.grad((weights * out).sum(), logits)
    ref_logits = logits.detach().double().requires_grad_()
    (ref_grad,) = torch.autograd.grad(
        (weights.double() * reference_logprobs(ref_logits, ids, temperature)).sum(), ref_logits
    )
    assert grad.dtype == dtype
    rtol = 0.0 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(grad.double(), ref_grad, rtol=rtol, atol=10 * tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@SETTINGS
@given(**KERNEL_ARGS)
def test_entropy_from_logits_matches_float64_reference(dtype, seed, n, t, v, scale, temperature, chunk):
    # H = -Σ p log p with p = softmax(logits / T); 0 <= H <= log V.
    logits, _, weights = kernel_inputs(seed, n, t, v, scale, dtype)
    out = entropy_from_logits(logits, temperature=temperature, chunk_size=min(chunk, n * t))
    assert out.shape == (n, t)
    assert out.dtype == torch.float32
    tol = kernel_tolerance(logits, temperature)
    torch.testing.assert_close(out.double(), reference_entropy(logits.detach(), temperature), rtol=0, atol=tol)
    assert (out >= -tol).all() and (out <= math.log(v) + tol).all()

    (grad,) = torch.autograd.grad((weights * out).sum(), logits)
    ref_logits = logits.detach().double().requires_grad_()
    (ref_grad,) = torch.autograd.grad((weights.double() * reference_entropy(ref_logits, temperature)).sum(), ref_logits)
    assert grad.dtype == dtype
    rtol = 0.0 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(grad.double(), ref_grad, rtol=rtol, atol=10 * tol)


# ----------------------------------------------------------------------------------------------
# names
# ----------------------------------------------------------------------------------------------


def _assert_lists(excinfo, names):
    message = str(excinfo.value)
    for name in names:
        assert name in message, f"{name!r} missing from: {message}"


def test_bad_names_raise_value_error_listing_valid_ones():
    r, g = torch.tensor([0.0, 1.0]), torch.tensor([0, 0])
    with pytest.raises(ValueError) as exc:
        compute_advantages(r, g, estimator="ppo")
    _assert_lists(exc, ["grpo", "rloo", "reinforce_pp_baseline"])
    with pytest.raises(ValueError) as exc:
        compute_advantages(r, g, estimator="grpo", scale="global")
    _assert_lists(exc, ["group", "batch", "none"])

    x = torch.zeros(2, 3)
    with pytest.raises(ValueError) as exc:
        policy_loss(x, x, torch.zeros(2), torch.ones(2, 3), kind="ppo")
    _assert_lists(exc, ["clip", "gspo", "cispo"])
    for bad in ("k4", "k4+", "++"):
        with pytest.raises(ValueError) as exc:
            kl_penalty(x, x, bad)
        _assert_lists(exc, ["k1", "k2", "k3", "abs"])
    with pytest.raises(ValueError) as exc:
        aggregate_loss(x, torch.ones(2, 3), "mean")
    _assert_lists(exc, MODES)
