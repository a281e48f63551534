"""``GRPOConfig.sampling.decode`` through the Hugging Face backend: the compiled path kept for the run, its fallbacks,
a fit."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader

from lightning_grpo import GRPOConfig, PolicyConfig
from lightning_grpo.backends import HFBackend
from lightning_grpo.backends.protocol import BackendSpec
from lightning_grpo.config import AgentConfig, ObjectiveConfig, SamplingConfig
from lightning_grpo.policy import load_policy
from lightning_grpo.rollout import SampleRequest, SamplingSettings, buckets, compiled_decode
from lightning_grpo.rollout import decode as decode_module
from lightning_grpo.rollout import generation as generation_module
from lightning_grpo.rollout.sampling_settings import eos_token_ids
from lightning_grpo.testing import build_tiny_model
from tests.conftest import make_trainer, tiny_sampling

PROMPTS = ["1+2=", "33+4=", "x", "hello world"]


@pytest.fixture(autouse=True)
def eager_compile(monkeypatch):
    """Compile with dynamo's tracing and guards but no code generation (fast), from a clean dynamo state."""
    monkeypatch.setattr(compiled_decode, "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _backend(multi_turn: bool = False, agents: AgentConfig | None = None, **sampling: Any) -> HFBackend:
    """A backend for a single-turn run (``multi_turn=True``: a run with tools or an environment); ``sampling``: settings
    of ``GRPOConfig.sampling``."""
    sampling = {"max_prompt_length": 16, "max_new_tokens": 8, "num_generations": 2, **sampling}
    grpo = GRPOConfig(sampling=SamplingConfig(**sampling), agents=agents or AgentConfig())
    return HFBackend(None, BackendSpec(grpo, PolicyConfig(), multi_turn=multi_turn))


def _policy(tokenizer, dtype=torch.float64):
    torch.manual_seed(0)
    return load_policy(build_tiny_model(tokenizer).to(dtype), PolicyConfig(lora_r=4, lora_alpha=8)).eval()


def _call(session, policy, tokenizer, settings, seed=0, prompts=PROMPTS):
    ids, mask = generation_module.tokenize_prompts(tokenizer, prompts, 16, torch.device("cpu"))
    torch.manual_seed(seed)
    with torch.no_grad():
        return session.sample(policy, tokenizer, SampleRequest(ids, mask, settings))  # rows: 0 .. R*G-1


def test_compiled_sessions_share_one_decoder_and_its_caches(tokenizer):
    """Every session of the run samples with the backend's decoder: the static cache of a bucket is reused, and the
    tokens are the eager loop's (float64, same seed)."""
    policy, backend = _policy(tokenizer), _backend(decode="compiled", sampler="inverse_cdf")
    settings = SamplingSettings(2, 8, sampler="inverse_cdf")
    first = backend.session(policy, settings)
    sampled = _call(first, policy, tokenizer, settings)
    first.close()
    cache = next(iter(backend.decoder._buckets.values())).cache
    second = backend.session(policy, settings)
    assert second.decoder is backend.decoder
    _call(second, policy, tokenizer, settings, seed=1)
    second.close()
    assert next(iter(backend.decoder._buckets.values())).cache is cache and len(backend.decoder._buckets) == 1
    ids, mask = generation_module.tokenize_prompts(tokenizer, PROMPTS, 16, torch.device("cpu"))
    torch.manual_seed(0)
    with torch.no_grad():
        eager = decode_module.decode_loop(policy, ids, mask, settings, eos_token_ids(tokenizer),
                                              tokenizer.pad_token_id)  # fmt: skip
    assert torch.equal(sampled.sequences, eager.sequences)
    backend.close()
    assert not backend.decoder._buckets


def test_auto_keeps_the_eager_path_until_measured(tokenizer, monkeypatch):
    policy = _policy(tokenizer)
    assert _backend().session(policy, SamplingSettings(2, 8)).decoder is None  # CPU_PREFERS_COMPILED is False
    monkeypatch.setattr(buckets, "CPU_PREFERS_COMPILED", True)
    assert _backend().session(policy, SamplingSettings(2, 8)).decoder is not None
    assert _backend(decode="eager").session(policy, SamplingSettings(2, 8)).decoder is None
    dropping = SamplingSettings(2, 8, drop_finished=True)
    assert _backend(drop_finished=True).session(policy, dropping).decoder is None  # auto: the eager loop's switch


def test_a_model_that_cannot_compile(tokenizer, monkeypatch, caplog):
    """``compiled``: an error naming the model class and what runs instead; ``auto``: eager, logged once."""
    policy = _policy(tokenizer)
    monkeypatch.setattr(type(policy.get_base_model()), "_can_compile_fullgraph", False)
    with pytest.raises(ValueError, match=r"Qwen2ForCausalLM does not support a static KV cache.*'eager'"):
        _backend(decode="compiled").session(policy, SamplingSettings(2, 8))
    monkeypatch.setattr(buckets, "CPU_PREFERS_COMPILED", True)
    backend = _backend()
    with caplog.at_level(logging.WARNING):
        sessions = [backend.session(policy, SamplingSettings(2, 8)) for _ in range(2)]
    assert all(s.decoder is None for s in sessions)
    assert sum("decode: auto samples eagerly" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("turn_cache", [None, True], ids=["default", "true"])
def test_the_turn_cache_wins_over_the_compiled_path_for_agent_turns(tokenizer, caplog, turn_cache):
    """The rule of which one wins: in a multi-turn run the turn cache (on by default) keeps each trajectory's KV cache
    and our eager loop samples the turns, said once; ``turn_cache: false`` samples every turn compiled; a single-turn
    run samples compiled whatever ``turn_cache`` is left to."""
    policy = _policy(tokenizer)
    settings = SamplingSettings(2, 8)
    backend = _backend(True, AgentConfig(turn_cache=turn_cache, max_turns=3), decode="compiled")
    with caplog.at_level(logging.WARNING):
        session = backend.session(policy, settings)
        backend.session(policy, settings).close()
    assert sum("agent turns are sampled by the eager loop" in r.message for r in caplog.records) == 1
    _call(session, policy, tokenizer, settings)
    assert session.turn_cache.prefilled > 0 and not backend.decoder._buckets  # the turn cache sampled it
    session.close()
    for off in (
        _backend(True, AgentConfig(turn_cache=False, max_turns=3), decode="compiled"),
        _backend(decode="compiled"),
    ):
        compiled = off.session(policy, settings)
        assert compiled.turn_cache is None
        _call(compiled, policy, tokenizer, settings)
        assert compiled.decoder._buckets  # the compiled path sampled it


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"decode": "fast"}, r"decode.*'auto', 'eager', 'compiled'"),
        ({"decode": "compiled", "decode_lengths": [20]}, r"decode_lengths \[20\].*at least 24"),
        ({"decode": "compiled", "drop_finished": True}, "drop_finished"),
        ({"decode": "compiled", "static_cache": True}, "static_cache"),
    ],
)
def test_bad_decode_settings_are_refused(settings, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(sampling=SamplingConfig(max_prompt_length=16, max_new_tokens=8, **settings))


def test_a_20_step_fit_compiles_once_per_bucket(make_module):
    """Item 2: 20 steps, the adapter changing every step, prompt counts (4, 6 or 8 rows: buckets of 4 and 8 rows) and
    lengths varying: the decode step compiles once per bucket, never again, without a graph break."""
    words = ["1+2=", "33+4=", "x", "hello world", "7", "12+30=", "abc abc", "9+9="]
    rows = [{"prompt": w} for w in words * 8]
    sizes = [2 + step % 3 for step in range(20)]  # 2, 3 or 4 prompts x G=2
    starts = [sum(sizes[:i]) for i in range(20)]
    batches = [list(range(start, start + size)) for start, size in zip(starts, sizes, strict=True)]
    loader = DataLoader(rows, batch_sampler=batches, collate_fn=lambda b: {"prompt": [r["prompt"] for r in b]})
    module = make_module(
        sampling=tiny_sampling(num_generations=2, decode="compiled", sampler="inverse_cdf"),
        objective=ObjectiveConfig(kl_coef=0.0),
    )
    lora = [p for name, p in module.policy.named_parameters() if "lora_B" in name]
    before = [p.detach().clone() for p in lora]
    make_trainer(max_steps=20).fit(module, loader)
    assert counters["stats"]["unique_graphs"] == 2  # one graph per bucket: nothing recompiled after its first step
    assert not module.rollout_backend.decoder._buckets  # the static caches are freed when fit ends
    assert not counters["graph_break"]
    assert any(not torch.equal(a, b) for a, b in zip(before, lora, strict=True))  # the adapter did change


def test_a_backend_without_decode_refuses_anything_but_auto():
    from lightning_grpo.backends.build import check_supported
    from lightning_grpo.backends.vllm.backend import VLLMBackend

    check_supported(VLLMBackend, BackendSpec(GRPOConfig(), PolicyConfig()), "vllm")  # auto: nothing asked of it
    spec = BackendSpec(GRPOConfig(sampling=SamplingConfig(decode="compiled")), PolicyConfig())
    with pytest.raises(
        ValueError, match=r"GRPOConfig\.sampling\.decode='compiled'.*'vllm' does not honour decode.*'auto'"
    ):
        check_supported(VLLMBackend, spec, "vllm")
