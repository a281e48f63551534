"""A model load says what loads and how big it is before the silence of the load; a load bound to fail says nothing."""

from __future__ import annotations

import re

import lightning.fabric.utilities.rank_zero as rank_zero
import pytest

from lightning_grpo import GRPOModule, PolicyConfig
from lightning_grpo.policy import ModelLoadError
from lightning_grpo.policy.hub import announce_model_load
from lightning_grpo.testing import build_tiny_model


@pytest.fixture
def said(monkeypatch) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(rank_zero, "rank_zero_info", lines.append)
    return lines


def test_a_local_model_announces_its_size_before_it_loads(tokenizer, tmp_path, said):
    build_tiny_model(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    GRPOModule(str(tmp_path), [lambda prompts, completions, **_: [0.0] * len(completions)], policy=PolicyConfig())
    size = sum(path.stat().st_size for path in tmp_path.glob("*.safetensors"))
    assert said == [
        f"model: loading {tmp_path} ({size / 1e9:.2f} GB of weights; typically 1-4 s per GB from a local disk, more on "
        "a busy one)"
    ]  # once: the tokenizer's load says nothing


def test_an_uncached_hub_id_says_it_downloads_first_unless_offline(monkeypatch, said):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    announce_model_load("nobody-h4/not-a-cached-model")
    assert len(said) == 1 and re.match(r"model: downloading nobody-h4/not-a-cached-model from the Hugging", said[0])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    announce_model_load("nobody-h4/not-a-cached-model")  # the error that follows says it cannot be loaded
    assert len(said) == 1


def test_a_missing_folder_gets_its_error_and_no_announcement(tmp_path, said):
    with pytest.raises(ModelLoadError, match="does not exist"):
        GRPOModule(str(tmp_path / "missing" / "model"), [lambda prompts, completions, **_: [0.0]])
    assert said == []
