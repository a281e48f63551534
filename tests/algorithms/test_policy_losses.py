"""Worked examples for ``policy_loss``: values, gradients wrt ``logprobs`` and every ``PolicyLossStats`` field.

Tokens are built from chosen ratios: ``logprobs = old_logprobs + log(ratio)``, so ``ratio = exp(logp - old)`` is the
chosen number. The gradient of ``-A * ratio`` wrt ``logp`` is ``-A * ratio`` (d ratio / d logp = ratio); a clipped or
bounded branch is constant in ``logp`` and has gradient 0.
"""

import math

import torch
from torch.testing import assert_close

from lightning_grpo.algorithms import PolicyLossStats, policy_loss


def _tokens(ratios, old=-1.0):
    """``(logprobs, old_logprobs)`` with ``exp(logprobs - old_logprobs) == ratios``; logprobs require grad."""
    ratios = torch.tensor(ratios, dtype=torch.float64)
    old_logprobs = torch.full_like(ratios, old)
    logprobs = (old_logprobs + ratios.log()).requires_grad_(True)
    return logprobs, old_logprobs


def _grad(loss, logprobs, mask):
    (loss * mask).sum().backward()
    return logprobs.grad


def _t(values):
    return torch.tensor(values, dtype=torch.float64)


def _scalar(x):
    return torch.tensor(x, dtype=torch.float32)


# Shared batch for the symmetric clip (clip 0.2 -> bounds [0.8, 1.2], dual clip c = 3):
#   seq 0, A = +1: ratios 1.5 (above 1.2 -> clipped), 1.1 (inside), 0.5 (below 0.8 but A > 0: unclipped),
#                  then a padding token with a garbage ratio 10 that must not enter the statistics
#   seq 1, A = -2: ratios 0.5 (below 0.8 -> clipped), 1.5 (above 1.2 but A < 0: unclipped),
#                  5.0 (above c = 3 -> dual clip), 2.0 (below c: unclipped)
RATIOS = [[1.5, 1.1, 0.5, 10.0], [0.5, 1.5, 5.0, 2.0]]
MASK = _t([[1, 1, 1, 0], [1, 1, 1, 1]])
ADV = _t([1.0, -2.0])


def test_clip_symmetric_values_and_gradients():
    logprobs, old = _tokens(RATIOS)
    loss, _ = policy_loss(logprobs, old, ADV, MASK)
    # seq 0 (A = 1): loss = max(-r, -clamp(r, 0.8, 1.2))
    #   r 1.5: max(-1.5, -1.2) = -1.2 (clipped, grad 0)
    #   r 1.1: max(-1.1, -1.1) = -1.1 (grad -A r = -1.1)
    #   r 0.5: max(-0.5, -0.8) = -0.5 (unclipped, grad -0.5)
    #   pad r 10: max(-10, -1.2) = -1.2 (value not masked yet; grad masked out below)
    # seq 1 (A = -2): loss = max(2r, 2 clamp(r)), then min(., 2 * 3 = 6)
    #   r 0.5: max(1.0, 1.6) = 1.6 (clipped, grad 0)
    #   r 1.5: max(3.0, 2.4) = 3.0 (grad -A r = 3.0)
    #   r 5.0: max(10, 2.4) = 10 -> dual clip min(10, 6) = 6 (grad 0)
    #   r 2.0: max(4.0, 2.4) = 4.0 < 6 (grad 4.0)
    assert_close(loss.detach(), _t([[-1.2, -1.1, -0.5, -1.2], [1.6, 3.0, 6.0, 4.0]]))
    assert_close(_grad(loss, logprobs, MASK), _t([[0.0, -1.1, -0.5, 0.0], [0.0, 3.0, 0.0, 4.0]]))


def test_clip_symmetric_stats():
    logprobs, old = _tokens(RATIOS)
    _, stats = policy_loss(logprobs, old, ADV, MASK)
    assert isinstance(stats, PolicyLossStats)
    # 7 valid tokens (the padding token with ratio 10 would otherwise count as clipped-high)
    # clipped branch taken: seq 0 r 1.5 and seq 1 r 0.5 -> 2/7
    assert_close(stats.clip_frac, _scalar(2 / 7))
    # A < 0 and r < 0.8: seq 1 r 0.5 -> 1/7
    assert_close(stats.clip_frac_low, _scalar(1 / 7))
    # A > 0 and r > 1.2: seq 0 r 1.5 -> 1/7
    assert_close(stats.clip_frac_high, _scalar(1 / 7))
    # dual clip bound taken: seq 1 r 5 -> 1/7
    assert_close(stats.dual_clip_frac, _scalar(1 / 7))
    # approx_kl = mean(old - logp) = mean(-log r) over the 7 valid tokens
    #   = -(ln 1.5 + ln 1.1 + ln 0.5 + ln 0.5 + ln 1.5 + ln 5 + ln 2) / 7 = -(ln 6.1875) / 7 = -0.2604
    approx_kl = -math.log(1.5 * 1.1 * 0.5 * 0.5 * 1.5 * 5.0 * 2.0) / 7
    assert_close(stats.approx_kl, _scalar(approx_kl))
    for value in (stats.clip_frac, stats.clip_frac_low, stats.clip_frac_high, stats.dual_clip_frac, stats.approx_kl):
        assert value.ndim == 0


def test_clip_without_dual_clip():
    logprobs, old = _tokens(RATIOS)
    loss, stats = policy_loss(logprobs, old, ADV, MASK, dual_clip=None)
    # only seq 1 r 5.0 changes: max(10, 2.4) = 10 stays, grad -A r = 10
    assert_close(loss.detach(), _t([[-1.2, -1.1, -0.5, -1.2], [1.6, 3.0, 10.0, 4.0]]))
    assert_close(_grad(loss, logprobs, MASK), _t([[0.0, -1.1, -0.5, 0.0], [0.0, 3.0, 10.0, 4.0]]))
    assert_close(stats.dual_clip_frac, _scalar(0.0))
    assert_close(stats.clip_frac, _scalar(2 / 7))  # the clipped-branch tokens are unchanged


def test_clip_custom_dual_clip_bound():
    # c = 1.8, A = -2: bound 3.6. r 1.5 -> 3.0 < 3.6 kept (grad 3.0); r 2.0 -> 4.0 > 3.6 -> 3.6 (grad 0)
    logprobs, old = _tokens([[1.5, 2.0]])
    mask = _t([[1, 1]])
    loss, stats = policy_loss(logprobs, old, _t([-2.0]), mask, dual_clip=1.8)
    assert_close(loss.detach(), _t([[3.0, 3.6]]))
    assert_close(_grad(loss, logprobs, mask), _t([[3.0, 0.0]]))
    assert_close(stats.dual_clip_frac, _scalar(1 / 2))


def test_clip_higher_asymmetric():
    # clip_low 0.1, clip_high 0.28 -> bounds [0.9, 1.28]
    #   seq 0 (A = 1): r 1.25 inside -> -1.25 (grad -1.25); r 1.3 above -> -1.28 (clipped, grad 0)
    #   seq 1 (A = -1): r 0.85 below 0.9 -> max(0.85, 0.9) = 0.9 (clipped, grad 0); r 0.95 inside -> 0.95 (grad 0.95)
    # (with the symmetric 0.2 the first token would be clipped at 1.2 and the third kept at 0.85)
    logprobs, old = _tokens([[1.25, 1.3], [0.85, 0.95]])
    mask = _t([[1, 1], [1, 1]])
    loss, stats = policy_loss(logprobs, old, _t([1.0, -1.0]), mask, clip_low=0.1, clip_high=0.28)
    assert_close(loss.detach(), _t([[-1.25, -1.28], [0.9, 0.95]]))
    assert_close(_grad(loss, logprobs, mask), _t([[-1.25, 0.0], [0.0, 0.95]]))
    # clipped: r 1.3 (A > 0) and r 0.85 (A < 0) -> 2/4; low: r 0.85 < 0.9 -> 1/4; high: r 1.3 > 1.28 -> 1/4
    assert_close(stats.clip_frac, _scalar(2 / 4))
    assert_close(stats.clip_frac_low, _scalar(1 / 4))
    assert_close(stats.clip_frac_high, _scalar(1 / 4))
    assert_close(stats.dual_clip_frac, _scalar(0.0))


def test_clip_delta_bounds_the_unclipped_ratio():
    # delta 1.5 (INTELLECT-2): the unclipped term uses min(r, 1.5); dual clip c = 3 stays on
    #   seq 0 (A = 1):  r 2.0 -> max(-1.5, -1.2) = -1.2 (clipped, grad 0)
    #   seq 1 (A = -1): r 1.4 -> max(1.4, 1.2) = 1.4 (grad -A r = 1.4)
    #                   r 2.0 -> max(min(2, 1.5), 1.2) = 1.5 (bounded by delta, grad 0)
    #                   r 5.0 -> 1.5 as well: below the dual clip bound 3, so no dual clip (grad 0)
    logprobs, old = _tokens([[2.0, 1.0, 1.0], [1.4, 2.0, 5.0]])
    mask = _t([[1, 0, 0], [1, 1, 1]])
    loss, stats = policy_loss(logprobs, old, _t([1.0, -1.0]), mask, delta=1.5)
    assert_close(loss.detach()[0, 0], torch.tensor(-1.2, dtype=torch.float64))
    assert_close(loss.detach()[1], _t([1.4, 1.5, 1.5]))
    assert_close(_grad(loss, logprobs, mask), _t([[0.0, 0.0, 0.0], [1.4, 0.0, 0.0]]))
    # 4 valid tokens; clipped branch taken only by seq 0 r 2.0 -> 1/4; no dual clip
    assert_close(stats.clip_frac, _scalar(1 / 4))
    assert_close(stats.clip_frac_high, _scalar(1 / 4))
    assert_close(stats.dual_clip_frac, _scalar(0.0))


def test_clip_log_ratio_clamped_at_20():
    # logp - old = 30 -> clamped to 20 -> ratio e^20 = 4.85e8; A = -1e-8, no dual clip: loss 1e-8 * e^20 = 4.852
    # the clamp is flat there, so the gradient is 0
    logprobs = torch.tensor([[29.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0]], dtype=torch.float64)
    mask = _t([[1]])
    loss, _ = policy_loss(logprobs, old, _t([-1e-8]), mask, dual_clip=None)
    assert_close(loss.detach(), _t([[1e-8 * math.exp(20.0)]]))
    assert_close(_grad(loss, logprobs, mask), _t([[0.0]]))


def test_clip_token_level_advantages_match_broadcast_sequence_advantages():
    # advantages (N, T): each token its own A; (N,) broadcasts one A over the row
    #   token A = [[1, -2]], r [1.5, 1.5]: [max(-1.5, -1.2), max(3.0, 2.4)] = [-1.2, 3.0]; grads [0, 3.0]
    logprobs, old = _tokens([[1.5, 1.5]])
    mask = _t([[1, 1]])
    loss, stats = policy_loss(logprobs, old, _t([[1.0, -2.0]]), mask)
    assert_close(loss.detach(), _t([[-1.2, 3.0]]))
    assert_close(_grad(loss, logprobs, mask), _t([[0.0, 3.0]]))
    # clipped: token 0 only -> 1/2; high: token 0 (A > 0, r > 1.2) -> 1/2; low: none
    assert_close(stats.clip_frac, _scalar(1 / 2))
    assert_close(stats.clip_frac_high, _scalar(1 / 2))
    assert_close(stats.clip_frac_low, _scalar(0.0))
    # (N,) and (N, T) with the same value on every token agree
    logprobs, old = _tokens(RATIOS)
    seq_loss, seq_stats = policy_loss(logprobs, old, ADV, MASK)
    tok_loss, tok_stats = policy_loss(logprobs, old, ADV[:, None].expand(2, 4), MASK)
    assert_close(tok_loss, seq_loss)
    assert_close(tok_stats.clip_frac, seq_stats.clip_frac)


def test_clip_docstring_example():
    # ratio e^0.5 = 1.6487 with A = 1 -> clipped at 1.2 -> -1.2; ratio 1 -> -1
    lp, old, m = torch.tensor([[0.0, -1.0]]), torch.tensor([[-0.5, -1.0]]), torch.ones(1, 2)
    loss, stats = policy_loss(lp, old, torch.tensor([1.0]), m)
    assert_close(loss, torch.tensor([[-1.2, -1.0]]))
    # approx_kl = mean(-0.5, 0) = -0.25
    assert_close(stats.approx_kl, _scalar(-0.25))


def test_gspo_sequence_ratio_and_straight_through_gradient():
    # log-ratios (logp - old) and mask:
    #   seq 0, A = +1: [0.0, 0.2, pad 5.0] -> masked mean 0.1 -> s = e^0.1 = 1.1052, inside [0.8, 1.2]
    #                  loss -s on every token; straight-through grad per token -A s = -1.1052
    #   seq 1, A = -1: [-0.4, -0.2, pad 3.0] -> mean -0.3 -> s = e^-0.3 = 0.7408 < 0.8 -> clipped:
    #                  loss max(0.7408, 0.8) = 0.8, grad 0
    #   seq 2, A = -1: [0.2, 0.4, 0.6] -> mean 0.4 -> s = e^0.4 = 1.4918 -> unclipped loss 1.4918, grad 1.4918
    #   seq 3, A = -1: [2.0, 2.0, 2.0] -> s = e^2 = 7.389 -> loss 7.389; no dual clip for gspo despite c = 3,
    #                  grad 7.389
    log_ratio = _t([[0.0, 0.2, 5.0], [-0.4, -0.2, 3.0], [0.2, 0.4, 0.6], [2.0, 2.0, 2.0]])
    old = torch.full_like(log_ratio, -2.0)
    logprobs = (old + log_ratio).requires_grad_(True)
    mask = _t([[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1]])
    adv = _t([1.0, -1.0, -1.0, -1.0])
    loss, stats = policy_loss(logprobs, old, adv, mask, kind="gspo")
    s0, s2, s3 = math.exp(0.1), math.exp(0.4), math.exp(2.0)
    expected = _t([[-s0, -s0, -s0], [0.8, 0.8, 0.8], [s2, s2, s2], [s3, s3, s3]])
    assert_close(loss.detach() * mask, expected * mask)
    assert_close(_grad(loss, logprobs, mask), _t([[-s0, -s0, 0.0], [0.0, 0.0, 0.0], [s2, s2, s2], [s3, s3, s3]]))
    # 10 valid tokens; clipped: seq 1's 2 tokens -> 2/10; low: seq 1 (A < 0, s < 0.8) -> 2/10; high: none; dual: 0
    assert_close(stats.clip_frac, _scalar(2 / 10))
    assert_close(stats.clip_frac_low, _scalar(2 / 10))
    assert_close(stats.clip_frac_high, _scalar(0.0))
    assert_close(stats.dual_clip_frac, _scalar(0.0))
    # approx_kl = -(0 + 0.2 - 0.4 - 0.2 + 0.2 + 0.4 + 0.6 + 2 + 2 + 2) / 10 = -6.8 / 10 = -0.68
    assert_close(stats.approx_kl, _scalar(-0.68))


def test_gspo_sequence_log_ratio_clamped_at_10():
    # log-ratios [12, 12] -> sequence log-ratio 12, clamped to 10 -> s = e^10 = 22026.47; A = -1 -> loss 22026.47
    # the clamp is flat above 10: gradient 0
    old = _t([[-20.0, -20.0]])
    logprobs = (old + 12.0).requires_grad_(True)
    mask = _t([[1, 1]])
    loss, _ = policy_loss(logprobs, old, _t([-1.0]), mask, kind="gspo")
    assert_close(loss.detach(), _t([[math.exp(10.0)] * 2]))
    assert_close(_grad(loss, logprobs, mask), _t([[0.0, 0.0]]))


def test_gspo_asymmetric_clip():
    # clip_high 0.05 -> upper bound 1.05; seq A = +1, log-ratios [0.0, 0.2] -> s = e^0.1 = 1.1052 > 1.05 -> -1.05
    log_ratio = _t([[0.0, 0.2]])
    old = torch.full_like(log_ratio, -1.0)
    logprobs = (old + log_ratio).requires_grad_(True)
    mask = _t([[1, 1]])
    loss, stats = policy_loss(logprobs, old, _t([1.0]), mask, kind="gspo", clip_high=0.05)
    assert_close(loss.detach(), _t([[-1.05, -1.05]]))
    assert_close(_grad(loss, logprobs, mask), _t([[0.0, 0.0]]))
    assert_close(stats.clip_frac_high, _scalar(1.0))


def test_cispo_values_and_gradients():
    # loss = -A * sg(clamp(r, 0.8, 1.2)) * logp: the clipped weight is detached, so every token keeps a gradient
    # -A * w wrt logp, even when clipped (the point of CISPO).
    #   A = +1, logp -1.0, r 1.5 -> w 1.2: loss -1 * 1.2 * -1.0 = 1.2, grad -1.2 (clipped, high)
    #   A = +1, logp -2.0, r 1.1 -> w 1.1: loss 2.2, grad -1.1
    #   A = -1, logp -0.5, r 0.5 -> w 0.8: loss 1 * 0.8 * -0.5 = -0.4, grad 0.8 (clipped, low)
    #   A = -1, logp -1.0, r 5.0 -> w 1.2: loss -1.2, grad 1.2 (clipped, no dual clip for cispo)
    logp = _t([[-1.0, -2.0, -0.5, -1.0]])
    ratio = _t([[1.5, 1.1, 0.5, 5.0]])
    old = logp - ratio.log()
    logprobs = logp.clone().requires_grad_(True)
    adv = _t([[1.0, 1.0, -1.0, -1.0]])
    mask = _t([[1, 1, 1, 1]])
    loss, stats = policy_loss(logprobs, old, adv, mask, kind="cispo")
    assert_close(loss.detach(), _t([[1.2, 2.2, -0.4, -1.2]]))
    assert_close(_grad(loss, logprobs, mask), _t([[-1.2, -1.1, 0.8, 1.2]]))
    # clipped weights: r 1.5, 0.5, 5.0 -> 3/4; low: A < 0, r 0.5 -> 1/4; high: A > 0, r 1.5 -> 1/4; dual: 0
    assert_close(stats.clip_frac, _scalar(3 / 4))
    assert_close(stats.clip_frac_low, _scalar(1 / 4))
    assert_close(stats.clip_frac_high, _scalar(1 / 4))
    assert_close(stats.dual_clip_frac, _scalar(0.0))
    # approx_kl = mean(-ln r) = -(ln 1.5 + ln 1.1 + ln 0.5 + ln 5) / 4 = -ln(4.125) / 4 = -0.3543
    assert_close(stats.approx_kl, _scalar(-math.log(1.5 * 1.1 * 0.5 * 5.0) / 4))


def test_old_logprobs_receive_no_gradient():
    # old_logprobs come from the sampling policy: even if they carry autograd history, the loss must not push them
    logprobs, old = _tokens([[1.1, 0.9]])
    old.requires_grad_(True)
    loss, _ = policy_loss(logprobs, old, _t([1.0]), _t([[1, 1]]))
    loss.sum().backward()
    assert old.grad is None
    # d/dlogp of -A r: [-1.1, -0.9]
    assert_close(logprobs.grad, _t([[-1.1, -0.9]]))


def test_float32_inputs_stay_float32():
    # ratio 1 everywhere, A = [1, -1]: loss [-1, 1]
    lp = torch.zeros(2, 3)
    loss, stats = policy_loss(lp, lp.clone(), torch.tensor([1.0, -1.0]), torch.ones(2, 3))
    assert loss.dtype == torch.float32
    assert_close(loss, torch.tensor([[-1.0] * 3, [1.0] * 3]))
    assert_close(stats.clip_frac, _scalar(0.0))
    assert_close(stats.approx_kl, _scalar(0.0))


def test_stats_ignore_non_finite_padding():
    # valid token: old -0.5, logp -1.0 -> approx_kl = mean(old - logp) over valid tokens = 0.5; padding holds NaN
    logprobs = torch.tensor([[-1.0, 0.0]])
    old = torch.tensor([[-0.5, float("nan")]])
    mask = torch.tensor([[1.0, 0.0]])
    _, stats = policy_loss(logprobs, old, torch.tensor([1.0]), mask)
    assert_close(stats.approx_kl, _scalar(0.5))


def test_gspo_sequence_mean_ignores_non_finite_padding():
    # valid tokens: log-ratios [0.0, 0.2] -> s = e^0.1 = 1.1052; A = 1 -> loss -1.1052; padding old_logprobs NaN
    logprobs = torch.tensor([[-1.0, -0.8, 0.0]])
    old = torch.tensor([[-1.0, -1.0, float("nan")]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, _ = policy_loss(logprobs, old, torch.tensor([1.0]), mask, kind="gspo")
    assert_close(loss[:, :2], torch.full((1, 2), -math.exp(0.1)))


def test_cispo_padding_carries_no_gradient_even_with_non_finite_old_logprobs():
    # padded position: old NaN -> the detached weight is NaN there; masking the weight keeps the gradient at 0
    logprobs = torch.tensor([[-1.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.0, float("nan")]])
    mask = torch.tensor([[1.0, 0.0]])
    loss, _ = policy_loss(logprobs, old, torch.tensor([2.0]), mask, kind="cispo")
    (grad,) = torch.autograd.grad(loss.sum(), logprobs)
    assert_close(grad, torch.tensor([[-2.0, 0.0]]))  # ratio 1 -> weight 1 -> d(-A·w·logp)/dlogp = -A = -2
