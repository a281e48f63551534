"""Parity of ``advantage_estimator="gdpo"`` with TRL 1.16's ``multi_objective_aggregation="normalize_then_sum"``.

TRL's ``GRPOTrainer._generate_and_score_completions`` runs on a tiny model with its reward computation replaced by
fixed per-function rewards (its generation still runs; the completions do not matter); the advantages it returns
are compared with ours on the same rewards, weights and ``advantage_eps=1e-4`` (TRL's fixed epsilon), with an
unscorable row (every function ``None``) and a function that skipped a whole group.
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.algorithms import compute_advantages
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

NAN = math.nan
G = 4
# 2 prompts x G completions, 2 reward functions (columns); row 6 unscorable; function 1 skipped all of group 0.
PER_FUNCTION = [
    [1.0, NAN], [0.0, NAN], [1.0, NAN], [3.0, NAN],
    [0.5, 2.0], [0.0, 1.0], [NAN, NAN], [2.0, 0.0],
]  # fmt: skip
WEIGHTS = [1.0, 0.5]


def _never(completions, **_):  # TRL needs reward functions; their outputs are replaced
    return [0.0] * len(completions)


def _also_never(completions, **_):
    return [0.0] * len(completions)


def _trl_advantages(tmp_path, per_function: torch.Tensor) -> torch.Tensor:
    tokenizer = build_tiny_tokenizer()
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2 * G, num_generations=G, max_completion_length=4,
        multi_objective_aggregation="normalize_then_sum", reward_weights=WEIGHTS, report_to="none", use_cpu=True,
        bf16=False, beta=0.0,
    )  # fmt: skip
    dataset = datasets.Dataset.from_dict({"prompt": ["1+1=", "2+5="]})
    trainer = trl.GRPOTrainer(model=build_tiny_model(tokenizer), reward_funcs=[_never, _also_never], args=args,
                              train_dataset=dataset, processing_class=tokenizer)  # fmt: skip
    trainer._calculate_rewards = lambda *_args, **_kw: per_function.clone()
    inputs = [{"prompt": p} for p in ["1+1="] * G + ["2+5="] * G]
    return trainer._generate_and_score_completions(inputs)["advantages"].double()


def test_gdpo_equals_trl_normalize_then_sum(tmp_path):
    per_function = torch.tensor(PER_FUNCTION, dtype=torch.float32)
    theirs = _trl_advantages(tmp_path, per_function)
    functions = {"f0": per_function[:, 0], "f1": per_function[:, 1]}
    weighted = (per_function * torch.tensor(WEIGHTS)).nansum(1)
    weighted[torch.isnan(per_function).all(1)] = NAN
    ours = compute_advantages(
        weighted, torch.arange(2).repeat_interleave(G), estimator="gdpo", eps=1e-4, function_rewards=functions,
        function_weights=dict(zip(functions, WEIGHTS, strict=True)),
    )  # fmt: skip
    assert theirs[6] == 0 and ours[6] == 0  # the unscorable row
    torch.testing.assert_close(ours.double(), theirs, rtol=1e-5, atol=1e-6)
    assert float(ours.abs().max()) > 0.5
