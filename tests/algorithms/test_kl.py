"""Worked examples for ``kl_penalty``: values and gradients wrt ``logprobs`` of every estimator.

``d = ref_logprobs - logprobs``, so ``dd / dlogp = -1``. With ``logprobs = [-1, -2]`` and ``ref_logprobs =
[-1.5, -1]``: ``d = [-0.5, 1.0]``.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.algorithms import KL_ESTIMATORS, kl_penalty

REF = [[-1.5, -1.0]]
LOGP = [[-1.0, -2.0]]

# value, gradient wrt logp
EXPECTED = {
    # k1 = -d = logp - ref: [0.5, -1.0]; grad +1
    "k1": ([0.5, -1.0], [1.0, 1.0]),
    # abs = |d|: [0.5, 1.0]; grad -sign(d) = [1, -1]
    "abs": ([0.5, 1.0], [1.0, -1.0]),
    # k2 = 0.5 d^2: [0.125, 0.5]; grad -d = [0.5, -1.0]
    "k2": ([0.125, 0.5], [0.5, -1.0]),
    # k3 = e^d - d - 1: [e^-0.5 + 0.5 - 1, e - 2] = [0.1065, 0.7183]; grad -(e^d - 1) = [0.3935, -1.7183]
    "k3": ([math.exp(-0.5) - 0.5, math.e - 2.0], [1.0 - math.exp(-0.5), 1.0 - math.e]),
}
ALIASES = {"k1": "k1", "kl": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}
K2_GRAD = EXPECTED["k2"][1]  # "+" variants: gradient of k2, -d = [0.5, -1.0]


def _value_and_grad(kind, logp=LOGP, ref=REF):
    logprobs = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    kl = kl_penalty(logprobs, torch.tensor(ref, dtype=torch.float64), kind)
    kl.sum().backward()
    return kl.detach(), logprobs.grad


def _t(values):
    return torch.tensor([values], dtype=torch.float64)


@pytest.mark.parametrize("kind", list(ALIASES))
def test_estimator_value_and_gradient(kind):
    value, grad = _value_and_grad(kind)
    expected_value, expected_grad = EXPECTED[ALIASES[kind]]
    assert_close(value, _t(expected_value))
    assert_close(grad, _t(expected_grad))


@pytest.mark.parametrize("kind", list(ALIASES))
def test_plus_variant_keeps_value_takes_k2_gradient(kind):
    # "<name>+": value of <name>, gradient of k2 (straight-through), i.e. -d = logp - ref = [0.5, -1.0]
    value, grad = _value_and_grad(f"{kind}+")
    assert_close(value, _t(EXPECTED[ALIASES[kind]][0]))
    assert_close(grad, _t(K2_GRAD))


def test_catalogue_holds_every_name():
    names = {"k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"}
    assert set(KL_ESTIMATORS) == names | {f"{n}+" for n in names}


def test_identical_policies_give_zero():
    # d = 0: k1 0, abs 0, k2 0, k3 e^0 - 0 - 1 = 0
    for kind in KL_ESTIMATORS:
        value, _ = _value_and_grad(kind, logp=[[-0.7, -3.0]], ref=[[-0.7, -3.0]])
        assert_close(value, _t([0.0, 0.0]))


def test_k3_docstring_example():
    # d = -1.5 - (-1) = -0.5: e^-0.5 + 0.5 - 1 = 0.1065
    out = kl_penalty(torch.tensor([[-1.0]]), torch.tensor([[-1.5]]), "k3")
    assert_close(out, torch.tensor([[math.exp(-0.5) - 0.5]]))


def test_k3_clamps():
    # d = 30: clamped to 20 -> e^20 - 21 = 4.85e8 -> result clamped to 10; both clamps flat: grad 0
    # d = -30: clamped to -20 -> e^-20 + 20 - 1 = 19.0 -> clamped to 10; grad 0
    # d = 3: e^3 - 4 = 16.09 -> clamped to 10; grad 0 (the result clamp is flat)
    # d = 2: e^2 - 3 = 4.389, inside both clamps; grad 1 - e^2 = -6.389
    ref = [[0.0, 0.0, 0.0, 0.0]]
    logp = [[-30.0, 30.0, -3.0, -2.0]]
    value, grad = _value_and_grad("k3", logp=logp, ref=ref)
    assert_close(value, _t([10.0, 10.0, 10.0, math.exp(2.0) - 3.0]))
    assert_close(grad, _t([0.0, 0.0, 0.0, 1.0 - math.exp(2.0)]))
    assert torch.isfinite(value).all()


def test_k3_plus_clamped_value_unclamped_k2_gradient():
    # d = 30: value 10 (clamped k3), gradient of k2 = -d = -30 (straight-through ignores the clamp)
    value, grad = _value_and_grad("k3+", logp=[[-30.0]], ref=[[0.0]])
    assert_close(value, _t([10.0]))
    assert_close(grad, _t([-30.0]))


def test_gradient_wrt_ref_logprobs_is_opposite():
    # the estimator is a function of d alone, dd/dref = +1 = -dd/dlogp: for k2, grad wrt ref is d = [-0.5, 1.0]
    logprobs = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    ref = torch.tensor(REF, dtype=torch.float64, requires_grad=True)
    kl_penalty(logprobs, ref, "k2").sum().backward()
    assert_close(ref.grad, _t([-0.5, 1.0]))
    assert_close(logprobs.grad, _t([0.5, -1.0]))


def test_default_kind_is_k3_and_dtype_preserved():
    # float32 in, float32 out; default kind k3: d = -0.5 -> 0.1065, d = 1 -> e - 2 = 0.7183
    out = kl_penalty(torch.tensor(LOGP), torch.tensor(REF))
    assert out.dtype == torch.float32
    assert_close(out, torch.tensor([[math.exp(-0.5) - 0.5, math.e - 2.0]]))
