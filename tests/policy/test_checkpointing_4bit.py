"""Gradient checkpointing over an NF4 base (QLoRA): the same adapter gradients, and none of the failures users report.

The failures: re-entrant checkpointing over a frozen base raises "element 0 of tensors does not require grad" at
``backward`` (no input of a checkpointed segment requires grad, so its output has no graph), and torch / transformers
warn about ``use_reentrant``. The tiny model is 128 wide with an MLP of 256, so every 4-bit layer's input is a whole
number of bitsandbytes' 64-weight blocks (tests/policy/test_quantization.py covers the rest of QLoRA).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_grpo import PolicyConfig, PromptDataModule
from lightning_grpo.config import ObjectiveConfig, UpdateConfig
from lightning_grpo.policy import load_policy
from lightning_grpo.rollout import completion_logprobs
from lightning_grpo.testing import build_tiny_model
from tests.conftest import make_trainer, prompt_records
from tests.module.helpers import fixed_rollout

bnb = pytest.importorskip("bitsandbytes")

PROMPTS = ["1+2=", "1+2=", "33+4=", "33+4="]
COMPLETIONS = ["3", "4aa", "37", "ab..."]
#: the warnings of the two failures, as torch and transformers word them (checked to be caught in the control test)
FAILURE_WORDS = ("reentrant", "requires_grad", "does not require grad", "checkpointing_enable")


def _model(tokenizer):
    return build_tiny_model(tokenizer, hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256)


def _policy(tokenizer, dtype: str, checkpointing: bool):
    config = PolicyConfig(lora_r=4, lora_alpha=8, quantization="nf4", dtype=dtype, gradient_checkpointing=checkpointing)
    policy = load_policy(_model(tokenizer), config)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # move the adapter off its zero-B start, so that every adapter weight gets a gradient
        for param in policy.parameters():
            if param.requires_grad:
                param.add_(0.2 * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return policy.train()


def _adapter_grads(policy, rollout) -> tuple[dict[str, torch.Tensor], int]:
    """Gradients of a log-prob loss w.r.t. every adapter weight, and how often the first layer's MLP started.

    A pre-hook counts: the recompute stops early, once it has rebuilt the last tensor the backward needs, so a
    post-hook may not run.

    The full forward in both cases (``share_prompt=False``): with checkpointing on, the update pass takes it anyway.
    """
    calls = []
    hook = policy.base_model.model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    logprobs = completion_logprobs(policy, rollout, share_prompt=False).logprobs
    loss = -(logprobs * rollout.completion_mask).sum() / rollout.completion_mask.sum()
    assert loss.requires_grad, "the loss must have a graph back to the adapters"
    loss.backward()
    hook.remove()
    return {n: p.grad for n, p in policy.named_parameters() if p.requires_grad}, len(calls)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nf4_checkpointing_gives_bitwise_the_same_adapter_gradients(tokenizer, dtype):
    """Bitwise equal, not within a tolerance: the recompute replays the same CPU kernels (the same bitsandbytes
    dequantization, the same matmuls) on the same inputs in the same order, and nothing random runs (dropout 0). A
    difference would mean the recompute took another path (a repacked kernel, a cache, an autocast), which is exactly
    what this test is for; the first layer's forward count proves the recompute ran at all."""
    rollout = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=2)
    plain, plain_calls = _adapter_grads(_policy(tokenizer, dtype, checkpointing=False), rollout)
    checkpointed, checkpointed_calls = _adapter_grads(_policy(tokenizer, dtype, checkpointing=True), rollout)
    assert (plain_calls, checkpointed_calls) == (1, 2), "checkpointing must recompute the MLP in the backward"
    assert set(checkpointed) == set(plain) and len(plain) == 2 * 2 * 7  # A and B of 7 linear layers in 2 layers
    assert all(g is not None and g.abs().sum() > 0 for g in checkpointed.values()), "every adapter weight has a grad"
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=0, rtol=0, msg=name)


def test_checkpointed_backward_through_a_frozen_nf4_base_reaches_every_adapter(tokenizer):
    """Only adapters are trainable and the embeddings are frozen: no "element 0 of tensors does not require grad"."""
    policy = _policy(tokenizer, "float32", checkpointing=True)
    assert not policy.get_input_embeddings().weight.requires_grad
    assert all("lora_" in n for n, p in policy.named_parameters() if p.requires_grad)
    grads, _ = _adapter_grads(policy, fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=2))
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values())


def test_the_failure_this_guards_against_is_real_here(tokenizer):
    """Control: re-entrant checkpointing without input grads does raise the error and warn, and the words match."""
    policy = _policy(tokenizer, "float32", checkpointing=False)
    base = policy.base_model.model
    if hasattr(base, "activation_checkpointing_enable"):  # transformers 5; the old name warns there
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    base.disable_input_require_grads()
    policy.train()
    rollout = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logprobs = completion_logprobs(policy, rollout).logprobs
        with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad"):
            logprobs.sum().backward()
    assert _failure_warnings(caught), "the word list must catch the re-entrant path's warning"


def _failure_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    messages = [str(w.message) for w in caught]
    return [m for m in messages if any(word in m.lower() for word in FAILURE_WORDS)]


def test_a_checkpointed_nf4_fit_warns_nothing_about_reentrance_or_grads(make_module):
    """Loading, sampling, the reference pass, two optimizer steps: no checkpointing or requires-grad warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = PolicyConfig(lora_r=4, lora_alpha=8, quantization="nf4", dtype="float32", gradient_checkpointing=True)
        module = make_module(
            policy=policy, update=UpdateConfig(mini_batch_size=4), objective=ObjectiveConfig(kl_coef=0.01)
        )
        layers = module.policy.base_model.model.model.layers
        assert layers[0].gradient_checkpointing, "checkpointing must be on for the fit to test it"
        before = {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}
        make_trainer(max_steps=2).fit(module, PromptDataModule(prompt_records(2), batch_size=2))
    assert not _failure_warnings(caught), _failure_warnings(caught)
    after = dict(module.policy.named_parameters())
    assert any(not torch.equal(after[n], value) for n, value in before.items()), "the adapter must have trained"
