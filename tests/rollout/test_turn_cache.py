"""The turn cache (``GRPOConfig.agents.turn_cache``): each trajectory keeps its KV cache across agent turns, and a later
turn prefills only the inserted tokens; the tokens sampled are those of a full re-prefill (docs/agents.md, cost)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightning_grpo import GRPOConfig, PolicyConfig
from lightning_grpo.agents import EnvStep
from lightning_grpo.backends.build import build_backend
from lightning_grpo.backends.hf import HFBackend
from lightning_grpo.backends.protocol import BackendSpec
from lightning_grpo.config import AgentConfig, BackendConfig
from lightning_grpo.rollout import SampleRequest, SamplingSettings
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.multi_turn import generate_conversations
from lightning_grpo.rollout.turn_cache import TurnCache
from lightning_grpo.settings_checks import SettingError
from lightning_grpo.testing.agents import short_turn_model

PROMPTS = [[{"role": "user", "content": "go"}], [{"role": "user", "content": "play 2"}]]


class RaggedEnv:
    """Lasts ``row["turns"]`` turns; each observation's length depends on the turn's length, so the tokens inserted
    differ in length from one trajectory to the next."""

    def __init__(self, row: dict[str, Any]) -> None:
        self.left = int(row["turns"])

    def reset(self) -> None:
        return None

    def step(self, message: dict[str, Any]) -> EnvStep:
        self.left -= 1
        words = " ".join(["again"] * (1 + len(message["content"]) % 4))
        return EnvStep(observation=None if self.left <= 0 else words, reward=0.0, done=self.left <= 0)


@pytest.fixture(scope="module")
def model(tokenizer_module):
    return short_turn_model(tokenizer_module).double().eval()  # float64: no rounding flips a draw


@pytest.fixture(scope="module")
def tokenizer_module():
    from lightning_grpo.testing import build_tiny_tokenizer

    return build_tiny_tokenizer()


def _rollout(model, tokenizer, settings, *, turn_cache: bool | None, g: int = 3, seed: int = 0):
    """A rollout through the Hugging Face backend's session, ``turn_cache`` as ``GRPOConfig.agents.turn_cache``."""
    agent = AgentSettings(environment_factory=RaggedEnv, max_turns=4)
    settings = SamplingSettings(num_generations=g, max_new_tokens=120, **settings)
    session = _backend(max_turns=4, turn_cache=turn_cache).session(model, settings)
    calls: list[tuple[int, int]] = []  # (rows asked, trajectories whose caches are kept) per call
    if session.turn_cache is not None:
        sample = session.sample

        def counting(model, tokenizer, request):
            out = sample(model, tokenizer, request)
            calls.append((len(request.rows), len(session.turn_cache)))
            return out

        session.sample = counting
    torch.manual_seed(seed)
    rollout = generate_conversations(model, tokenizer, PROMPTS, settings, agent, max_prompt_length=64,
                                     columns={"turns": [3, 4]}, sample=session)  # fmt: skip
    return rollout, session, calls


@pytest.mark.parametrize(
    "settings",
    [{}, {"sampler": "inverse_cdf"}, {"sampler": "inverse_cdf", "drop_finished": True}, {"drop_finished": True}],
    ids=["multinomial-vs-generate", "inverse_cdf", "inverse_cdf-drop_finished", "multinomial-drop_finished"],
)
@pytest.mark.parametrize("turn_cache", [None, True], ids=["default", "true"])
def test_the_kept_cache_samples_the_tokens_of_a_full_re_prefill(model, tokenizer_module, settings, turn_cache):
    """At the default settings (``turn_cache: None``, ``sampler: multinomial``) the turn cache is kept, and our loop's
    draws are ``generate``'s: the same tokens as a full re-prefill (``turn_cache: false``) for the same seed."""
    for seed in (0, 1):
        full, plain, _ = _rollout(model, tokenizer_module, settings, turn_cache=False, seed=seed)
        kept, session, calls = _rollout(model, tokenizer_module, settings, turn_cache=turn_cache, seed=seed)
        assert plain.turn_cache is None and session.turn_cache is not None
        assert full.turns.num_turns.max() >= 3  # several turns, so later turns did run from the kept caches
        assert torch.equal(kept.completion_ids, full.completion_ids)
        assert torch.equal(kept.sampled_mask, full.sampled_mask) and torch.equal(kept.truncated, full.truncated)
        torch.testing.assert_close(kept.logprobs, full.logprobs, rtol=0, atol=1e-6)
        cache = session.turn_cache
        assert cache.reused > cache.prefilled  # the later turns read their contexts from the caches
        assert all(held <= asked for asked, held in calls)  # finished trajectories left the cache


@pytest.mark.parametrize(
    "settings",
    [{"top_p": 0.8, "top_k": 20}, {"top_p": 0.8, "top_k": 20, "min_p": 0.05, "sampler": "inverse_cdf"}],
    ids=["top_p-top_k", "min_p-inverse_cdf"],
)
def test_the_kept_cache_records_the_kept_sets_of_a_full_re_prefill(model, tokenizer_module, settings):
    """Truncated sampling: the kept cache's margins (and log-probs over the kept set) are the full re-prefill's."""
    settings = {"temperature": 0.9, **settings}
    full, _, _ = _rollout(model, tokenizer_module, settings, turn_cache=False)
    kept, session, _ = _rollout(model, tokenizer_module, settings, turn_cache=True)
    assert session.turn_cache.reused > 0 and full.turns.num_turns.max() >= 3
    assert torch.equal(kept.completion_ids, full.completion_ids) and torch.equal(kept.sampled_mask, full.sampled_mask)
    assert kept.kept_margins is not None and full.kept_margins is not None
    torch.testing.assert_close(kept.kept_margins, full.kept_margins, rtol=0, atol=1e-5)
    torch.testing.assert_close(kept.logprobs, full.logprobs, rtol=0, atol=1e-6)
    inserted = kept.completion_mask.bool() & ~kept.sampled_mask.bool()
    assert inserted.any() and (kept.kept_margins[inserted] == 0).all()
    assert (kept.kept_margins[kept.sampled_mask.bool()] > 0).any()


def test_inserted_tokens_differ_in_length_across_trajectories(model, tokenizer_module):
    rollout, _, _ = _rollout(model, tokenizer_module, {"sampler": "inverse_cdf"}, turn_cache=True)
    inserted = (rollout.completion_mask - rollout.sampled_mask).sum(1)
    assert len(set(inserted.tolist())) > 1


def test_a_context_that_changed_under_the_cache_is_prefilled_from_where_it_differs(model, tokenizer_module):
    settings = SamplingSettings(num_generations=1, max_new_tokens=6, sampler="inverse_cdf")
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    mask = torch.ones_like(ids)
    cache = TurnCache()
    torch.manual_seed(0)
    first = cache.sample(model, tokenizer_module, SampleRequest(ids, mask, settings, rows=[0, 1]))
    context = first.sequences.clone()
    context[0, 2] = 13  # row 0's context differs from its cache at position 2; row 1's is its cache plus one token
    torch.manual_seed(1)
    resumed = cache.sample(
        model, tokenizer_module, SampleRequest(context, torch.ones_like(context), settings, rows=[0, 1])
    )
    torch.manual_seed(1)
    fresh = TurnCache().sample(
        model, tokenizer_module, SampleRequest(context, torch.ones_like(context), settings, rows=[0, 1])
    )
    assert torch.equal(resumed.sequences, fresh.sequences)
    torch.testing.assert_close(resumed.logprobs, fresh.logprobs, rtol=0, atol=1e-6)
    assert cache.reused >= 2


def _backend(multi_turn: bool | None = None, **agents: Any) -> HFBackend:
    return HFBackend(None, BackendSpec(GRPOConfig(agents=AgentConfig(**agents)), PolicyConfig(), multi_turn=multi_turn))


def test_the_default_keeps_the_cache_for_every_multi_turn_run_whatever_the_sampler(model):
    inverse = SamplingSettings(2, 8, sampler="inverse_cdf")
    default = SamplingSettings(2, 8)
    assert _backend(max_turns=3).session(model, default).turn_cache is not None  # the default sampler too
    assert _backend(max_turns=3).session(model, inverse).turn_cache is not None
    assert _backend(max_turns=1).session(model, default).turn_cache is None  # one turn: nothing to keep
    assert _backend(max_turns=3, multi_turn=False).session(model, default).turn_cache is None  # no tools/environment
    assert _backend(max_turns=1, multi_turn=True).session(model, default).turn_cache is not None  # agent code
    assert _backend(max_turns=1, turn_cache=True).session(model, default).turn_cache is not None
    assert _backend(max_turns=3, turn_cache=False).session(model, inverse).turn_cache is None


def test_the_module_tells_the_backend_whether_its_rollouts_take_turns():
    from lightning_grpo import GRPOModule
    from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
    from lightning_grpo.testing.agents import CountdownEnv

    tokenizer = build_tiny_tokenizer()

    def module(**kwargs: Any) -> GRPOModule:
        grpo = GRPOConfig(**kwargs.pop("grpo", {}))
        return GRPOModule(build_tiny_model(tokenizer), [lambda completions, **_: [0.0] * len(completions)],
                          tokenizer=tokenizer, grpo=grpo, **kwargs)  # fmt: skip

    assert not module().rollout_backend.multi_turn  # max_turns is 4 by default, but nothing takes a turn
    assert module(environment_factory=CountdownEnv).rollout_backend.multi_turn
    assert not module(environment_factory=CountdownEnv, grpo={"agents": {"max_turns": 1}}).rollout_backend.multi_turn

    async def agent(client, row):  # agent code may call as often as it likes: max_turns does not bound it
        return 1.0

    assert module(agent=agent, grpo={"agents": {"max_turns": 1}}).rollout_backend.multi_turn


def test_a_turn_cache_that_cannot_be_kept_is_a_clear_error(model):
    with pytest.raises(ValueError, match=r"turn_cache=True cannot be kept under FSDP2.*generate"):
        _backend(turn_cache=True).session(model, SamplingSettings(2, 8, synced_gpus=True))
    with pytest.raises(ValueError, match=r"turn_cache=True cannot be kept with static_cache=True"):
        _backend(turn_cache=True).session(model, SamplingSettings(2, 8, static_cache=True))
    assert _backend().session(model, SamplingSettings(2, 8, synced_gpus=True, sampler="inverse_cdf")).turn_cache is None
    with pytest.raises(SettingError, match=r"turn_cache='yes' is not valid; choose one of None \(auto\), True, False"):
        build_backend(BackendSpec(GRPOConfig(agents=AgentConfig(turn_cache="yes")), PolicyConfig()))


def test_the_vllm_backend_refuses_a_turn_cache_and_says_what_it_does_instead():
    pytest.importorskip("vllm")
    with pytest.raises(SettingError, match=r"backend 'vllm' does not keep.*prefix cache.*turn_cache to None"):
        build_backend(
            BackendSpec(
                GRPOConfig(backend=BackendConfig(rollout_backend="vllm"), agents=AgentConfig(turn_cache=True)),
                PolicyConfig(),
                "tiny",
            )
        )


@pytest.mark.parametrize("layers", [2, 6])
def test_keeping_a_batch_of_caches_syncs_once_per_row_whatever_the_layers(layers):
    """Each leaving row's positions are found once (one ``nonzero``) and every layer is read with them, not through a
    boolean index per layer's keys and values (a host sync each on a GPU)."""
    from transformers import DynamicCache

    from lightning_grpo.rollout.turn_cache import _take
    from lightning_grpo.testing.dispatch import DispatchCounter

    data = [(torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)) for _ in range(layers)]
    cache = DynamicCache(ddp_cache_data=data)
    mask = torch.tensor([[1, 1, 0, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    with DispatchCounter() as counter:
        taken = _take(cache, torch.tensor([7, 8, 9]), torch.arange(3), mask)
    assert counter.syncs == 2 + 3  # the two row lists, then one per row
    count, kept = taken[7]
    assert count == 4 and len(kept) == layers
    torch.testing.assert_close(kept[-1][0], data[-1][0][0][:, [0, 1, 3, 4]], rtol=0, atol=0)


@pytest.mark.parametrize("explicit_ends", [False, True], ids=["turn-loop", "told"])
def test_a_trajectory_absent_from_a_call_ends_unless_ends_are_told(model, tokenizer_module, explicit_ends):
    """The turn loop drops an absent trajectory's cache at once (memory); agent code, whose calls arrive out of step,
    keeps it until :meth:`TurnCache.finish` names the trajectory."""
    settings = SamplingSettings(num_generations=1, max_new_tokens=4, sampler="inverse_cdf")
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    cache = TurnCache(explicit_ends=explicit_ends)
    first = cache.sample(model, tokenizer_module, SampleRequest(ids, torch.ones_like(ids), settings, rows=[0, 1]))
    cache.sample(
        model,
        tokenizer_module,
        SampleRequest(first.sequences[1:], torch.ones_like(first.sequences[1:]), settings, rows=[1]),
    )
    assert len(cache) == (2 if explicit_ends else 1)
    cache.finish([0, 7])  # a row without a cache is skipped
    assert len(cache) == 1
    prefilled = cache.prefilled
    cache.sample(
        model,
        tokenizer_module,
        SampleRequest(first.sequences[:1], torch.ones_like(first.sequences[:1]), settings, rows=[0]),
    )
    assert cache.prefilled - prefilled == first.sequences.shape[1]  # its cache is gone: the whole context again


def test_a_turn_cache_given_as_the_sampler_is_used_while_it_is_empty(model, tokenizer_module):
    """An empty :class:`TurnCache` has length 0 (falsy): the turn loop must still sample through it."""
    cache = TurnCache()
    assert not cache
    agent = AgentSettings(environment_factory=RaggedEnv, max_turns=4)
    settings = SamplingSettings(num_generations=2, max_new_tokens=60, sampler="inverse_cdf")
    generate_conversations(model, tokenizer_module, PROMPTS, settings, agent, max_prompt_length=64,
                           columns={"turns": [3, 4]}, sample=cache)  # fmt: skip
    assert cache.prefilled > 0 and cache.reused > 0
