"""A backend written in user code: chosen by import path, its settings checked, started, synced, sampled through one
session per rollout (told which trajectory each row continues), released for the update and closed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch

from lightning_grpo import GRPOConfig, GRPOModule, RolloutBackend
from lightning_grpo.backends import HFBackend, RolloutSession
from lightning_grpo.config import BackendConfig, CorrectionConfig, ValidationConfig
from lightning_grpo.rollout import AgentSettings, SamplingSettings, sample_rollout
from lightning_grpo.rollout.generation import sample_tokens
from lightning_grpo.rollout.sampling_settings import Sampled, SampleRequest
from lightning_grpo.testing.agents import CountdownEnv, short_turn_model
from tests.conftest import count_a, make_trainer, prompt_loader, tiny_sampling

PATH = "tests.backends.test_user_backend.RecordingBackend"
PROMPTS = ["1+1=", "2+3="]


@dataclass
class RecordingSettings:
    """The backend's own settings (``grpo.backend.rollout_backend_args``)."""

    tag: str = "default"
    scale: int = 1


class RecordingSession:
    """Samples with the policy itself (as the Hugging Face backend does); counts the turns of each trajectory."""

    def __init__(self, backend: RecordingBackend) -> None:
        self.backend, self.turns = backend, Counter[int]()

    def sample(self, model, tokenizer, request: SampleRequest) -> Sampled:
        self.backend.events.append(("sample", list(request.rows)))
        self.turns.update(request.rows)  # per-trajectory state kept from one turn to the next
        return sample_tokens(model, tokenizer, request)

    def close(self) -> None:
        self.backend.events.append(("close session",))
        self.backend.turns.append(dict(self.turns))


class RecordingBackend:
    """Records every call the module makes; honours ``top_p`` only of the optional settings."""

    settings_class: ClassVar[type | None] = RecordingSettings
    supported_settings: ClassVar[frozenset[str]] = frozenset({"top_p"})
    built: ClassVar[list[RecordingBackend]] = []

    def __init__(self, settings: RecordingSettings, spec: Any) -> None:
        self.settings, self.spec, self.events, self.turns = settings, spec, [], []
        RecordingBackend.built.append(self)

    def start(self, policy, seed, *, sharded):
        self.events.append(("start", seed, sharded))

    def sync(self, policy, version):
        self.events.append(("sync", version))

    def session(self, policy, settings):
        self.events.append(("session",))
        return RecordingSession(self)

    def release(self):
        self.events.append(("release",))

    def close(self):
        self.events.append(("close",))


class HalfBackend:
    """Not a backend: no session, no release."""

    settings_class = None
    supported_settings = frozenset()

    def start(self, policy, seed, *, sharded): ...
    def sync(self, policy, version): ...
    def close(self): ...


def not_a_class() -> None:
    """A function, not a backend."""


def test_a_backend_named_by_import_path_runs_the_whole_fit(make_module):
    module = make_module(backend=BackendConfig(rollout_backend=PATH, rollout_backend_args={"tag": "mine"}))
    backend = module.rollout_backend
    assert isinstance(backend, RecordingBackend) and isinstance(backend, RolloutBackend)
    assert backend.settings == RecordingSettings(tag="mine") and backend.spec.grpo is module.config
    assert module.hparams["grpo"]["backend"]["rollout_backend_args"] == {"tag": "mine"}  # saved with the checkpoint
    make_trainer(max_steps=2).fit(module, prompt_loader(PROMPTS, repeat=2))
    rows = list(range(len(PROMPTS) * module.config.sampling.num_generations))
    step = [("session",), ("sample", rows), ("close session",), ("release",)]
    assert backend.events == [("start", 0, False), ("sync", 0), ("sync", 0), *step, ("sync", 1), ("sync", 1), *step,
                              ("close",)]  # fmt: skip


def test_the_backend_is_closed_when_the_fit_fails(make_module):
    def broken(prompts, completions, **_):
        raise RuntimeError("reward service down")

    module = make_module([broken], backend=BackendConfig(rollout_backend=PATH))
    with pytest.raises(RuntimeError, match="reward service down"):
        make_trainer(max_steps=2).fit(module, prompt_loader(PROMPTS))
    assert module.rollout_backend.events[-1] == ("close",) and ("close session",) in module.rollout_backend.events


def test_validate_test_and_predict_on_their_own_start_the_backend_and_close_it_at_their_end(make_module, tmp_path):
    module = make_module(backend=BackendConfig(rollout_backend=PATH), validation=ValidationConfig(num_generations=2))
    backend, loader = module.rollout_backend, prompt_loader(PROMPTS)
    (validated,) = make_trainer().validate(module, loader)
    (tested,) = make_trainer().test(module, loader)
    (predicted,) = make_trainer(default_root_dir=tmp_path).predict(module, loader)  # predictions.jsonl goes there
    assert set(validated) == {"val/reward_mean", "val/accuracy", "val/pass@2"}
    assert set(tested) == {"test/reward_mean", "test/accuracy", "test/pass@2"}
    assert [row["prompt"] for row in predicted] == PROMPTS and all(len(row["completions"]) == 2 for row in predicted)
    rollout = [("sync", 0), ("session",), ("sample", list(range(4))), ("close session",)]
    assert backend.events == [("start", 0, False), ("sync", 0), *rollout, ("close",)] * 3  # started, then closed


def test_the_validation_inside_a_fit_samples_with_the_backend_the_fit_started(make_module):
    module = make_module(backend=BackendConfig(rollout_backend=PATH), validation=ValidationConfig(num_generations=2))
    trainer = make_trainer(max_steps=2, num_sanity_val_steps=1, val_check_interval=1, limit_val_batches=1)
    trainer.fit(module, prompt_loader(PROMPTS, repeat=2), prompt_loader(PROMPTS))
    names = [event[0] for event in module.rollout_backend.events]
    assert names.count("session") == 5  # a sanity check, 2 iterations, a validation after each
    assert names.count("start") == names.count("close") == 1 and names[0] == "start" and names[-1] == "close"


def test_a_backend_sampling_like_hugging_face_gives_the_same_rollout(make_module):
    batch = {"prompt": PROMPTS}
    rollouts = []
    for backend in ("hf", PATH):
        module = make_module(backend=BackendConfig(rollout_backend=backend))
        torch.manual_seed(0)
        rollouts.append(module.generate(batch))
    assert isinstance(make_module().rollout_backend, HFBackend)
    assert torch.equal(rollouts[0].completion_ids, rollouts[1].completion_ids)
    assert torch.equal(rollouts[0].logprobs, rollouts[1].logprobs)


def test_a_session_knows_each_trajectory_across_agent_turns(tokenizer):
    backend = RecordingBackend(RecordingSettings(), None)
    session = backend.session(None, None)
    assert isinstance(session, RolloutSession)
    agent = AgentSettings(environment_factory=CountdownEnv, max_turns=4)
    prompts = [[{"role": "user", "content": "go"}], [{"role": "user", "content": "play 2"}]]
    torch.manual_seed(0)
    rollout = sample_rollout(
        short_turn_model(tokenizer), tokenizer, prompts, SamplingSettings(num_generations=2, max_new_tokens=200),
        agent, max_prompt_length=64, columns={"turns": [1, 3]}, sample=session,
    )  # fmt: skip
    session.close()
    assert rollout.turns.num_turns.tolist() == [1, 1, 3, 3]
    assert [event[1] for event in backend.events if event[0] == "sample"] == [[0, 1, 2, 3], [2, 3], [2, 3]]
    assert backend.turns == [{0: 1, 1: 1, 2: 3, 3: 3}]  # the session's own count matches the rollout's


def test_a_plain_sample_function_still_samples(tokenizer):
    calls = []

    def sample(model, tok, request):
        calls.append(len(request.prompt_ids))
        return sample_tokens(model, tok, request)

    agent = AgentSettings.build(tokenizer, max_turns=1)
    model = short_turn_model(tokenizer)
    settings = SamplingSettings(num_generations=2, max_new_tokens=4)
    rollout = sample_rollout(model, tokenizer, PROMPTS, settings, agent, max_prompt_length=8, sample=sample)
    assert calls == [2] and len(rollout) == 4


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        (
            "tests.backends.test_user_backend.Missing",
            r"^GRPOConfig\.backend\.rollout_backend='tests\.backends\..*Missing': "
            r"cannot import it \(.*has no attribute 'Missing'\); choose 'hf', 'vllm', 'vllm_server' or the import path",
        ),
        ("no_such_package.Backend", r"cannot import it \(No module named 'no_such_package'\)"),
        ("tests.backends.test_user_backend.not_a_class", r"a backend is a class, got a function"),
        (
            "tests.backends.test_user_backend.HalfBackend",
            r"HalfBackend is not a RolloutBackend: it lacks session, release \(docs/backends\.md",
        ),
    ],
)
def test_an_import_path_that_is_not_a_backend_is_refused_naming_why(make_module, backend, message):
    with pytest.raises(ValueError, match=message):
        make_module(backend=BackendConfig(rollout_backend=backend))


def test_a_backend_name_that_is_no_import_path_is_refused_by_the_config():
    with pytest.raises(
        ValueError, match=r"GRPOConfig\.backend\.rollout_backend='sglang' is not valid; choose one of 'hf', "
    ):
        GRPOConfig(backend=BackendConfig(rollout_backend="sglang"))


@pytest.mark.parametrize(
    ("backend", "args", "message"),
    [
        (
            PATH,
            {"colour": "red"},
            r"^GRPOConfig\.backend\.rollout_backend_args\.colour='red': not a setting of the rollout "
            r"backend '.*RecordingBackend' \(RecordingSettings\); allowed keys: tag, scale$",
        ),
        ("vllm", {"gpu_memory": 0.5}, r"rollout_backend_args\.gpu_memory=0\.5: .*allowed keys: gpu_memory_utilization"),
        (
            "hf",
            {"tag": "x"},
            r"^GRPOConfig\.backend\.rollout_backend_args=\{'tag': 'x'\}: the rollout backend 'hf' takes no ",
        ),
    ],
)
def test_unknown_backend_settings_are_refused_naming_the_key_and_the_allowed_ones(make_module, backend, args, message):
    with pytest.raises(ValueError, match=message):
        make_module(backend=BackendConfig(rollout_backend=backend, rollout_backend_args=args))


def test_a_setting_the_backend_does_not_honour_is_refused_at_set_up(make_module):
    honoured = make_module(backend=BackendConfig(rollout_backend=PATH), sampling=tiny_sampling(top_p=0.9))
    assert honoured.rollout_backend.spec.grpo.sampling.top_p == 0.9  # one it honours
    with pytest.raises(
        ValueError,
        match=r"^GRPOConfig\.sampling\.top_k=5: the rollout backend '.*RecordingBackend' does not "
        r"honour top_k \(it supports top_p\); set top_k to 0 or choose a backend",
    ):
        make_module(backend=BackendConfig(rollout_backend=PATH), sampling=tiny_sampling(top_k=5))


def test_a_quantized_policy_needs_a_backend_that_says_it_samples_one():
    from lightning_grpo.backends.build import check_supported
    from lightning_grpo.backends.protocol import BackendSpec
    from lightning_grpo.policy import PolicyConfig

    spec = BackendSpec(GRPOConfig(), PolicyConfig(quantization="nf4"))
    with pytest.raises(ValueError, match=r"^PolicyConfig\.quantization='nf4': the rollout backend 'mine' does not "):
        check_supported(RecordingBackend, spec, "mine")
    check_supported(HFBackend, spec, "hf")  # the policy samples itself: anything goes


def test_vllm_settings_given_with_another_backend_are_refused(tokenizer):
    from lightning_grpo import VLLMConfig
    from lightning_grpo.testing import build_tiny_model

    with pytest.raises(
        ValueError, match=r"vllm settings were given but grpo.backend.rollout_backend is '.*RecordingBackend'"
    ):
        GRPOModule(
            build_tiny_model(tokenizer),
            [count_a],
            tokenizer=tokenizer,
            grpo=GRPOConfig(backend=BackendConfig(rollout_backend=PATH)),
            vllm=VLLMConfig(),
        )


class LogprobRecordingBackend(RecordingBackend):
    """The same sessions (they fill ``Rollout.logprobs``), saying so."""

    records_logprobs: ClassVar[bool] = True


@pytest.mark.parametrize(
    ("setting", "value"), [("rollout_correction", "token_truncate"), ("rollout_rejection", "geometric")]
)
def test_a_correction_needs_a_backend_that_records_the_sampler_logprobs(make_module, setting, value):
    """Refused when the module is built, naming the setting, the backend and what provides the log-probs."""
    with pytest.raises(
        ValueError,
        match=rf"^GRPOConfig\.corrections\.{setting}={value!r} compares the trainer's log-probs with the "
        r"sampler's \(Rollout\.logprobs\), but the rollout backend '.*RecordingBackend' does not record "
        r"them .*choose a rollout_backend that does \('hf' or 'vllm'\)",
    ):
        make_module(backend=BackendConfig(rollout_backend=PATH), corrections=CorrectionConfig(**{setting: value}))
    declared = make_module(
        backend=BackendConfig(rollout_backend=f"{__name__}.LogprobRecordingBackend"),
        corrections=CorrectionConfig(**{setting: value}),
    )
    assert getattr(declared.config.corrections, setting) == value
    assert make_module(
        corrections=CorrectionConfig(**{setting: value})
    ).rollout_backend.records_logprobs  # the built-in hf backend records them
    opsm = {"off_policy_mask": "opsm", "off_policy_mask_args": {"threshold": 0.5}}
    assert make_module(
        backend=BackendConfig(rollout_backend=PATH), corrections=CorrectionConfig(**opsm)
    )  # OPSM falls back to the old log-probs
