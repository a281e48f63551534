"""One training step against a hand computation from the algorithm core on the same (injected) rollout."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_grpo.algorithms import aggregate_loss, compute_advantages, kl_penalty, policy_loss
from lightning_grpo.config import ObjectiveConfig, UpdateConfig
from tests.conftest import make_trainer, prompt_loader, tiny_sampling
from tests.module.helpers import FixedRolloutModule, fixed_rollout

PROMPTS = ["1+1="] * 4 + ["2+5="] * 4
COMPLETIONS = ["2", "aa", "3", "a b c", "7", "aaaa", "77", "x..."]


def _naive_logprobs(model, rollout, temperature: float) -> torch.Tensor:
    """Full-vocabulary log-softmax over every position, then pick the completion tokens (the slow, obvious way)."""
    mask = rollout.attention_mask
    logits = model(
        input_ids=rollout.input_ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
    ).logits
    t = rollout.completion_ids.shape[1]
    logp = torch.log_softmax(logits[:, -t - 1 : -1].double() / temperature, -1)
    return logp.gather(-1, rollout.completion_ids[..., None]).squeeze(-1)


@pytest.mark.parametrize(("agg", "kl_kind"), [("token-mean", "k3"), ("seq-mean-token-mean", "k1+")])
def test_first_step_loss_and_update_match_hand_computation(make_module, tokenizer, agg, kl_kind):
    module = make_module(
        module_cls=FixedRolloutModule,
        sampling=tiny_sampling(num_generations=4, temperature=0.8),
        objective=ObjectiveConfig(
            loss_agg_mode=agg, kl_coef=0.1, kl_estimator=kl_kind, mask_truncated_completions=True
        ),
        update=UpdateConfig(max_grad_norm=None),
    )
    module.fixed = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=4)
    module.optimizer_factory = lambda params: torch.optim.SGD(params, lr=0.5)
    policy_before = copy.deepcopy(module.policy)

    # Hand computation on a copy: with one update per rollout the ratio is exactly 1 (old = detached current), so
    # the policy term is the aggregate of -A·1 per token, and its gradient is that of -A·logp.
    rollout = module.fixed
    rewards = torch.tensor([c.count("a") / len(c) for c in rollout.completions])
    advantages = compute_advantages(rewards, rollout.group_ids)
    mask = rollout.completion_mask * (~rollout.truncated)[:, None]  # the truncated "x..." leaves the loss
    logp = _naive_logprobs(policy_before, rollout, 0.8).float()
    with torch.no_grad(), policy_before.disable_adapter():
        ref = _naive_logprobs(policy_before, rollout, 0.8).float()
    pg, _ = policy_loss(logp, logp.detach(), advantages, mask)
    kl = kl_penalty(logp, ref, kl_kind)
    expected = aggregate_loss(pg, mask, agg) + 0.1 * aggregate_loss(kl, mask, agg)
    expected.backward()
    expected_params = {n: p - 0.5 * p.grad for n, p in policy_before.named_parameters() if p.requires_grad}

    trainer = make_trainer(max_steps=1)
    outputs = {}
    trainer.fit(module, train_dataloaders=prompt_loader(PROMPTS[:2]))
    outputs.update(trainer.callback_metrics)
    torch.testing.assert_close(outputs["train/loss"], expected.detach(), atol=1e-5, rtol=1e-4)
    for name, param in module.policy.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(param.detach(), expected_params[name].detach(), atol=1e-5, rtol=1e-4)


def test_only_adapter_weights_change_and_reference_is_the_base_model(make_module, tokenizer):
    module = make_module(
        module_cls=FixedRolloutModule,
        objective=ObjectiveConfig(kl_coef=0.05),
        update=UpdateConfig(ppo_epochs=2, mini_batch_size=4),
    )
    module.fixed = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=4)
    before = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    make_trainer(max_steps=4).fit(module, train_dataloaders=prompt_loader(PROMPTS[:2], repeat=2))
    changed = {n for n, p in module.policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed), f"non-adapter weights changed: {sorted(changed)[:3]}"
    assert all(p.grad is None or "lora_" in n for n, p in module.policy.named_parameters())

    from lightning_grpo.rollout import completion_logprobs
    from lightning_grpo.testing import build_tiny_model

    fresh = build_tiny_model(tokenizer).eval()  # same seed: the untouched base weights
    rollout = module.fixed
    with torch.no_grad():
        expected = completion_logprobs(fresh, rollout, temperature=1.0, packing="auto").logprobs  # as the module
        module.policy.eval()
        reference = module.compute_logprobs(rollout, reference=True).logprobs
        current = module.compute_logprobs(rollout).logprobs
    torch.testing.assert_close(reference, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(current, expected, atol=1e-3), "the trained policy should differ from the reference"


def test_logged_metrics_do_not_depend_on_micro_batch_size(make_module, tokenizer):
    logged = []
    for micro in (None, 2, 4):  # completions differ in length: micro-batches hold uneven token counts
        module = make_module(
            module_cls=FixedRolloutModule,
            update=UpdateConfig(micro_batch_size=micro, mini_batch_size=None),
            objective=ObjectiveConfig(kl_coef=0.1),
        )
        module.fixed = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=4)
        trainer = make_trainer(max_steps=1)
        trainer.fit(module, train_dataloaders=prompt_loader(PROMPTS[:2]))
        logged.append({k: v for k, v in trainer.callback_metrics.items() if k.startswith("train/")})
    for other in logged[1:]:
        for key in ("train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/clip_frac"):
            torch.testing.assert_close(other[key], logged[0][key], atol=1e-6, rtol=1e-5)
