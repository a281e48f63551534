"""QLoRA: a bitsandbytes-quantized base (NF4 / int8) under a float32 adapter, on tiny Qwen2 models on CPU.

The tiny model has hidden size 64 and MLP width 256, so every input size is a multiple of bitsandbytes' 4-bit block
size (64); the vocabulary (about 100 tokens) only sizes the embeddings and the output head, which stay unquantized.
"""

from __future__ import annotations

import importlib
import logging
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import ModelParallelStrategy
from peft import PeftModel

from lightning_grpo import PolicyConfig, PromptDataModule, distributed
from lightning_grpo.config import ObjectiveConfig, UpdateConfig
from lightning_grpo.policy import load_policy
from lightning_grpo.policy import quantization as quantization_module
from lightning_grpo.policy.quantization import bnb_config, check_shardable, load_quantized, same_kernels_in_both_modes
from lightning_grpo.rollout import completion_logprobs
from lightning_grpo.rollout import logprobs as logprobs_module
from lightning_grpo.testing import build_tiny_model
from tests.conftest import make_trainer, prompt_records, tiny_sampling
from tests.module.helpers import fixed_rollout

bnb = pytest.importorskip("bitsandbytes")  # the dev extra installs it; CI always runs these tests

#: dtype per quantization: LLM.int8 refuses float32 (see test_int8_with_float32_is_refused_with_the_reason)
DTYPES = {"nf4": "float32", "int8": "bfloat16"}
LAYERS = {"nf4": bnb.nn.Linear4bit, "int8": bnb.nn.Linear8bitLt}
PROMPTS = ["1+2=", "1+2=", "33+4=", "33+4="]
COMPLETIONS = ["3", "4aa", "37", "ab..."]


def _policy(quantization: str, **options) -> PolicyConfig:
    return PolicyConfig(lora_r=4, lora_alpha=8, quantization=quantization, dtype=DTYPES[quantization], **options)


def _perturb(policy) -> None:
    """Move the adapter off its zero-B start (seeded), so that it changes the model and every weight gets a gradient."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in policy.parameters():
            if param.requires_grad:
                param.add_(0.2 * torch.randn(param.shape, generator=generator))


def _quantized_base(tokenizer, quantization: str = "nf4"):
    dtype = getattr(torch, DTYPES[quantization])
    config = bnb_config(quantization, double_quantization=True, compute_dtype=dtype)
    model = load_quantized(build_tiny_model(tokenizer), config, dtype=dtype)
    same_kernels_in_both_modes(model)  # as load_policy does: without it, eval mode repacks 4-bit weights on CPU
    return model


@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_fit_steps_change_only_adapter_weights_of_a_quantized_base(make_module, quantization):
    module = make_module(
        policy=_policy(quantization), update=UpdateConfig(mini_batch_size=4), objective=ObjectiveConfig(kl_coef=0.01)
    )  # 2 optimizer steps
    layers = module.policy.base_model.model.model.layers[0]
    assert type(layers.self_attn.q_proj.base_layer) is LAYERS[quantization]
    assert type(layers.mlp.down_proj.base_layer) is LAYERS[quantization]
    assert type(module.policy.get_output_embeddings()) is torch.nn.Linear  # the head stays unquantized
    assert all(p.dtype == torch.float32 for p in module.policy.parameters() if p.requires_grad)  # the adapter
    _perturb(module.policy)  # the KL term then gives every adapter weight a gradient
    before = {k: v.clone() for k, v in module.policy.state_dict().items()}
    make_trainer(max_steps=2).fit(module, PromptDataModule(prompt_records(2), batch_size=2))
    after = module.policy.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed), sorted(changed)[:4]
    assert any("lora_A" in k for k in changed) and any("lora_B" in k for k in changed)
    assert any(".absmax" in k or "SCB" in k for k in before), "the quantization state is compared too"


def test_reference_logprobs_are_the_quantized_base_without_adapter(make_module, tokenizer):
    module = make_module(policy=_policy("nf4"))
    _perturb(module.policy)
    rollout = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=2)
    with torch.no_grad():
        reference = module.compute_logprobs(rollout, reference=True).logprobs
        policy = module.compute_logprobs(rollout).logprobs
        quantized = completion_logprobs(_quantized_base(tokenizer), rollout).logprobs
        unquantized = completion_logprobs(build_tiny_model(tokenizer), rollout).logprobs
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(reference[mask], quantized[mask], atol=1e-6, rtol=1e-6)
    assert (reference - unquantized)[mask].abs().max() > 1e-3, "the reference must be the quantized base"
    assert (reference - policy)[mask].abs().max() > 1e-3, "the adapter must be off in the reference"


@pytest.mark.parametrize("sampler", ["multinomial", "inverse_cdf"])
def test_training_logprobs_equal_the_sampling_distribution_on_a_quantized_base(
    make_module, monkeypatch, sampler, quantization="nf4"
):
    """Record the processed scores of every decoding step (our loop); every log-prob pass must reproduce them."""
    from lightning_grpo.rollout import decode as decode_module

    recorded, draw = [], decode_module._draw

    def recording_draw(scores, kind):
        chosen = draw(scores, kind)
        recorded.append(scores.log_softmax(-1).gather(-1, chosen[:, None]).squeeze(-1))
        return chosen

    monkeypatch.setattr(decode_module, "_draw", recording_draw)
    module = make_module(
        policy=_policy(quantization), sampling=tiny_sampling(temperature=0.8, sampler=sampler, drop_finished=True)
    )
    _perturb(module.policy)
    torch.manual_seed(0)
    rollout = module.generate({"prompt": ["1+2=", "33+4="]})
    assert rollout.completion_mask.sum() > len(rollout), "completions must be longer than one token"
    for training in (False, True):  # the fixed passes run in eval mode, the update pass in train mode
        module.policy.train(training)
        for share_prompt in (True, False):
            for fused_head in (True, False):
                ours = completion_logprobs(
                    module.policy, rollout, temperature=0.8, share_prompt=share_prompt, fused_head=fused_head
                ).logprobs
                for step, sampled in enumerate(recorded):
                    alive = rollout.completion_mask[:, step].bool()
                    torch.testing.assert_close(ours[alive, step].detach(), sampled, atol=1e-4, rtol=1e-4)


def test_a_quantized_output_head_falls_back_from_the_fused_head_with_one_log_line(tokenizer, monkeypatch, caplog):
    model = build_tiny_model(tokenizer).eval()
    head = model.lm_head
    quantized = bnb.nn.Linear4bit(head.in_features, head.out_features, bias=False, compute_dtype=torch.float32)
    quantized.weight = bnb.nn.Params4bit(head.weight.detach().clone(), requires_grad=False, quant_type="nf4")
    model.lm_head = quantized.to("cpu")  # quantizes the weight
    monkeypatch.setattr(logprobs_module, "_FALLBACK_LOGGED", set())
    rollout = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=2)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger=logprobs_module.__name__):
        fused = [completion_logprobs(model, rollout, fused_head=True).logprobs for _ in range(2)]
        plain = completion_logprobs(model, rollout, fused_head=False).logprobs
    lines = [r.getMessage() for r in caplog.records if "fused_head" in r.getMessage()]
    assert len(lines) == 1 and "Linear4bit" in lines[0]
    torch.testing.assert_close(fused[0], plain, atol=0, rtol=0)


def test_exported_adapter_reloads_onto_the_quantized_and_the_unquantized_base(make_module, tokenizer, tmp_path):
    """Onto a quantized base: the policy's logits exactly. Onto the unquantized base (the export target): within the
    base's own quantization error, here twice the largest logit change that NF4 makes to the model without adapter.

    The merged model differs from the policy only by the base weights' NF4 rounding (the adapter is exact), so its
    logits may differ from the policy's by about what that rounding changes in the base model's logits; the factor 2
    leaves room for the adapter's effect on the activations that the rounding error meets.
    """
    module = make_module(policy=_policy("nf4"))
    _perturb(module.policy)
    path = module.export_adapter(tmp_path / "adapter")
    ids = tokenizer(["3+4=7", "1+1="], padding=True, return_tensors="pt")
    with torch.no_grad():
        policy = module.policy.eval()(**ids).logits
        on_quantized = PeftModel.from_pretrained(_quantized_base(tokenizer), str(path)).eval()(**ids).logits
        merged = PeftModel.from_pretrained(build_tiny_model(tokenizer), str(path)).merge_and_unload().eval()
        on_unquantized = merged(**ids).logits
        base_error = (build_tiny_model(tokenizer)(**ids).logits - _quantized_base(tokenizer)(**ids).logits).abs().max()
        adapter_effect = (on_unquantized - build_tiny_model(tokenizer)(**ids).logits).abs().max()
    torch.testing.assert_close(on_quantized, policy, atol=1e-6, rtol=1e-6)
    assert (on_unquantized - policy).abs().max() <= 2 * base_error
    assert adapter_effect > 2 * base_error, "the adapter must matter more than the tolerance for the test to mean it"


def test_checkpoint_resume_on_a_quantized_base_matches_an_uninterrupted_run(make_module, tmp_path):
    settings = {
        "policy": _policy("nf4"),
        "objective": ObjectiveConfig(kl_coef=0.01),
        "update": UpdateConfig(mini_batch_size=4),
    }
    data = lambda: PromptDataModule(prompt_records(4), batch_size=2, seed=1)  # noqa: E731
    straight = make_module(**settings)
    make_trainer(max_steps=4).fit(straight, data())  # 2 iterations x 2 optimizer steps
    first = make_module(**settings)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=2)
    make_trainer(max_steps=2, enable_checkpointing=True, callbacks=[checkpoint]).fit(first, data())
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert saved["state_dict"] and all("lora_" in key for key in saved["state_dict"])  # no quantized weights
    resumed = make_module(**settings)
    make_trainer(max_steps=4).fit(resumed, data(), ckpt_path=tmp_path / "last.ckpt")
    adapter = lambda m: {n: p for n, p in m.policy.named_parameters() if p.requires_grad}  # noqa: E731
    for name, value in adapter(straight).items():
        torch.testing.assert_close(adapter(resumed)[name], value, atol=0, rtol=0)


def test_gradient_checkpointing_on_and_off_give_the_same_gradients(tokenizer):
    """Non-reentrant checkpointing: no "element 0 of tensors does not require grad", no adapter left without grad."""
    rollout = fixed_rollout(tokenizer, PROMPTS, COMPLETIONS, group_size=2)
    grads = []
    for checkpointing in (False, True):
        policy = load_policy(build_tiny_model(tokenizer), _policy("nf4", gradient_checkpointing=checkpointing))
        _perturb(policy)
        policy.train()
        logprobs = completion_logprobs(policy, rollout, share_prompt=False).logprobs
        (logprobs * rollout.completion_mask).sum().backward()
        grads.append({n: p.grad for n, p in policy.named_parameters() if p.requires_grad})
    layers = policy.base_model.model.model.layers
    assert layers[0].gradient_checkpointing and not layers[0]._gradient_checkpointing_func.keywords["use_reentrant"]
    assert all(g is not None and g.abs().sum() > 0 for g in grads[1].values()), "every adapter weight gets a gradient"
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- bad input


def test_missing_bitsandbytes_names_the_extra(tokenizer, monkeypatch):
    real = importlib.import_module

    def without_bitsandbytes(name, *args):
        if name == "bitsandbytes":
            raise ImportError("No module named 'bitsandbytes'")
        return real(name, *args)

    monkeypatch.setattr(quantization_module.importlib, "import_module", without_bitsandbytes)
    with pytest.raises(ImportError, match=r'needs bitsandbytes.*pip install "\.\[quant\]" in a clone'):
        load_policy(build_tiny_model(tokenizer), _policy("nf4"))


def test_a_layer_the_4bit_blocks_do_not_fit_is_named_with_the_block_size(tokenizer):
    model = build_tiny_model(tokenizer, hidden_size=96, num_heads=4, num_kv_heads=2, intermediate_size=256)
    with pytest.raises(ValueError, match=r"layer 'model\.layers\.0\.self_attn\.q_proj'.*96.*block size 64"):
        load_policy(model, _policy("nf4"))
    assert load_policy(model, _policy("int8")) is not None  # int8 scales whole rows: any size


def test_int8_with_float32_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"'int8' cannot run with policy\.dtype='float32'.*float16"):
        PolicyConfig(quantization="int8", dtype="float32")
    PolicyConfig(quantization="nf4", dtype="float32")  # 4-bit layers compute in float32 as well


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"quantization": "nf8"}, r"policy\.quantization='nf8' is not valid; choose one of 'nf4', 'fp4', 'int8', None"),
        ({"compute_dtype": "int4"}, r"PolicyConfig\.compute_dtype must be one of .*'float32'"),
        ({"adapter_dtype": "auto"}, r"PolicyConfig\.adapter_dtype must be one of 'float32', 'bfloat16', 'float16'"),
    ],
)
def test_unknown_quantization_settings_list_the_valid_ones(settings, message):
    with pytest.raises(ValueError, match=message):
        PolicyConfig(**settings)


def test_fsdp2_refuses_a_quantized_base_at_setup_and_names_what_to_use(make_module, tokenizer, monkeypatch):
    module = make_module(policy=_policy("nf4"))
    monkeypatch.setattr(distributed, "check_strategy", lambda strategy: None)  # its mesh checks need a process group
    module.trainer = SimpleNamespace(strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1))
    with pytest.raises(ValueError, match=r"FSDP2.*quantized base.*not supported.*DDP.*single GPU"):
        module.setup("fit")
    check_shardable(load_policy(build_tiny_model(tokenizer), PolicyConfig(lora_r=4)))  # unquantized: fine


def test_a_peft_model_with_quantization_is_refused(tokenizer):
    peft_model = load_policy(build_tiny_model(tokenizer), PolicyConfig(lora_r=4))
    with pytest.raises(ValueError, match="applies to a base model, not a PeftModel"):
        load_policy(peft_model, _policy("nf4"))
