"""``tiny:<task>`` model names: built in code, warmed up deterministically, cached, and loadable through the policy."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo import GRPOModule, PolicyConfig
from lightning_grpo.data import make_task
from lightning_grpo.policy import load_tokenizer
from lightning_grpo.rewards import math_answer
from lightning_grpo.tiny import (
    WarmupSettings,
    build_tiny_model,
    build_tiny_tokenizer,
    is_tiny_name,
    load_tiny_model,
    tiny_cache_dir,
)

QUICK = WarmupSettings(steps=5, batch_size=8)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_tiny_names():
    assert is_tiny_name("tiny:addition") and is_tiny_name("tiny:random")
    assert not is_tiny_name("Qwen/Qwen2.5-0.5B") and not is_tiny_name(None)


def test_warm_up_is_deterministic_cached_and_leaves_the_global_rng_alone(tmp_path, monkeypatch):
    state = torch.random.get_rng_state()
    first = load_tiny_model("tiny:successor", settings=QUICK, cache_dir=tmp_path / "a")
    assert torch.equal(torch.random.get_rng_state(), state)
    second = load_tiny_model("tiny:successor", settings=QUICK, cache_dir=tmp_path / "b")  # a fresh warm-up
    assert _same_weights(first, second)
    assert not _same_weights(first, build_tiny_model(build_tiny_tokenizer()))  # it did train
    (cached,) = (tmp_path / "a").iterdir()
    assert cached.name == f"tiny-successor-{QUICK.fingerprint('successor')}"
    monkeypatch.setattr("lightning_grpo.tiny.warm_up", lambda *a, **k: pytest.fail("the cache was not used"))
    assert _same_weights(load_tiny_model("tiny:successor", settings=QUICK, cache_dir=tmp_path / "a"), first)


def test_random_and_unknown_names(tmp_path):
    assert _same_weights(load_tiny_model("tiny:random", cache_dir=tmp_path), build_tiny_model(build_tiny_tokenizer()))
    assert not list(tmp_path.iterdir())  # nothing to cache
    with pytest.raises(ValueError, match="valid tasks"):
        load_tiny_model("tiny:chess", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="not a tiny model name"):
        load_tiny_model("gpt2")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(tmp_path))
    assert tiny_cache_dir() == tmp_path
    monkeypatch.delenv("LIGHTNING_GRPO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tiny_cache_dir() == tmp_path / "xdg" / "lightning_grpo"


def test_the_policy_loads_tiny_names_model_and_tokenizer():
    tokenizer = load_tokenizer(None, "tiny:random")
    assert tokenizer.decode(tokenizer("3+4=7", add_special_tokens=False)["input_ids"]) == "3+4=7"
    module = GRPOModule("tiny:random", [math_answer], policy=PolicyConfig(lora_r=2))
    assert module.tokenizer.eos_token == "<eos>" and module.hparams["model"] == "tiny:random"
    assert type(module.policy.get_base_model()).__name__ == "Qwen2ForCausalLM"


def test_warmed_up_addition_model_is_right_about_a_third_of_the_time(warm_tiny_cache):
    """The demo's premise: the format is learnt and the sampled answer is right sometimes, not always."""
    model, tokenizer = load_tiny_model("tiny:addition").eval(), build_tiny_tokenizer()
    records = make_task("addition", num_samples=256, seed=123)
    inputs = tokenizer([r["prompt"] for r in records], add_special_tokens=False, return_tensors="pt")
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(
            **inputs, do_sample=True, top_k=0, max_new_tokens=3, pad_token_id=tokenizer.pad_token_id
        )  # fmt: skip
    completions = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    accuracy = sum(math_answer([], completions, [r["answer"] for r in records])) / len(records)
    assert 0.15 <= accuracy <= 0.5
    assert all(c.isdigit() for c in completions[:50])  # the format: digits, then <eos>
