"""The tiny model: built in code, warmed up deterministically, cached, and usable as a policy like any other model."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo import GRPOModule, PolicyConfig
from lightning_grpo.rewards import math_answer
from lightning_grpo.testing import (
    TinyModel,
    TinyTokenizer,
    WarmupSettings,
    build_tiny_model,
    build_tiny_tokenizer,
    load_tiny_model,
    make_task,
    tiny_cache_dir,
)

QUICK = WarmupSettings(steps=5, batch_size=8)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_warm_up_is_deterministic_cached_and_leaves_the_global_rng_alone(tmp_path, monkeypatch):
    state = torch.random.get_rng_state()
    first = load_tiny_model("successor", settings=QUICK, cache_dir=tmp_path / "a")
    assert torch.equal(torch.random.get_rng_state(), state)
    second = load_tiny_model("successor", settings=QUICK, cache_dir=tmp_path / "b")  # a fresh warm-up
    assert _same_weights(first, second)
    assert not _same_weights(first, build_tiny_model(build_tiny_tokenizer()))  # it did train
    (cached,) = (tmp_path / "a").iterdir()
    assert cached.name == f"tiny-successor-{QUICK.fingerprint('successor')}"
    monkeypatch.setattr(
        "lightning_grpo.testing.tiny_model.warm_up", lambda *a, **k: pytest.fail("the cache was not used")
    )
    assert _same_weights(load_tiny_model("successor", settings=QUICK, cache_dir=tmp_path / "a"), first)


def test_random_and_unknown_tasks(tmp_path):
    assert _same_weights(load_tiny_model("random", cache_dir=tmp_path), build_tiny_model(build_tiny_tokenizer()))
    assert not list(tmp_path.iterdir())  # nothing to cache
    with pytest.raises(ValueError, match="valid tasks"):
        load_tiny_model("chess", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="valid tasks"):
        TinyModel("chess", cache_dir=str(tmp_path))


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(tmp_path))
    assert tiny_cache_dir() == tmp_path
    monkeypatch.delenv("LIGHTNING_GRPO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tiny_cache_dir() == tmp_path / "xdg" / "lightning_grpo"


def test_tiny_model_class_has_the_weights_of_the_functions(tmp_path, warm_tiny_cache):
    """``TinyModel(task)`` is ``load_tiny_model(task)`` as a class: same weights, random or warmed up."""
    random_model = TinyModel()
    assert isinstance(random_model, torch.nn.Module) and random_model.task == "random"
    assert _same_weights(random_model, build_tiny_model(build_tiny_tokenizer()))
    assert _same_weights(TinyModel("addition"), load_tiny_model("addition"))
    assert not _same_weights(TinyModel("addition"), random_model)
    small = TinyModel(hidden_size=32, num_layers=1, seed=3)
    assert small.config.hidden_size == 32 and small.config.num_hidden_layers == 1
    assert _same_weights(small, build_tiny_model(build_tiny_tokenizer(), hidden_size=32, num_layers=1, seed=3))


def test_the_policy_takes_the_tiny_model_and_tokenizer_as_objects():
    module = GRPOModule(TinyModel(), [math_answer], tokenizer=TinyTokenizer(), policy=PolicyConfig(lora_r=2))
    assert module.tokenizer.eos_token == "<eos>"
    assert isinstance(module.policy.get_base_model(), TinyModel)


@pytest.mark.learning
def test_warmed_up_addition_model_is_right_about_a_third_of_the_time(warm_tiny_cache):
    """The demo's premise: the format is learnt and the sampled answer is right sometimes, not always."""
    model, tokenizer = TinyModel("addition").eval(), build_tiny_tokenizer()
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


def test_a_warm_up_says_so_before_its_silence_and_a_cached_load_says_nothing(tmp_path, capsys):
    load_tiny_model("successor", settings=QUICK, cache_dir=tmp_path)
    err = capsys.readouterr().err
    assert err.startswith(f"tiny model: warming up on successor ({QUICK.steps} supervised steps;"), err
    assert f"cached in {tmp_path}" in err
    load_tiny_model("successor", settings=QUICK, cache_dir=tmp_path)
    assert "warming up" not in capsys.readouterr().err
