"""Every tensor the algorithms, the output heads, the callbacks' statistics and the non-finite checks create is made
on the device of their inputs (docs/benchmarks.md, "GPU readiness").

The inputs live on the CPU while torch's default device is ``meta``: a tensor created without ``device=`` lands on
meta, and mixing it with the CPU inputs raises, as a CPU tensor mixed into CUDA ones would on a GPU. The outputs
must be CPU tensors with real values.
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    aggregate_loss,
    compute_advantages,
    entropy_from_logits,
    fused_head_logprobs,
    kl_penalty,
    policy_loss,
    selective_logprobs,
)
from lightning_grpo.algorithms.rollout_correction import rollout_weights
from lightning_grpo.callbacks.agent_stats import agent_metrics
from lightning_grpo.callbacks.group_rewards import group_reward_stats, process_stats
from lightning_grpo.iteration.nonfinite import gradient_flag, nonfinite_flags
from lightning_grpo.metrics import reduce_across_ranks
from lightning_grpo.policy.finite import NonFiniteError, check_finite
from lightning_grpo.rewards import RewardScores
from tests.callbacks.test_agent_stats import _rollout, _turns

N, T, V = 6, 5, 40


@pytest.fixture
def x() -> dict[str, torch.Tensor]:
    """The inputs, made on the CPU; then torch's default device is ``meta`` for the rest of the test."""
    inputs = _inputs()
    torch.set_default_device("meta")
    yield inputs
    torch.set_default_device(None)


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(N, T)
    mask[1, 3:] = 0
    step_rewards = torch.full((N, T), math.nan)
    step_rewards[:, 1], step_rewards[::2, 4] = torch.arange(N, dtype=torch.float32), 1.0
    return {
        "rewards": torch.tensor([1.0, 0.0, 0.5, 0.5, math.nan, 2.0]),
        "group_ids": torch.tensor([0, 0, 1, 1, 2, 2]),
        "mask": mask,
        "logprobs": -torch.rand(N, T, generator=g),
        "old": -torch.rand(N, T, generator=g),
        "step_rewards": step_rewards,
        "logits": torch.randn(N, T, V, generator=g),
        "targets": torch.randint(V, (N, T), generator=g),
    }


def _on_cpu(value: torch.Tensor) -> torch.Tensor:
    assert value.device.type == "cpu", value.device
    return value


@pytest.mark.parametrize("estimator", ADVANTAGE_ESTIMATORS)
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages(x, estimator, scale):
    steps = x["step_rewards"] if estimator == "grpo_process" else None
    functions = {"f": x["rewards"], "g": x["rewards"] ** 2}  # gdpo reads them; the others ignore them
    advantages = compute_advantages(x["rewards"], x["group_ids"], estimator=estimator, scale=scale,
                                    completion_mask=x["mask"], sum_across_ranks=reduce_across_ranks,
                                    step_rewards=steps, function_rewards=functions)  # fmt: skip
    assert torch.isfinite(_on_cpu(advantages)).all()


@pytest.mark.parametrize("kind", POLICY_LOSSES)
def test_policy_losses_kl_and_aggregation(x, kind):
    logprobs = x["logprobs"].requires_grad_()
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 2.0], device="cpu")
    per_token, stats = policy_loss(logprobs, x["old"], advantages, x["mask"], kind=kind)
    for estimator in KL_ESTIMATORS:
        per_token = per_token + kl_penalty(logprobs, x["old"], estimator)
    for mode in LOSS_AGG_MODES:
        loss = aggregate_loss(per_token, x["mask"], mode, num_tokens=x["mask"].sum(), num_sequences=6.0, norm=5.0)
        _on_cpu(loss).backward(retain_graph=True)
    assert torch.isfinite(_on_cpu(logprobs.grad)).all()
    assert all(_on_cpu(value).isfinite().all() for value in vars(stats).values() if isinstance(value, torch.Tensor))
    weights = rollout_weights(x["old"], x["logprobs"], x["mask"], "token_truncate", None, 2.0)
    assert _on_cpu(weights).max() <= 2.0


@pytest.mark.parametrize("tile_bytes", [None, 4096])
def test_output_heads(x, tile_bytes):
    hidden = torch.randn(N, T, 8, device="cpu", requires_grad=True)
    weight = torch.randn(V, 8, device="cpu", requires_grad=True)
    logprobs, entropy = fused_head_logprobs(hidden, weight, None, x["targets"], temperature=0.7, with_entropy=True,
                                            tile_bytes=tile_bytes)  # fmt: skip
    (_on_cpu(logprobs).sum() + _on_cpu(entropy).sum()).backward()
    assert _on_cpu(hidden.grad).abs().sum() > 0 and _on_cpu(weight.grad).abs().sum() > 0
    explicit = selective_logprobs(x["logits"], x["targets"], temperature=0.7, chunk_size=4)
    assert _on_cpu(explicit).shape == (N, T)
    assert _on_cpu(entropy_from_logits(x["logits"], chunk_size=4)).shape == (N, T)


def test_callback_statistics(x):
    per_function = {"a": x["rewards"], "b": torch.tensor([0.0, 1.0, math.nan, 1.0, 0.0, 0.0], device="cpu")}
    scores = RewardScores(x["rewards"], per_function, {"a": 0.0, "b": 0.0}, {}, x["step_rewards"])
    stats = group_reward_stats(scores, x["group_ids"], x["logprobs"], x["mask"], reduce_across_ranks)
    assert all(_on_cpu(value).isfinite().all() for value in stats.values())
    assert _on_cpu(process_stats(x["step_rewards"], reduce_across_ranks)["process/steps_mean"]) == 9 / 6
    with torch.device("cpu"):
        rollout = _rollout(_turns())
    assert all(_on_cpu(value).isfinite().all() for value in agent_metrics(rollout).values())


def test_nonfinite_checks(x):
    loss = torch.tensor(1.0, device="cpu")
    flags = nonfinite_flags(loss, {"pg_loss": loss, "kl": torch.tensor([math.inf], device="cpu")})
    assert _on_cpu(flags).tolist() == [0.0, 0.0, 1.0, 0.0]
    layer = torch.nn.Linear(3, 2, device="cpu")
    layer(torch.ones(1, 3, device="cpu")).sum().backward()
    assert _on_cpu(gradient_flag(layer.parameters(), torch.device("cpu"))).tolist() == [0.0]
    layer.bias.grad[0] = math.nan
    assert _on_cpu(gradient_flag(layer.parameters(), torch.device("cpu"))).tolist() == [1.0]
    with pytest.raises(NonFiniteError, match="1 non-finite value"):
        check_finite([("bias", layer.bias.grad)], "write the adapter")
