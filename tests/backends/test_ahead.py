"""One step ahead (``GRPOConfig.backend.async_rollout``) with a backend that samples apart (a frozen copy taken at
each sync, as a server holds the adapter it loaded): the next rollout overlaps the update, samples the previous step's
adapter, is logged as stale, trains on the same prompts for as many steps as a synchronous run, and leaves no thread
behind when the background rollout or the update fails."""

from __future__ import annotations

import threading
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_grpo import GRPOModule
from lightning_grpo.backends.ahead import AheadBackend
from lightning_grpo.config import AdvantageConfig, BackendConfig, CorrectionConfig
from lightning_grpo.settings_checks import SettingError
from lightning_grpo.testing.apart_backend import FrozenCopyBackend, adapter_checksum
from tests.conftest import make_trainer

PATH = "lightning_grpo.testing.apart_backend.FrozenCopyBackend"
BATCHES = [["1+2=", "3+4="], ["5+1=", "2+2="], ["6+3=", "0+7="]]
THREAD = "lightning_grpo-rollout-ahead"


def loader() -> DataLoader:
    """Three batches of distinct prompts, in order."""
    rows = [{"prompt": p} for batch in BATCHES for p in batch]
    return DataLoader(rows, batch_size=2, collate_fn=lambda b: {"prompt": [r["prompt"] for r in b]})


def ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD and t.is_alive()]


class Watch(L.Callback):
    """Records per step: the prompts trained on, ``rollout/staleness``, the policy's adapter and global step at the
    step's start; during each update (but the last step's) waits until the next batch's rollout has begun sampling."""

    def __init__(self, wait: bool = True) -> None:
        self.prompts: list[tuple[str, ...]] = []
        self.staleness: list[float] = []
        self.start: list[tuple[int, float]] = []
        self.overlapped: list[bool] = []
        self.wait = wait

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.start.append((trainer.global_step, adapter_checksum(pl_module.policy)))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        step = len(self.start) - 1
        if not self.wait or step + 1 >= len(BATCHES):
            return
        backend = pl_module.rollout_backend.backend
        following = tuple(BATCHES[step + 1])
        for _ in range(600):  # a deadline for a failing run only (up to 30 s): the order is what is asserted
            if any(e[0] == "sample" and e[2] == following and e[3] == THREAD for e in list(backend.events)):
                break
            threading.Event().wait(0.05)
        self.overlapped.append(any(e[0] == "sample" and e[2] == following for e in list(backend.events)))
        backend.record("update", trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.prompts.append(tuple(dict.fromkeys(outputs["rollout"].prompts)))
        self.staleness.append(float(trainer.callback_metrics.get("rollout/staleness", float("nan"))))


def fit(make_module, watch: Watch, *, async_rollout: bool = True, module_cls: type = GRPOModule, **kwargs: Any):
    module = make_module(
        backend=BackendConfig(rollout_backend=PATH, async_rollout=async_rollout), module_cls=module_cls
    )
    make_trainer(callbacks=[watch], **kwargs).fit(module, loader())
    return module


def test_the_next_rollout_samples_the_previous_adapter_while_the_update_runs(make_module):
    watch = Watch()
    module = fit(make_module, watch, max_epochs=1)
    backend = module.rollout_backend.backend
    assert watch.overlapped == [True, True]  # (1) batch k+1 was being sampled before step k's optimizer step
    events = backend.events
    for k in (1, 2):  # (1) its sampling began before step k-1's update was taken, in the background thread
        begun = next(i for i, e in enumerate(events) if e[0] == "sample" and e[2] == tuple(BATCHES[k]))
        update = next(i for i, e in enumerate(events) if e[0] == "update" and e[1] == watch.start[k - 1][0])
        assert begun < update and events[begun][3] == THREAD
        version = events[begun][1]  # (2) the adapter synced at the start of step k-1, not step k's
        assert version == watch.start[k - 1][0] < watch.start[k][0]
        assert backend.checksums[version] == pytest.approx(watch.start[k - 1][1], abs=0)
        assert watch.start[k][1] != watch.start[k - 1][1]
    assert watch.staleness == [0.0, 1.0, 1.0]  # (3) the first step sampled synchronously
    assert events[-1][0] == "close" and not ahead_threads()


def test_same_prompts_in_the_same_order_and_as_many_steps_as_synchronously(make_module):
    runs = {}
    for async_rollout in (False, True):
        watch = Watch(wait=False)
        module = fit(make_module, watch, async_rollout=async_rollout, max_epochs=2)
        runs[async_rollout] = (watch, module.trainer.global_step)
    (sync_watch, sync_steps), (async_watch, async_steps) = runs[False], runs[True]
    assert async_watch.prompts == sync_watch.prompts == [tuple(b) for b in BATCHES] * 2  # (4)
    assert async_steps == sync_steps == 6
    assert async_watch.staleness == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]  # each epoch's first step synchronous
    assert not ahead_threads()


def test_max_steps_launches_no_rollout_past_the_last_step(make_module):
    watch = Watch(wait=False)
    module = fit(make_module, watch, max_steps=2)
    sampled = [e[2] for e in module.rollout_backend.backend.events if e[0] == "sample"]
    assert sampled == [tuple(BATCHES[0]), tuple(BATCHES[1])] and watch.staleness == [0.0, 1.0]


class FailingAhead(FrozenCopyBackend):
    """Fails the first sampling call made in the background thread."""

    def session(self, policy, settings):
        session = super().session(policy, settings)
        original = session.sample

        def sample(*args, **kwargs):
            if threading.current_thread().name == THREAD:
                raise ConnectionError("server went away")
            return original(*args, **kwargs)

        session.sample = sample
        return session


def test_a_failed_background_rollout_surfaces_at_the_next_step_and_the_backend_closes(make_module):
    module = make_module(backend=BackendConfig(rollout_backend=f"{__name__}.FailingAhead", async_rollout=True))
    with pytest.raises(RuntimeError, match="step 1: the rollout sampled ahead") as raised:
        make_trainer(max_epochs=1).fit(module, loader())
    assert isinstance(raised.value.__cause__, ConnectionError)  # (5) with its cause
    assert "server went away" in str(raised.value)
    assert module.rollout_backend.backend.events[-1][0] == "close" and not ahead_threads()


class BlockingAhead(FrozenCopyBackend):
    """Its background sampling blocks until the backend is closed, then fails (a request in flight on a server)."""

    closed = threading.Event()

    def session(self, policy, settings):
        session = super().session(policy, settings)
        original = session.sample

        def blocked(*args, **kwargs):
            if threading.current_thread().name != THREAD:
                return original(*args, **kwargs)
            self.record("blocked", self.version)
            BlockingAhead.closed.wait(60)
            raise ConnectionError("the server was shut down")  # what a request in flight gets

        session.sample = blocked
        return session

    def close(self) -> None:
        BlockingAhead.closed.set()
        super().close()


class UpdateFails(GRPOModule):
    def compute_loss(self, batch, counts):
        backend = self.rollout_backend.backend
        for _ in range(600):  # the background rollout is in flight (a deadline for a failing run only)
            if any(e[0] == "blocked" for e in list(backend.events)):
                break
            threading.Event().wait(0.05)
        raise FloatingPointError("update failed")


def test_a_failed_update_cancels_and_joins_the_background_rollout(make_module):
    BlockingAhead.closed.clear()
    module = make_module(
        backend=BackendConfig(rollout_backend=f"{__name__}.BlockingAhead", async_rollout=True), module_cls=UpdateFails
    )
    with pytest.raises(FloatingPointError, match="update failed"):
        make_trainer(max_epochs=1).fit(module, loader())
    events = module.rollout_backend.backend.events
    assert any(e[0] == "blocked" for e in events)  # (6) the failure came while it was in flight
    assert events[-1][0] == "close" and not ahead_threads()


def test_refused_with_a_backend_that_samples_in_the_trainer(make_module):
    with pytest.raises(SettingError, match=r"GRPOConfig.backend.async_rollout=True.*'hf'.*vllm_server") as raised:
        make_module(backend=BackendConfig(async_rollout=True))  # (7) rollout_backend: hf
    assert raised.value.setting == "GRPOConfig.backend.async_rollout"


class OwnGenerate(GRPOModule):
    def generate(self, batch, **kwargs):
        return super().generate(batch, **kwargs)


def test_refused_with_a_generate_override_tools_or_dynamic_sampling(make_module):
    with pytest.raises(SettingError, match=r"GRPOConfig\.backend\.async_rollout=True needs GRPOModule\.generate"):
        make_module(backend=BackendConfig(rollout_backend=PATH, async_rollout=True), module_cls=OwnGenerate)
    with pytest.raises(ValueError, match=r"async_rollout=True cannot be combined with advantages\.dynamic_sampling"):
        make_module(
            backend=BackendConfig(rollout_backend=PATH, async_rollout=True),
            advantages=AdvantageConfig(dynamic_sampling=True),
        )
    module = make_module(backend=BackendConfig(rollout_backend=PATH, async_rollout=False))
    assert isinstance(module.rollout_backend, FrozenCopyBackend)  # off by default: the backend itself


def test_refused_with_tools(tokenizer):
    from lightning_grpo import GRPOConfig, PolicyConfig
    from lightning_grpo.config import BackendConfig, SamplingConfig
    from lightning_grpo.testing import build_tiny_model

    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: first.
            b: second.
        """
        return a + b

    multi_turn = r"GRPOConfig\.backend\.async_rollout=True cannot sample ahead multi-turn rollouts"
    with pytest.raises(SettingError, match=multi_turn):
        GRPOModule(
            build_tiny_model(tokenizer),
            [lambda prompts, completions, **_: [0.0] * len(completions)],
            tokenizer=tokenizer,
            tools=[add],
            policy=PolicyConfig(lora_r=4),
            grpo=GRPOConfig(
                backend=BackendConfig(rollout_backend=PATH, async_rollout=True),
                sampling=SamplingConfig(num_generations=2),
            ),
        )


def test_a_batch_other_than_the_one_sampled_ahead_is_sampled_now(make_module):
    module = make_module(backend=BackendConfig(rollout_backend=PATH, async_rollout=True))
    ahead = module.rollout_backend
    assert isinstance(ahead, AheadBackend)
    ahead.start(module.policy, 0, sharded=False)
    ahead.sync(module.policy, 0)
    ahead.launch({"prompt": BATCHES[1]}, lambda batch: ("rollout of", tuple(batch["prompt"])), 0)
    assert ahead.take({"prompt": BATCHES[2]}, 1) is None  # another batch: dropped, sampled synchronously
    ahead.launch({"prompt": BATCHES[1]}, lambda batch: ("rollout of", tuple(batch["prompt"])), 0)
    assert ahead.take({"prompt": list(BATCHES[1])}, 1) == ("rollout of", tuple(BATCHES[1]))
    ahead.close()
    assert not ahead_threads() and torch.is_tensor(next(module.policy.parameters()))


def _stream(**kwargs):
    from lightning_grpo import PromptDataModule
    from tests.conftest import prompt_records

    return PromptDataModule(prompt_records(8), batch_size=2, seed=1, **kwargs)  # 4 steps per epoch


def test_a_resumed_fit_starts_synchronously_on_the_prompts_not_trained_yet(make_module, tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    straight = Watch(wait=False)
    make_trainer(max_steps=6, callbacks=[straight]).fit(
        make_module(backend=BackendConfig(rollout_backend=PATH, async_rollout=True)), _stream()
    )
    first = Watch(wait=False)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=2)  # mid-epoch, one ahead
    module = make_module(backend=BackendConfig(rollout_backend=PATH, async_rollout=True))
    make_trainer(max_steps=2, enable_checkpointing=True, callbacks=[checkpoint, first]).fit(module, _stream())
    resumed = Watch(wait=False)
    module = make_module(backend=BackendConfig(rollout_backend=PATH, async_rollout=True))
    make_trainer(max_steps=6, callbacks=[resumed]).fit(module, _stream(), ckpt_path=tmp_path / "last.ckpt")
    assert first.prompts + resumed.prompts == straight.prompts  # the batch drawn ahead at the save is trained after
    assert first.staleness + resumed.staleness == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]  # resume, then epoch 2: synchronous
    assert straight.staleness == [0.0, 1.0, 1.0, 1.0, 0.0, 1.0] and not ahead_threads()


def test_validation_waits_for_the_rollout_ahead_and_keeps_it(make_module):
    from tests.conftest import prompt_records

    watch = Watch(wait=False)
    module = make_module(backend=BackendConfig(rollout_backend=PATH, async_rollout=True))
    trainer = make_trainer(max_steps=4, val_check_interval=1, callbacks=[watch])
    trainer.fit(module, _stream(val_data=prompt_records(2)))
    events = module.rollout_backend.backend.events
    assert watch.staleness == [0.0, 1.0, 1.0, 1.0]  # the rollouts sampled ahead survived each validation
    for i, event in enumerate(events):  # no validation sampling while a rollout ahead was in flight
        if event[0] == "sample" and event[3] == THREAD:
            done = next(j for j in range(i, len(events)) if events[j][0] == "sampled" and events[j][3] == THREAD)
            assert all(e[3] == THREAD or e[0] not in ("sample", "sync") for e in events[i:done])


class Agreement(L.Callback):
    def __init__(self) -> None:
        self.rows: list[tuple[float, float, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        metrics = trainer.callback_metrics
        self.rows.append(tuple(float(metrics[name]) for name in (
            "rollout/staleness", "train/rollout_logprob_diff_max", "train/rollout_is_weight_mean")))  # fmt: skip


def test_the_correction_compares_with_the_stale_behaviour_logprobs(make_module):
    def alternate(prompts, completions, **_):
        return [float(i % 2) for i in range(len(completions))]  # varies within every group: every step updates

    module = make_module(
        [alternate],
        backend=BackendConfig(rollout_backend=PATH, async_rollout=True),
        corrections=CorrectionConfig(rollout_correction="token_truncate", rollout_correction_args={"max": 100.0}),
    )
    agreement = Agreement()
    make_trainer(max_epochs=1, callbacks=[agreement]).fit(module, loader())
    (fresh, *stale) = agreement.rows
    assert fresh[0] == 0.0 and fresh[1] < 1e-4 and fresh[2] == pytest.approx(1.0, abs=1e-4)  # the same weights
    for staleness, diff, weight in stale:  # sampled by the adapter before the last update: the weights see it
        assert staleness == 1.0 and diff > 1e-3 and abs(weight - 1.0) > 1e-5


class Completions(L.Callback):
    def __init__(self) -> None:
        self.completions: list[list[str]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.completions.append(outputs["rollout"].completions)


def test_an_async_run_repeats_exactly(make_module):
    runs = []
    for _ in range(2):  # the session ahead is opened on the main thread, in the step's seeded stream
        record = Completions()
        make_trainer(max_epochs=1, callbacks=[record]).fit(
            make_module(backend=BackendConfig(rollout_backend=PATH, async_rollout=True)), loader()
        )
        runs.append(record.completions)
    assert runs[0] == runs[1] and len(runs[0]) == 3


def test_refused_under_fsdp2_at_start(make_module):
    module = make_module(backend=BackendConfig(rollout_backend=PATH, async_rollout=True))
    with pytest.raises(ValueError, match=r"GRPOConfig\.backend\.async_rollout=True is not supported under FSDP2"):
        module.rollout_backend.start(module.policy, 0, sharded=True)
