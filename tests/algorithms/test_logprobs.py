"""Worked examples for ``selective_logprobs`` and ``entropy_from_logits``.

Hand case used throughout: logits ``[0, ln 3]`` give ``p = softmax = [1/4, 3/4]``, so
``log p = [ln 0.25, ln 0.75] = [-1.3863, -0.2877]`` and the entropy is
``-(0.25 ln 0.25 + 0.75 ln 0.75) = 0.3466 + 0.2158 = 0.5623``.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.algorithms import entropy_from_logits, selective_logprobs

LN3 = math.log(3.0)
H_QUARTER = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.5623


def test_uniform_logits():
    # V = 4, every logit 0: p = 1/4 everywhere -> log p = -ln 4 = -1.3863, entropy ln 4 = 1.3863
    logits = torch.zeros(2, 3, 4)  # (N, T, V)
    ids = torch.tensor([[0, 1, 2], [3, 3, 0]])
    logp = selective_logprobs(logits, ids)
    assert logp.shape == (2, 3) and logp.dtype == torch.float32
    assert_close(logp, torch.full((2, 3), -math.log(4.0)))
    assert_close(entropy_from_logits(logits), torch.full((2, 3), math.log(4.0)))


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_uniform_logits_any_temperature(temperature):
    # 0 / T = 0: still uniform over V = 5 -> -ln 5 and ln 5
    logits = torch.zeros(1, 2, 5)
    assert_close(
        selective_logprobs(logits, torch.tensor([[1, 4]]), temperature=temperature), torch.full((1, 2), -math.log(5))
    )
    assert_close(entropy_from_logits(logits, temperature=temperature), torch.full((1, 2), math.log(5)))


def test_hand_case():
    # rows [0, ln3] and [ln3, 0]: p = [1/4, 3/4] and [3/4, 1/4]
    logits = torch.tensor([[[0.0, LN3], [LN3, 0.0]]])  # (1, 2, 2)
    # token 1 of row 0 -> ln 0.75 = -0.2877; token 1 of row 1 -> ln 0.25 = -1.3863
    assert_close(selective_logprobs(logits, torch.tensor([[1, 1]])), torch.tensor([[math.log(0.75), math.log(0.25)]]))
    # entropy is symmetric in the order of the probabilities: 0.5623 for both
    assert_close(entropy_from_logits(logits), torch.tensor([[H_QUARTER, H_QUARTER]]))


@pytest.mark.parametrize(("temperature", "scale"), [(2.0, 2.0), (0.5, 0.5)])
def test_temperature_divides_logits(temperature, scale):
    # logits [0, T ln3] / T = [0, ln3] -> the hand case: log p(1) = ln 0.75, entropy 0.5623
    logits = torch.tensor([[0.0, scale * LN3]])
    assert_close(selective_logprobs(logits, torch.tensor([1]), temperature=temperature), torch.tensor([math.log(0.75)]))
    assert_close(entropy_from_logits(logits, temperature=temperature), torch.tensor([H_QUARTER]))


def test_temperature_changes_the_distribution():
    # logits [0, ln3] at T = 2: [0, ln3 / 2] = [0, ln sqrt3] -> p = [1, sqrt3] / (1 + sqrt3) = [0.3660, 0.6340]
    logits = torch.tensor([[0.0, LN3]])
    s3 = math.sqrt(3.0)
    p = [1 / (1 + s3), s3 / (1 + s3)]
    assert_close(selective_logprobs(logits, torch.tensor([0]), temperature=2.0), torch.tensor([math.log(p[0])]))
    # entropy -(0.3660 ln 0.3660 + 0.6340 ln 0.6340) = 0.6568
    entropy = -(p[0] * math.log(p[0]) + p[1] * math.log(p[1]))
    assert_close(entropy_from_logits(logits, temperature=2.0), torch.tensor([entropy]))


def test_bf16_logits():
    # bf16 logits [0, 1, 2, 3] (exact in bf16); result in float32:
    #   log p(3) = 3 - ln(1 + e + e^2 + e^3) = 3 - ln 31.1929 = 3 - 3.4402 = -0.4402
    #   log p(0) = 0 - 3.4402 = -3.4402
    logits = torch.tensor([[[0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0]]], dtype=torch.bfloat16)
    logp = selective_logprobs(logits, torch.tensor([[3, 0]]))
    assert logp.dtype == torch.float32
    lse = math.log(1 + math.e + math.e**2 + math.e**3)
    assert_close(logp, torch.tensor([[3.0 - lse, -lse]]))
    # entropy = lse - sum p x with p = e^x / 31.1929: sum p x = (e + 2e^2 + 3e^3) / 31.1929 = 2.4553 -> 0.9849
    z = 1 + math.e + math.e**2 + math.e**3
    mean_x = (math.e + 2 * math.e**2 + 3 * math.e**3) / z
    entropy = entropy_from_logits(logits)
    assert entropy.dtype == torch.float32
    assert_close(entropy, torch.tensor([[lse - mean_x] * 2]))


def test_bf16_large_logits_stay_finite():
    # logits 1000 and 992 (exact in bf16): a float32 logsumexp is stable.
    # log p(0) = -ln(1 + e^-8) = -3.3541e-4; log p(1) = -8 - ln(1 + e^-8) = -8.000335
    logits = torch.tensor([[1000.0, 992.0], [1000.0, 992.0]], dtype=torch.bfloat16)
    logp = selective_logprobs(logits, torch.tensor([0, 1]))
    c = math.log1p(math.exp(-8.0))
    # float32 resolves numbers near 1000 to one ulp = 6.1e-5 (x - lse subtracts two such numbers): atol 1e-4
    assert_close(logp, torch.tensor([-c, -8.0 - c]), atol=1e-4, rtol=0)
    assert torch.isfinite(logp).all()


# Four rows with V = 2, tokens [0, 1, 1, 0]:
#   [0, 0]    p [1/2, 1/2]   token 0 -> ln 0.5;  entropy ln 2
#   [0, ln3]  p [1/4, 3/4]   token 1 -> ln 0.75; entropy 0.5623
#   [ln3, 0]  p [3/4, 1/4]   token 1 -> ln 0.25; entropy 0.5623
#   [ln3, 0]  p [3/4, 1/4]   token 0 -> ln 0.75; entropy 0.5623
ROWS = [[0.0, 0.0], [0.0, LN3], [LN3, 0.0], [LN3, 0.0]]
IDS = [0, 1, 1, 0]
EXPECTED_LOGP = [math.log(0.5), math.log(0.75), math.log(0.25), math.log(0.75)]
EXPECTED_H = [math.log(2.0), H_QUARTER, H_QUARTER, H_QUARTER]


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 1024])  # one row at a time, uneven last chunk, exact, > rows
def test_chunk_sizes(chunk_size):
    logits = torch.tensor(ROWS).view(2, 2, 2)  # (N, T, V) -> 4 rows
    ids = torch.tensor(IDS).view(2, 2)
    assert_close(selective_logprobs(logits, ids, chunk_size=chunk_size), torch.tensor(EXPECTED_LOGP).view(2, 2))
    assert_close(entropy_from_logits(logits, chunk_size=chunk_size), torch.tensor(EXPECTED_H).view(2, 2))


@pytest.mark.parametrize("chunk_size", [1, 3, 1024])
def test_logprob_gradient(chunk_size):
    # d log p_y / d logits = onehot(y) - p; weighted by the upstream gradient w = [1, 2, -1, 0.5]:
    #   row 0 (p [.5, .5],  y 0): 1    * [0.5, -0.5]    = [0.5, -0.5]
    #   row 1 (p [.25, .75], y 1): 2    * [-0.25, 0.25] = [-0.5, 0.5]
    #   row 2 (p [.75, .25], y 1): -1   * [-0.75, 0.75] = [0.75, -0.75]
    #   row 3 (p [.75, .25], y 0): 0.5  * [0.25, -0.25] = [0.125, -0.125]
    logits = torch.tensor(ROWS, requires_grad=True)
    w = torch.tensor([1.0, 2.0, -1.0, 0.5])
    (selective_logprobs(logits, torch.tensor(IDS), chunk_size=chunk_size) * w).sum().backward()
    expected = torch.tensor([[0.5, -0.5], [-0.5, 0.5], [0.75, -0.75], [0.125, -0.125]])
    assert_close(logits.grad, expected)


def test_logprob_gradient_with_temperature():
    # logits [0, 2 ln3], T = 2 -> x = [0, ln3], p [1/4, 3/4], y = 1: (onehot - p) / T = [-0.25, 0.25] / 2
    logits = torch.tensor([[0.0, 2 * LN3]], requires_grad=True)
    selective_logprobs(logits, torch.tensor([1]), temperature=2.0).sum().backward()
    assert_close(logits.grad, torch.tensor([[-0.125, 0.125]]))


@pytest.mark.parametrize("chunk_size", [1, 1024])
def test_entropy_gradient(chunk_size):
    # dH/dx = -p (x - E_p[x]); row [0, ln3]: E[x] = 0.75 ln3 = 0.8240
    #   -> [-0.25 * (0 - 0.8240), -0.75 * (1.0986 - 0.8240)] = [0.2060, -0.2060]
    # row [0, 0]: uniform, x - E[x] = 0 -> [0, 0] (entropy is at its maximum)
    logits = torch.tensor([[0.0, LN3], [0.0, 0.0]], requires_grad=True)
    entropy_from_logits(logits, chunk_size=chunk_size).sum().backward()
    g = 0.25 * 0.75 * LN3  # 0.2060
    assert_close(logits.grad, torch.tensor([[g, -g], [0.0, 0.0]]))


def test_entropy_gradient_with_temperature():
    # logits [0, 2 ln3], T = 2: x = [0, ln3] as above, and dx/dlogits = 1/2 -> [0.1030, -0.1030]
    logits = torch.tensor([[0.0, 2 * LN3]], requires_grad=True)
    entropy_from_logits(logits, temperature=2.0).sum().backward()
    g = 0.25 * 0.75 * LN3 / 2
    assert_close(logits.grad, torch.tensor([[g, -g]]))


def test_bf16_gradient_dtype():
    # gradient in the logits' dtype; values as in the hand case: [-0.25, 0.25] (exact in bf16)
    logits = torch.tensor([[0.0, LN3]], dtype=torch.bfloat16, requires_grad=True)
    selective_logprobs(logits, torch.tensor([1])).sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    # bf16 ln3 = 1.1016 (not 1.0986): p(1) = 3.0090 / 4.0090 = 0.7506 -> grad [-0.2494, 0.2494], within bf16 tolerance
    assert_close(logits.grad, torch.tensor([[-0.25, 0.25]], dtype=torch.bfloat16))


def test_int32_token_ids_and_docstring_example():
    # logits [0, 0]: log(1/2) = -0.6931 whatever the integer dtype of the ids
    logits = torch.tensor([[[0.0, 0.0]]])
    for ids in (torch.tensor([[1]]), torch.tensor([[1]], dtype=torch.int32)):
        assert_close(selective_logprobs(logits, ids), torch.tensor([[-math.log(2.0)]]))


def test_non_contiguous_logits():
    # a transposed view: positions are read through the view, not the storage order
    # base[t, n]: [[[0, 0], [0, ln3]], [[ln3, 0], [ln3, 0]]]; logits[n, t] = base[t, n]
    #   logits[0] = rows [0, 0], [ln3, 0]; logits[1] = rows [0, ln3], [ln3, 0]
    # ids [[0, 1], [1, 0]] -> [[ln 0.5, ln 0.25], [ln 0.75, ln 0.75]]
    base = torch.tensor([[[0.0, 0.0], [0.0, LN3]], [[LN3, 0.0], [LN3, 0.0]]])  # (T, N, V)
    logits = base.transpose(0, 1)  # (N, T, V), non-contiguous
    assert not logits.is_contiguous()
    logp = selective_logprobs(logits, torch.tensor([[0, 1], [1, 0]]), chunk_size=1)
    expected = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.75), math.log(0.75)]])
    assert_close(logp, expected)
