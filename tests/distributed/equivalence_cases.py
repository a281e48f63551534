"""The equivalence cases: one optimizer step on an injected rollout whose result must not depend on world size.

Two ranks each train on their half of :data:`COMPLETIONS` (groups stay whole); one process trains on all of it. Each
case of :data:`EQUIVALENCE_CASES` sets the loss aggregation, micro-batches, advantages, corrections or clipping, and
the adapter after the step (and the logged metrics) must agree between the two.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_grpo import GRPOModule, PolicyConfig, Rollout
from tests.conftest import make_trainer, prompt_loader
from tests.distributed.builders import G, build_module, merged, perturb_adapter
from tests.distributed.ranks import make_strategy, world_of
from tests.module.helpers import FixedRolloutModule, fixed_rollout

PROMPTS_PER_RANK = 2
# Two ranks x 2 prompts x G completions of uneven lengths ("..." = truncated): micro-batches differ in token count.
COMPLETIONS = [
    *["aaaa", "ab", "abcdefgha", "b..."],
    *["a", "aab", "xyzxyzxyz...", "aaaaaaaab"],
    *["ba", "c", "aaxaa", "q"],
    *["abab abab", "zz", "a...", "aaaaaaaaaaaa"],
]
PROMPTS = [p for p in ("1+2=", "3+4=", "5+6=", "7+8=") for _ in range(G)]

#: Settings of the equivalence cases: loss aggregation, micro-batch size, advantage scale, clipping.
EQUIVALENCE_CASES: dict[str, dict[str, Any]] = {
    "token-mean-micro2": {"objective": {"loss_agg_mode": "token-mean"}, "update": {"micro_batch_size": 2}},
    "token-mean-micro4-batch-std": {
        "objective": {"loss_agg_mode": "token-mean"},
        "update": {"micro_batch_size": 4},
        "advantages": {"advantage_scale": "batch"},
    },
    "seq-mean-token-mean-micro2": {
        "objective": {"loss_agg_mode": "seq-mean-token-mean"},
        "update": {"micro_batch_size": 2},
    },
    "seq-mean-token-mean-whole": {
        "objective": {"loss_agg_mode": "seq-mean-token-mean"},
        "update": {"micro_batch_size": None},
    },
    # Clipping normalises away a scale error, but catches a gradient norm taken over one rank's shard only.
    "token-mean-micro2-clipped": {
        "objective": {"loss_agg_mode": "token-mean"},
        "update": {"micro_batch_size": 2, "max_grad_norm": 0.1},
    },
    # Packing (on by default where exact) and token budgets: the ranks' rows need 6 and 5 (17 tokens) or 4 and 3 (26
    # tokens) micro-batches, so the ranks must agree on the count; a padded twin of token-mean-micro2 to compare with.
    "token-mean-micro2-padded": {
        "objective": {"loss_agg_mode": "token-mean"},
        "update": {"micro_batch_size": 2, "packing": False},
    },
    "token-mean-packed-tokens17": {
        "objective": {"loss_agg_mode": "token-mean"},
        "update": {"packing": True, "micro_batch_tokens": 17},
    },
    "seq-mean-token-mean-padded-tokens26": {
        "objective": {"loss_agg_mode": "seq-mean-token-mean"},
        "update": {"packing": False, "micro_batch_tokens": 26, "micro_batch_size": 3},
    },
    # Issue 37's policy losses, two passes (the second off-policy): per-token and per-sequence pieces hold over ranks.
    "sapo-micro2-epochs2": {"objective": {"loss_kind": "sapo"}, "update": {"micro_batch_size": 2, "ppo_epochs": 2}},
    "gmpo-seq-mean-micro2-epochs2": {
        "objective": {"loss_kind": "gmpo", "loss_agg_mode": "seq-mean-token-mean"},
        "update": {"micro_batch_size": 2, "ppo_epochs": 2},
    },
    "dppo_tv-micro2-epochs2": {
        "objective": {"loss_kind": "dppo_tv", "loss_kind_args": {"threshold_low": 0.01, "threshold_high": 0.01}},
        "update": {"micro_batch_size": 2, "ppo_epochs": 2},
    },
    # Issue 38's per-token and per-row pieces (rollout weights, OPSM, importance-weighted KL) and the adaptive entropy
    # control, whose next coefficient comes from the step's global entropy: equal on both ranks and to one process.
    "off-policy-adaptive-micro2": {
        "update": {"micro_batch_size": 2},
        "corrections": {
            "rollout_correction": "token_truncate",
            "rollout_correction_args": {"min": 0.5, "max": 2.0},
            "off_policy_mask": "opsm",
            "off_policy_mask_args": {"threshold": 2.5},
        },
        "objective": {
            "kl_weighting": "importance",
            "entropy_control": "adaptive",
            "entropy_control_args": {"target": 50.0, "delta": 0.01},
        },
    },
    # Process supervision (grpo_process): the batch std of every step reward of the global batch, and an outcome step.
    "process-batch-std-micro2": {
        "update": {"micro_batch_size": 2},
        "advantages": {
            "advantage_estimator": "grpo_process",
            "advantage_scale": "batch",
            "process_outcome_weight": 0.5,
        },
        "reward_funcs": "process",
    },
    # Issue 37's estimators with batch statistics summed over ranks: GDPO's whitening of the per-function sums,
    # REINFORCE++'s token whitening, GPG's alpha (valid rows over rows in groups with a spread).
    "gdpo-micro2": {
        "update": {"micro_batch_size": 2},
        "advantages": {"advantage_estimator": "gdpo"},
        "reward_funcs": "two",
    },
    "reinforce-pp-micro2": {
        "update": {"micro_batch_size": 2},
        "advantages": {"advantage_estimator": "reinforce_plus_plus", "advantage_estimator_args": {"gamma": 0.9}},
    },
    "gpg-micro2": {"update": {"micro_batch_size": 2}, "advantages": {"advantage_estimator": "gpg"}},
}


class RankSliceModule(FixedRolloutModule):
    """Trains on this rank's slice of ``self.fixed``: ranks split the rows, groups stay whole."""

    def generate(self, batch: Any, *, num_generations: int | None = None, temperature: float | None = None) -> Rollout:
        n = len(self.fixed) // self.trainer.world_size
        rows = torch.arange(self.global_rank * n, (self.global_rank + 1) * n)
        part = self.fixed.select(rows)
        part.group_ids = part.group_ids - part.group_ids.min()
        return part.to(self.device)


def equivalence_case(strategy: str, case: str) -> tuple[GRPOModule, Any]:
    """One SGD step (no clipping) on the injected rollout; the adapter after it must not depend on world size."""
    settings = merged({"objective": {"kl_coef": 0.1}, "update": {"max_grad_norm": None}}, EQUIVALENCE_CASES[case])
    module = build_module(RankSliceModule, lr=0.5, sgd=True, **settings)
    module.fixed = fixed_rollout(module.tokenizer, PROMPTS, COMPLETIONS, group_size=G)
    if settings.get("corrections", {}).get("rollout_correction"):  # behaviour log-probs of a sampler: uneven values
        ids = module.fixed.completion_ids
        module.fixed.logprobs = -1.0 - 0.25 * (ids % 7).float()
    perturb_adapter(module)
    trainer = make_trainer(devices=world_of(strategy), strategy=make_strategy(strategy), max_steps=1)
    trainer.fit(module, train_dataloaders=prompt_loader(["1+1="] * world_of(strategy)))
    return module, trainer


def qlora_case(strategy: str) -> GRPOModule:
    """An NF4-quantized base (QLoRA): one SGD step on the injected rollout, as the equivalence cases take it."""
    policy = PolicyConfig(lora_r=4, lora_alpha=8, quantization="nf4", dtype="float32")
    module = build_module(
        RankSliceModule,
        lr=0.5,
        sgd=True,
        objective={"kl_coef": 0.1},
        update={"max_grad_norm": None, "micro_batch_size": 2},
        policy=policy,
    )
    module.fixed = fixed_rollout(module.tokenizer, PROMPTS, COMPLETIONS, group_size=G)
    perturb_adapter(module)
    trainer = make_trainer(devices=world_of(strategy), strategy=make_strategy(strategy), max_steps=1)
    trainer.fit(module, train_dataloaders=prompt_loader(["1+1="] * world_of(strategy)))
    return module
