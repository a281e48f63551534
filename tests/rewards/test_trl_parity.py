"""Parity with TRL's ``GRPOTrainer`` loss and gradient on fixed inputs (docs/coming-from.md, "Coming from TRL").

The same tiny model with the same (perturbed) LoRA adapter, prompts, completions and rewards go through one training
step here and through ``GRPOTrainer._compute_loss`` there; each TRL ``loss_type`` is compared with the
``loss_agg_mode`` the docs map it to, with and without KL (TRL's default bias-corrected KL is our ``k3+``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from lightning_grpo.config import AdvantageConfig, ObjectiveConfig, UpdateConfig
from tests.conftest import make_trainer, prompt_loader, tiny_sampling
from tests.module.helpers import FixedRolloutModule, fixed_rollout

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

PROMPTS = ["1+1="] * 4 + ["2+5="] * 4  # equal lengths: no left padding, so position ids agree
COMPLETIONS = ["2", "aa", "3", "a b c", "7", "aaaa", "77", "x b a..."]
T = 8  # max_new_tokens / max_completion_length
AGG = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}


def frac_a(completions: list[str], **_: object) -> list[float]:
    return [c.count("a") / max(len(c), 1) for c in completions]


def _trl_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """TRL's ``scale_rewards="group"``: (r - group mean) / (group std + 1e-4), unbiased std."""
    groups = rewards.view(-1, 4)
    return ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).flatten()


def _perturb(policy: torch.nn.Module) -> None:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in policy.parameters():
            if param.requires_grad:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))


def _ours(module, rollout) -> tuple[float, dict[str, torch.Tensor]]:
    """One SGD step (lr 1) on the fixed rollout: the loss and the gradient (= before - after)."""
    module.fixed = rollout
    module.optimizer_factory = lambda params: torch.optim.SGD(params, lr=1.0)
    before = {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}
    trainer = make_trainer(max_steps=1)
    trainer.fit(module, train_dataloaders=prompt_loader(PROMPTS[::4]))
    after = dict(module.policy.named_parameters())
    return float(trainer.callback_metrics["train/loss"]), {n: before[n] - after[n].detach() for n in before}


def _theirs(policy, tokenizer, rollout, loss_type: str, beta: float, bias_kl: bool, tmp_path, masked: bool = False):
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=T,
        beta=beta, loss_type=loss_type, epsilon=0.2, use_bias_correction_kl=bias_kl, report_to="none", use_cpu=True,
        bf16=False, gradient_checkpointing=False, temperature=1.0,
    )  # fmt: skip
    dataset = datasets.Dataset.from_dict({"prompt": PROMPTS[::4]})
    trainer = trl.GRPOTrainer(model=policy, reward_funcs=frac_a, args=args, train_dataset=dataset,
                              processing_class=tokenizer)  # fmt: skip
    trainer.current_gradient_accumulation_steps = 1
    model = trainer.model
    mask = rollout.completion_mask * (~rollout.truncated)[:, None] if masked else rollout.completion_mask
    inputs = {
        "prompt_ids": rollout.prompt_ids, "prompt_mask": rollout.prompt_mask,
        "completion_ids": rollout.completion_ids, "completion_mask": mask.long(),
        "advantages": _trl_advantages(torch.tensor(frac_a(rollout.completions))),
        "num_items_in_batch": mask.sum(),
    }  # fmt: skip
    if beta:
        ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
        attention = torch.cat([rollout.prompt_mask, inputs["completion_mask"]], 1)
        with torch.no_grad(), model.disable_adapter():
            inputs["ref_per_token_logps"] = trainer._get_per_token_logps_and_entropies(
                model, ids, attention, rollout.completion_ids.shape[1]
            )[0]
    model.train()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grads = {n.removeprefix("module."): p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return float(loss), grads


def _module(make_module, loss_type: str, **objective: Any) -> FixedRolloutModule:
    """The module compared with TRL: its settings (``T`` tokens, no gradient clipping, no dual clip, eps 1e-4), the
    aggregation of ``loss_type`` and ``objective`` (:class:`ObjectiveConfig` fields)."""
    return make_module(
        [frac_a], module_cls=FixedRolloutModule, sampling=tiny_sampling(max_new_tokens=T, temperature=1.0),
        objective=ObjectiveConfig(loss_agg_mode=AGG[loss_type], dual_clip=None, **objective),
        update=UpdateConfig(max_grad_norm=None), advantages=AdvantageConfig(advantage_eps=1e-4),
    )  # fmt: skip


@pytest.mark.parametrize("loss_type", list(AGG))
@pytest.mark.parametrize(("beta", "bias_kl", "estimator"), [(0.0, True, "k3"), (0.2, True, "k3+"), (0.2, False, "k3")])
def test_loss_and_gradient_equal_trl(make_module, tokenizer, tmp_path, loss_type, beta, bias_kl, estimator):
    module = _module(make_module, loss_type, kl_coef=beta, kl_estimator=estimator)
    _perturb(module.policy)
    rollout = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=4)
    policy = copy.deepcopy(module.policy)
    our_loss, our_grads = _ours(module, rollout)
    their_loss, their_grads = _theirs(policy, tokenizer, rollout, loss_type, beta, bias_kl, tmp_path)
    assert our_loss == pytest.approx(their_loss, rel=1e-4, abs=1e-6)
    assert set(our_grads) == set(their_grads) and len(our_grads) > 0
    for name, grad in our_grads.items():
        torch.testing.assert_close(grad, their_grads[name], rtol=1e-3, atol=1e-6, msg=name)
    assert max(float(g.abs().max()) for g in our_grads.values()) > 1e-4  # a real gradient was compared


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_masked_truncated_rows_count_in_trls_row_count_but_not_ours(make_module, tokenizer, tmp_path, loss_type):
    """With ``mask_truncated_completions`` TRL's grpo/dr_grpo divide by all 8 rows, ours by the 7 with tokens."""
    module = _module(make_module, loss_type, kl_coef=0.2, kl_estimator="k3+", mask_truncated_completions=True)
    _perturb(module.policy)
    rollout = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=4)
    assert rollout.truncated.tolist() == [False] * 7 + [True]
    policy = copy.deepcopy(module.policy)
    our_loss, our_grads = _ours(module, rollout)
    their_loss, their_grads = _theirs(policy, tokenizer, rollout, loss_type, 0.2, True, tmp_path, masked=True)
    ratio = 1.0 if loss_type == "dapo" else 8 / 7  # rows / rows with tokens (docs/math.md, "Loss aggregation")
    assert our_loss == pytest.approx(their_loss * ratio, rel=1e-4)
    for name, grad in our_grads.items():
        torch.testing.assert_close(grad, their_grads[name] * ratio, rtol=1e-3, atol=1e-6, msg=name)
