"""Parity of ``sapo`` and ``gmpo`` with TRL 1.16's own loss code on the same off-policy tensors.

TRL computes these losses inside ``GRPOTrainer._compute_loss`` (``loss_type="sapo"``) and
``trl.experimental.gmpo.GMPOTrainer._compute_loss``, which take the log-probs from the model. The smallest TRL object
that runs them is the trainer itself: it is built over the tiny policy and its log-prob pass is replaced by one that
returns our tensor, so TRL's loss and its gradient wrt the log-probs are compared with ``policy_loss`` aggregated as
docs/coming-from.md maps the loss type (``seq-mean-token-mean``: a mean over sequences of token means).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from lightning_grpo.algorithms import aggregate_loss, policy_loss
from lightning_grpo.algorithms.soft_losses import sapo

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

N, T = 6, 5


def _count_a(completions, **_):
    return [c.count("a") for c in completions]


def _inputs(seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Log-probs of real probabilities, old ones moved by up to ±0.8 (so TRL's clips act), uneven lengths."""
    gen = torch.Generator().manual_seed(seed)
    logprobs = (0.05 + 0.9 * torch.rand(N, T, generator=gen)).log()
    old = (logprobs + 0.8 * (2 * torch.rand(N, T, generator=gen) - 1)).clamp(max=-1e-3)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    inputs = {
        "prompt_ids": torch.ones(N, 2, dtype=torch.long), "prompt_mask": torch.ones(N, 2, dtype=torch.long),
        "completion_ids": torch.ones(N, T, dtype=torch.long), "completion_mask": mask,
        "advantages": torch.randn(N, generator=gen), "old_per_token_logps": old, "num_items_in_batch": mask.sum(),
    }  # fmt: skip
    return logprobs, inputs


def _trl_loss(trainer, logprobs: torch.Tensor, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's loss and its gradient wrt ``logprobs`` (its model's log-prob pass returns them)."""
    leaf = logprobs.clone().requires_grad_()
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (leaf, torch.zeros_like(leaf), None)
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    loss = trainer._compute_loss(trainer.model, inputs)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


def _ours(logprobs: torch.Tensor, inputs: dict, kind: str, args: dict) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = logprobs.clone().requires_grad_()
    mask = inputs["completion_mask"]
    per_token, _ = policy_loss(leaf, inputs["old_per_token_logps"], inputs["advantages"], mask, kind=kind,
                               kind_args=args)  # fmt: skip
    loss = aggregate_loss(per_token, mask, "seq-mean-token-mean")
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


def _common(tmp_path) -> dict:
    return {"output_dir": str(tmp_path), "per_device_train_batch_size": N, "num_generations": N, "beta": 0.0,
            "report_to": "none", "use_cpu": True, "bf16": False, "max_completion_length": T}  # fmt: skip


def _trainer(cls, args, make_module, tokenizer):
    module = make_module([_count_a])
    dataset = datasets.Dataset.from_dict({"prompt": ["1+1="] * N})
    return cls(model=module.policy, reward_funcs=_count_a, args=args, train_dataset=dataset,
               processing_class=tokenizer)  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1])
def test_sapo_equals_trl(make_module, tokenizer, tmp_path, seed):
    args = trl.GRPOConfig(loss_type="sapo", sapo_temperature_pos=0.9, sapo_temperature_neg=1.2, **_common(tmp_path))
    trainer = _trainer(trl.GRPOTrainer, args, make_module, tokenizer)
    logprobs, inputs = _inputs(seed)
    their_loss, their_grad = _trl_loss(trainer, logprobs, inputs)
    our_loss, our_grad = _ours(logprobs, inputs, "sapo", {"tau_pos": 0.9, "tau_neg": 1.2})
    torch.testing.assert_close(our_loss, their_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(our_grad, their_grad, rtol=1e-5, atol=1e-7)
    assert their_grad.abs().sum() > 0


def test_sapo_defaults_equal_trls(tmp_path):
    args = trl.GRPOConfig(loss_type="sapo", **_common(tmp_path))
    defaults = {k: p.default for k, p in inspect.signature(sapo).parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert defaults == {"tau_pos": args.sapo_temperature_pos, "tau_neg": args.sapo_temperature_neg}


@pytest.mark.parametrize("seed", [0, 1])
def test_gmpo_equals_trl_experimental(make_module, tokenizer, tmp_path, seed):
    gmpo = pytest.importorskip("trl.experimental.gmpo")
    args = gmpo.GMPOConfig(epsilon=0.3, epsilon_high=0.5, **_common(tmp_path))
    trainer = _trainer(gmpo.GMPOTrainer, args, make_module, tokenizer)
    logprobs, inputs = _inputs(seed)
    their_loss, their_grad = _trl_loss(trainer, logprobs, inputs)
    our_loss, our_grad = _ours(logprobs, inputs, "gmpo", {"log_clip_low": 0.3, "log_clip_high": 0.5})
    torch.testing.assert_close(our_loss, their_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(our_grad, their_grad, rtol=1e-5, atol=1e-7)
    valid = inputs["completion_mask"].bool()
    assert ((their_grad == 0) & valid).any() and their_grad.abs().sum() > 0  # some valid tokens clipped, not all
