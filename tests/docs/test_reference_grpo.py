"""docs/reference_grpo.py, the readable specification of the default path, does what ``GRPOModule`` does.

The reference and the module (under a Lightning ``Trainer``, as a user runs it) train copies of one tiny float64
model, with the same LoRA weights, prompts, reward function, seed and settings, for three iterations. Each iteration
must sample the same tokens, give the same rewards and advantages, the same loss (to 1e-10, relative) and gradients
(to 1e-10 of each tensor's largest entry), and leave the same adapter (to 1e-8). The settings are ``GRPOConfig()``'s
but for the sizes (G = 4, 8 new tokens) and, in the first case, the fused head (below).

The optimizer, given to both, is plain SGD (lr 0.1), which records the gradients of each optimizer step. AdamW, the
default, divides each gradient entry by its own magnitude: round-off of 1e-15 in a near-zero entry then became adapter
differences up to 5e-11 and, an iteration later, gradients that differed by 1e-10 (measured). A separate test checks
that the reference's default optimizer and constants are the module's.

Float64 everywhere but where the package itself computes in float32 (rewards, advantages, log-probs; the reference
does the same). Transformers' Qwen2 RMSNorm computes in float32 whatever the model's dtype, so the test model's norms
compute in its own: otherwise the package's prompt sharing in the log-prob passes, exact in real arithmetic, rounds
the gradient of a group's shared prompt once where per-row passes round each row's share, and the gradients agree to
about 1e-7 only (measured). The default path's fused output head (``update.fused_head``) accumulates in
the model's dtype (float32 at least): the ``defaults`` case runs it, the other turns it off.
"""

from __future__ import annotations

import copy
import importlib.util
from operator import attrgetter
from pathlib import Path
from types import ModuleType

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from peft import LoraConfig, PeftModel, get_peft_model
from torch.utils.data import DataLoader
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.config import SamplingConfig, UpdateConfig
from lightning_grpo.policy.optimizer import adapter_optimizer
from lightning_grpo.rollout.buckets import pick_decode_path
from lightning_grpo.rollout.packing import AUTO_PACKING_MIN_PADDING, padding_fraction
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
from tests.conftest import make_trainer

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference_grpo.py"
BATCHES = [["1+2=", "17+5="], ["3+3=", "12+9="], ["4+1=", "8+10="]]  # one batch of prompts per iteration
SIZES = {"num_generations": 4, "max_new_tokens": 8}
SEED, LR = 3, 0.1


def load_reference() -> ModuleType:
    """docs/reference_grpo.py as a module (it is not part of the package)."""
    spec = importlib.util.spec_from_file_location("reference_grpo", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def digit_share(prompts: list[str], completions: list[str]) -> list[float]:
    """The reward: the share of a completion's characters that are digits."""
    return [sum(c.isdigit() for c in completion) / (1 + len(completion)) for completion in completions]


class Float64RMSNorm(Qwen2RMSNorm):
    """Qwen2's RMSNorm in the dtype of its input (transformers' computes in float32 whatever the model's dtype)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def tiny_policy(seed: int = 0) -> tuple[PeftModel, object]:
    """The tiny model in float64 with a LoRA adapter of ``PolicyConfig()``'s settings, its B matrices not zero (so
    the reference policy differs from the policy from the start), and its tokenizer."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer).double()
    for norm in model.modules():
        if isinstance(norm, Qwen2RMSNorm):
            norm.__class__ = Float64RMSNorm
    with torch.no_grad():  # EOS likelier than "t", a frequent token: some completions end, some are truncated
        embeddings = model.get_input_embeddings().weight
        embeddings[tokenizer.eos_token_id] = 1.5 * embeddings[tokenizer.convert_tokens_to_ids("t")]
    settings = PolicyConfig()
    lora = LoraConfig(
        r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=settings.target_modules,
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # LoRA's A matrices
        policy = get_peft_model(model, lora)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * 0.02)
    return policy, tokenizer


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps the gradients of each optimizer step (after clipping: what the step applies)."""

    def __init__(self, params, **kwargs) -> None:
        super().__init__(params, **kwargs)
        self.gradients: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        self.gradients.append([p.grad.clone() for group in self.param_groups for p in group["params"]])
        return super().step(closure)


class RecordIterations(Callback):
    """Each iteration's step output and the adapter after it."""

    def __init__(self) -> None:
        self.outputs, self.adapters = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.outputs.append(outputs)
        self.adapters.append(adapter(pl_module.policy))


def adapter(policy: PeftModel) -> list[torch.Tensor]:
    """A copy of the adapter's weights."""
    return [p.detach().clone() for p in policy.parameters() if p.requires_grad]


def run_module(policy: PeftModel, tokenizer, update: UpdateConfig) -> tuple[RecordIterations, RecordingSGD]:
    """Three iterations of ``GRPOModule`` under a CPU ``Trainer``: its step outputs, adapters and gradients."""
    optimizers: list[RecordingSGD] = []

    def recording_sgd(params) -> RecordingSGD:
        optimizers.append(RecordingSGD(params, lr=LR))
        return optimizers[-1]

    module = GRPOModule(
        policy,
        [digit_share],
        tokenizer=tokenizer,
        grpo=GRPOConfig(sampling=SamplingConfig(**SIZES, max_prompt_length=16), update=update),
        optimizer=recording_sgd,
        seed=SEED,
        default_callbacks=False,
    )
    rows = [{"prompt": prompt} for prompts in BATCHES for prompt in prompts]
    loader = DataLoader(rows, batch_size=len(BATCHES[0]), collate_fn=lambda b: {"prompt": [r["prompt"] for r in b]})
    record = RecordIterations()
    make_trainer(max_steps=len(BATCHES), callbacks=[record]).fit(module, loader)
    assert len(record.outputs) == len(BATCHES) and len(optimizers[-1].gradients) == len(BATCHES)
    return record, optimizers[-1]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rel: float, what: str) -> None:
    """``actual`` equals ``expected`` entry by entry, to within ``rel`` times the largest entry of ``expected``."""
    error = (actual - expected).abs().max().item()
    scale = expected.abs().max().item()
    assert error <= rel * scale, f"{what}: max difference {error:.3g}, {error / scale:.3g} of the largest entry"


@pytest.mark.parametrize(
    "update",
    [
        pytest.param(UpdateConfig(fused_head=False), id="unfused-head"),
        pytest.param(UpdateConfig(), id="defaults"),
    ],
)
def test_reference_grpo_is_what_grpo_module_does(update: UpdateConfig) -> None:
    reference = load_reference()
    policy, tokenizer = tiny_policy()
    twin = copy.deepcopy(policy)  # the reference's copy: the same weights, adapter included
    record, module_optimizer = run_module(policy, tokenizer, update)
    optimizer = RecordingSGD([p for p in twin.parameters() if p.requires_grad], lr=LR)
    finished = 0
    for step, prompts in enumerate(BATCHES):
        expected = reference.grpo_iteration(
            twin, tokenizer, prompts, digit_share, optimizer, step=step, seed=SEED, **SIZES
        )
        out, where = record.outputs[step], f"iteration {step}"
        assert torch.equal(out["rollout"].completion_ids, expected["completion_ids"]), f"{where}: other tokens"
        finished += int((~out["rollout"].truncated).sum())
        assert torch.equal(out["rewards"].rewards, expected["rewards"]), f"{where}: rewards"
        assert torch.equal(out["advantages"], expected["advantages"]), f"{where}: advantages"
        assert_close(out["loss"], expected["loss"], 1e-10, f"{where}: loss")
        pairs = zip(module_optimizer.gradients[step], optimizer.gradients[step], strict=True)
        for index, (actual, wanted) in enumerate(pairs):
            assert_close(actual, wanted, 1e-10, f"{where}: gradient of adapter tensor {index}")
        for actual, wanted in zip(record.adapters[step], adapter(twin), strict=True):
            assert (actual - wanted).abs().max() <= 1e-8, f"{where}: adapter"
    assert 0 < finished < len(BATCHES) * len(BATCHES[0]) * SIZES["num_generations"]  # ended and truncated rows
    packed = {padding_fraction(out["rollout"]) >= AUTO_PACKING_MIN_PADDING for out in record.outputs}
    assert packed == {True, False}  # log-prob passes on packed rows and on padded rows ("auto")


def test_reference_defaults_are_grpo_module_defaults() -> None:
    """The reference's constants are ``GRPOConfig()``'s, on the path it implements, and its optimizer the module's."""
    reference, config = load_reference(), GRPOConfig()
    path = {  # each setting of GRPOConfig() that shapes the default path -> the reference's value of it
        "sampling.num_generations": reference.NUM_GENERATIONS,
        "sampling.max_new_tokens": reference.MAX_NEW_TOKENS,
        "sampling.temperature": reference.TEMPERATURE,
        "sampling.top_p": 1.0,
        "sampling.top_k": 0,
        "sampling.sampler": "multinomial",  # generate's draws, which the reference repeats
        "sampling.share_prompt": True,
        "sampling.drop_finished": False,
        "sampling.static_cache": False,
        "advantages.advantage_estimator": "grpo",
        "advantages.advantage_scale": "group",
        "advantages.advantage_eps": reference.ADVANTAGE_EPS,
        "advantages.dynamic_sampling": False,
        "objective.loss_kind": "clip",
        "objective.clip_low": reference.CLIP_LOW,
        "objective.clip_high": reference.CLIP_HIGH,
        "objective.dual_clip": reference.DUAL_CLIP,
        "objective.delta": None,
        "objective.kl_coef": reference.KL_COEF,
        "objective.kl_estimator": "k3",
        "objective.kl_weighting": None,
        "objective.loss_agg_mode": "token-mean",
        "objective.entropy_coef": 0.0,
        "objective.entropy_control": "constant",
        "objective.token_selection": None,
        "objective.mask_truncated_completions": False,
        "corrections.old_logprobs": "recompute",
        "update.ppo_epochs": 1,
        "update.mini_batch_size": None,
        "update.max_grad_norm": reference.MAX_GRAD_NORM,
    }
    assert {name: attrgetter(name)(config) for name in path} == path
    assert pick_decode_path(config.sampling.decode, "cpu") == "eager"  # generate, not the compiled loop
    policy, _ = tiny_policy()
    ours, theirs = reference.adapter_optimizer(policy), adapter_optimizer(policy)[0]
    assert type(ours) is type(theirs) and ours.defaults == theirs.defaults
    mine, package = ([p for group in o.param_groups for p in group["params"]] for o in (ours, theirs))
    assert len(mine) == len(package) and all(a is b for a, b in zip(mine, package, strict=True))
