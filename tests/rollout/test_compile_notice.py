"""The compiled decode path says that torch.compile builds a step, and about how long, once per new shape."""

from __future__ import annotations

import lightning.fabric.utilities.rank_zero as rank_zero
import torch

from lightning_grpo.rollout import SampleRequest, SamplingSettings
from lightning_grpo.rollout import compiled_decode as compiled_module
from lightning_grpo.rollout import generation as generation_module
from lightning_grpo.rollout.buckets import DecodeBuckets
from lightning_grpo.rollout.compiled_decode import CompiledDecoder
from lightning_grpo.testing import build_tiny_model


def _sample(decoder, model, tokenizer, prompts):
    ids, mask = generation_module.tokenize_prompts(tokenizer, prompts, 16, torch.device("cpu"))
    decoder.sample(model, tokenizer, SampleRequest(ids, mask, SamplingSettings(2, 4)))


def test_each_new_shape_is_announced_once_before_it_compiles(tokenizer, monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(rank_zero, "rank_zero_info", said.append)
    decoder = CompiledDecoder(DecodeBuckets.for_run(None, max_prompt_length=16, max_new_tokens=4))  # inductor
    monkeypatch.setattr(decoder, "_step_fn", lambda device_type: compiled_module._decode_step)  # no real compile
    model = build_tiny_model(tokenizer).eval()
    _sample(decoder, model, tokenizer, ["1+2="])
    _sample(decoder, model, tokenizer, ["3+4="])  # the same bucket: compiled already
    assert len(said) == 1
    assert said[0].startswith("compiled decode: torch.compile builds the decode step for a new shape (2 rows x ")
    assert "once per shape: about 10-60 s" in said[0]
    _sample(decoder, model, tokenizer, ["1+2=", "3+4=", "5+6="])  # 6 rows: a bucket of 8, a new graph
    assert len(said) == 2 and "(8 rows x " in said[1]


def test_the_eager_backend_of_the_tests_compiles_nothing_and_says_nothing(tokenizer, monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(rank_zero, "rank_zero_info", said.append)
    decoder = CompiledDecoder(DecodeBuckets.for_run(None, max_prompt_length=16, max_new_tokens=4), backend="eager")
    monkeypatch.setattr(decoder, "_step_fn", lambda device_type: compiled_module._decode_step)
    _sample(decoder, build_tiny_model(tokenizer).eval(), tokenizer, ["1+2="])
    assert said == []
