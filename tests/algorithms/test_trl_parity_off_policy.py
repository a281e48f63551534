"""Parity with TRL 1.16 for issue 38's pieces: vLLM importance-sampling modes, OPSM, top-entropy, weighted KL.

The importance-sampling ratios are TRL's own: ``GRPOTrainer._generate_and_score_completions`` run on a fixed
rollout whose sampler log-probs are given (its ``_generate`` replaced, ``use_vllm`` set), for each of the four
``vllm_importance_sampling_mode`` values; ours are computed from TRL's old log-probs and the same sampler log-probs.
"""

from __future__ import annotations

import copy
import types

import pytest
import torch

from lightning_grpo.algorithms.entropy import top_entropy_mask
from lightning_grpo.algorithms.off_policy import off_policy_mask
from lightning_grpo.algorithms.rollout_correction import rollout_weights
from lightning_grpo.config import AdvantageConfig, ObjectiveConfig, UpdateConfig
from lightning_grpo.testing import build_tiny_model
from tests.conftest import tiny_sampling
from tests.module.helpers import FixedRolloutModule, fixed_rollout
from tests.rewards.test_trl_parity import AGG, COMPLETIONS, PROMPTS, T, _ours, _perturb, _theirs, frac_a

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


def _trl_ratios(tokenizer, tmp_path, mode: str, low: float | None, high: float | None):
    rollout = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=4)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=T,
        report_to="none", use_cpu=True, bf16=False, vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=low, vllm_importance_sampling_clip_max=high,
    )  # fmt: skip
    dataset = datasets.Dataset.from_dict({"prompt": PROMPTS[::4]})
    trainer = trl.GRPOTrainer(model=build_tiny_model(tokenizer), reward_funcs=frac_a, args=args,
                              train_dataset=dataset, processing_class=tokenizer)  # fmt: skip
    trainer.use_vllm = True  # the importance-sampling branch; generation is ours below
    lengths = [int(n) for n in rollout.completion_mask.sum(1)]
    generator = torch.Generator().manual_seed(0)
    sampler = [(-1.5 - torch.rand(n, generator=generator)).tolist() for n in lengths]
    prompts = [rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist() for i in range(len(PROMPTS))]
    completions = [rollout.completion_ids[i][:n].tolist() for i, n in enumerate(lengths)]
    trainer._generate = lambda _: (prompts, completions, None, COMPLETIONS, sampler, {}, None, None)
    trainer.model.train()
    return trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("low", "high"), [(None, 3.0), (0.5, 2.0)])
def test_importance_sampling_modes_equal_trl(tokenizer, tmp_path, mode, low, high):
    out = _trl_ratios(tokenizer, tmp_path, mode, low, high)
    mask = out["completion_mask"].float()
    theirs = out["importance_sampling_ratio"].expand_as(mask) * mask
    ours = rollout_weights(out["old_per_token_logps"], out["sampling_per_token_logps"], mask, mode, low, high)
    torch.testing.assert_close(ours * mask, theirs, rtol=1e-5, atol=1e-7)
    assert (theirs != 1).any() and ((theirs - 1).abs() > 1e-3).any()  # real corrections were compared


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_off_policy_mask_equals_trl(seed):
    generator = torch.Generator().manual_seed(seed)
    current = -torch.rand(8, 6, generator=generator) * 2
    sampler = current + 0.1 + torch.randn(8, 6, generator=generator) * 0.3
    advantages = torch.randn(8, 1, generator=generator)
    mask = (torch.arange(6)[None] < torch.tensor([6, 1, 3, 0, 5, 2, 6, 4])[:, None]).float()
    theirs = trl.GRPOTrainer.get_off_policy_mask(advantages, current, sampler, mask, 0.1)
    ours = off_policy_mask(advantages.squeeze(1), current, sampler, mask, 0.1)
    assert ours.tolist() == theirs.tolist() and 0 < ours.sum() < 8


@pytest.mark.parametrize("quantile", [0.2, 0.5, 0.9])
def test_top_entropy_mask_equals_trl(quantile):
    generator = torch.Generator().manual_seed(0)
    entropy = torch.rand(6, 9, generator=generator) * 3
    mask = (torch.arange(9)[None] < torch.tensor([9, 2, 5, 0, 7, 3])[:, None]).float()
    one_process = types.SimpleNamespace(pad_across_processes=lambda t, **_: t, gather=lambda t: t)
    theirs = trl.GRPOTrainer.get_high_entropy_mask(
        types.SimpleNamespace(accelerator=one_process), entropy, mask, 1 - quantile
    )
    assert top_entropy_mask(entropy, mask, quantile).tolist() == theirs.tolist()


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_importance_weighted_kl_equals_trls_bias_corrected_kl(make_module, tokenizer, tmp_path, loss_type):
    """``kl_estimator: k3`` + ``kl_weighting: importance`` is TRL's ``use_bias_correction_kl=True``."""
    objective = ObjectiveConfig(
        loss_agg_mode=AGG[loss_type], kl_coef=0.2, kl_estimator="k3", kl_weighting="importance", dual_clip=None
    )
    module = make_module(
        [frac_a], module_cls=FixedRolloutModule, sampling=tiny_sampling(max_new_tokens=T, temperature=1.0),
        objective=objective, update=UpdateConfig(max_grad_norm=None), advantages=AdvantageConfig(advantage_eps=1e-4),
    )  # fmt: skip
    _perturb(module.policy)
    rollout = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=4)
    policy = copy.deepcopy(module.policy)
    our_loss, our_grads = _ours(module, rollout)
    their_loss, their_grads = _theirs(policy, tokenizer, rollout, loss_type, 0.2, True, tmp_path)
    assert our_loss == pytest.approx(their_loss, rel=1e-4, abs=1e-6)
    for name, grad in our_grads.items():
        torch.testing.assert_close(grad, their_grads[name], rtol=1e-3, atol=1e-6, msg=name)
