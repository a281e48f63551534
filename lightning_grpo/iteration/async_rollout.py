"""One step ahead (``GRPOConfig.async_rollout``): the next step's rollout is sampled in a background thread while
this step scores, computes its log-probs and updates the policy (docs/vllm.md, "One step ahead (async_rollout)").

Only a backend whose ``samples_apart`` is true serves it (its sampling runs outside the trainer process, from the
adapter its last ``sync`` sent: ``vllm_server``); ``lightning_grpo.backends.build`` refuses the others. The module's
backend is then an :class:`AheadBackend` and ``training_step`` takes its rollout through :func:`step_rollout`:

* **Step k+1's prompts**: during step k, the batch Lightning will hand to step k+1 is drawn one batch early from the
  fit loop's data fetcher's iterator (:func:`next_batch`; Lightning prefetches one itself for a loader without a
  length) and held there, so Lightning hands exactly it to step k+1; step k+1 checks that the batch it was given
  equals the one sampled ahead, else it drops that rollout and samples synchronously. Same prompts, same order,
  same number of steps.
* **Weights**: the next rollout starts right after this step's ``sync`` (the weights before this step's update), so
  it samples with the adapter of the step before the one it trains (staleness 1; the first step of a fit and of each
  epoch, a step after a dropped rollout, samples synchronously: staleness 0). Logged as ``rollout/staleness``. The
  behaviour log-probs the backend recorded (``Rollout.logprobs``) are what the rollout correction compares with.
* **Threads**: the background thread only samples (:func:`sample_apart`: through one session of the backend, opened
  on the main thread within the step's seeding, given an empty stand-in for the policy and its own copy of the
  tokenizer); it holds no collective, never logs, never touches the policy. Every ``sync`` on the main thread (the
  next step's, validation's) first waits for it; an exception there is raised on the main thread at the next step,
  as its cause. Under DDP the ranks then agree on the main thread (:func:`agreed_ahead`): a failure on one rank
  stops all of them, naming it, and a rank without a rollout ahead makes every rank sample synchronously.
  ``close`` (the end of fit, or an exception anywhere, the update's included: ``CloseRolloutBackend``) cancels it at
  its next sampling call, closes the backend (a request in flight fails) and joins it.
* **Checkpoints** hold no rollout: a resumed run samples its first step synchronously (staleness 0), then runs ahead.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch
from lightning.pytorch.loops.fetchers import _PrefetchDataFetcher
from torch import nn

from lightning_grpo.iteration.context import StepContext
from lightning_grpo.rollout import Rollout
from lightning_grpo.rollout.agent_wiring import sample_batch
from lightning_grpo.rollout.rank_agreement import RankVotes, agreed_rollout
from lightning_grpo.rollout.sampling_settings import SamplingSettings

if TYPE_CHECKING:
    from lightning_grpo.backends.protocol import RolloutBackend

__all__ = [
    "AheadBackend", "RolloutCancelled", "agreed_ahead", "ahead_of", "next_batch", "sample_apart", "step_rollout",
]  # fmt: skip

Batch = Mapping[str, Sequence[Any]]


class RolloutCancelled(RuntimeError):
    """The rollout sampled ahead was cancelled (the fit ended or failed) before its next sampling call."""


class _CancellableSession:
    """A backend's session that checks, before each sampling call, whether the rollout was cancelled."""

    def __init__(self, session: Any, cancelled: threading.Event) -> None:
        self.session, self.cancelled = session, cancelled

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        if self.cancelled.is_set():
            raise RolloutCancelled("the rollout sampled ahead was cancelled: the fit ended or failed")
        return self.session.sample(*args, **kwargs)

    def close(self) -> None:
        self.session.close()


class AheadBackend:
    """A ``samples_apart`` backend that also samples one rollout ahead, in a background thread.

    It is the backend: ``start``, ``session``, ``release`` and every other attribute are the wrapped backend's;
    ``sync`` first waits for the rollout running ahead; ``close`` cancels it, closes the backend, then joins it.

    Args:
        backend: The backend built from ``GRPOConfig.rollout_backend`` (its ``samples_apart`` is true).
    """

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._thread: threading.Thread | None = None
        self._cancelled = threading.Event()
        self._background = threading.local()  # .active: this thread samples ahead
        self._ahead: tuple[Batch, Rollout | None, BaseException | None] | None = None
        self._step = -1  # the global step whose sync the rollout ahead sampled with
        self._stand_in: nn.Module | None = None
        self._tokenizer: tuple[Any, Any] | None = None  # (the module's, the background thread's copy)

    def stand_in(self, policy: nn.Module) -> nn.Module:
        """An empty module on the policy's device: what the background thread's sampling is given as the model."""
        device = next(policy.parameters()).device
        if self._stand_in is None or next(self._stand_in.parameters()).device != device:
            self._stand_in = nn.Module()
            self._stand_in.register_parameter("device_marker", nn.Parameter(torch.zeros(0, device=device)))
        return self._stand_in

    def own_tokenizer(self, tokenizer: Any) -> Any:
        """A copy of ``tokenizer`` for the background thread (a fast tokenizer is not shared across threads)."""
        if self._tokenizer is None or self._tokenizer[0] is not tokenizer:
            self._tokenizer = (tokenizer, copy.deepcopy(tokenizer))
        return self._tokenizer[1]

    def __getattr__(self, name: str) -> Any:  # settings_class, records_logprobs, a backend's own attributes
        if "backend" not in self.__dict__:  # being built or copied
            raise AttributeError(name)
        return getattr(self.__dict__["backend"], name)

    def start(self, policy: Any, seed: int, *, sharded: bool) -> None:
        """The wrapped backend's ``start``.

        Raises:
            ValueError: Under FSDP2 (``sharded``): its sampling keeps every rank in step with collectives
                (``synced_gpus``), which the background thread must not hold.
        """
        if sharded:
            raise ValueError(
                "GRPOConfig.async_rollout=True is not supported under FSDP2 (ModelParallelStrategy): its sampling "
                "holds collectives that a background thread must not; use DDP, or set async_rollout to false"
            )
        self.backend.start(policy, seed, sharded=sharded)

    def sync(self, policy: Any, version: int) -> None:
        """Wait for the rollout running ahead (it samples the adapter synced before), then the backend's ``sync``;
        nothing inside the background thread (its weights were synced before it started)."""
        if getattr(self._background, "active", False):
            return
        self.wait()
        self.backend.sync(policy, version)

    def session(self, policy: Any, settings: Any) -> Any:
        """The backend's session."""
        return self.backend.session(policy, settings)

    def session_ahead(self, stand_in: nn.Module, settings: Any) -> Any:
        """The backend's session for the next rollout, opened here on the main thread (so that what it draws from
        torch's generators, e.g. its request seeds, comes from this step's seeded stream), stopping at a cancel."""
        return _CancellableSession(self.backend.session(stand_in, settings), self._cancelled)

    def release(self) -> None:
        """The backend's ``release`` (a ``samples_apart`` backend's leaves a running session alone)."""
        self.backend.release()

    def close(self) -> None:
        """Cancel the rollout running ahead, close the backend (a request in flight then fails instead of running
        on), join the rollout and drop it (safe to call twice)."""
        self._cancelled.set()
        try:
            self.backend.close()
        finally:
            self.cancel()

    def launch(self, batch: Batch, generate: Callable[[Batch], Rollout], version: int) -> None:
        """Sample ``generate(batch)`` in a background thread, with the adapter synced at ``version``."""
        self.cancel()
        self._step = version

        def run() -> None:
            self._background.active = True
            try:
                self._ahead = (batch, generate(batch), None)
            except BaseException as error:  # raised on the main thread by take()
                self._ahead = (batch, None, error)

        self._thread = threading.Thread(target=run, name="lightning_grpo-rollout-ahead", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Join the rollout running ahead, keeping its result (or its exception) for :meth:`take`."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def cancel(self) -> None:
        """Stop the rollout running ahead at its next sampling call, join it and drop it."""
        if self._thread is not None:
            self._cancelled.set()
            self.wait()
        self._cancelled.clear()
        self._ahead = None

    def take(self, batch: Batch, step: int) -> Rollout | None:
        """The rollout sampled ahead for ``batch`` (joined first); ``None`` if none was, or it was for another batch.

        Raises:
            RuntimeError: The rollout sampled ahead failed; its exception is the cause.
        """
        self.wait()
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        sampled_for, rollout, error = ahead
        if error is not None:
            raise RuntimeError(
                f"step {step}: the rollout sampled ahead (GRPOConfig.async_rollout, during the step before, with the "
                f"adapter of step {self._step}) failed: {type(error).__name__}: {error}"
            ) from error
        return rollout if _same_batch(sampled_for, batch) else None


def _same_batch(first: Batch, second: Batch) -> bool:
    try:
        return first.keys() == second.keys() and all(list(first[k]) == list(second[k]) for k in first)
    except (TypeError, RuntimeError, ValueError):  # tensors that do not compare to one bool: not known to match
        return False


class _Lookahead(Iterator[Any]):
    """The fit loop's batch iterator, with one item drawn early and held until Lightning asks for it."""

    def __init__(self, iterator: Iterator[Any]) -> None:
        self.iterator, self.held = iterator, deque[Any]()

    def __next__(self) -> Any:
        return self.held.popleft() if self.held else next(self.iterator)

    def peek(self) -> Any:
        """The next item, drawn now (``StopIteration`` at the end)."""
        if not self.held:
            self.held.append(next(self.iterator))
        return self.held[0]


def next_batch(trainer: Any, updates: int) -> Batch | None:
    """The batch Lightning will hand to the next ``training_step``, drawn now from the fit loop's data fetcher and
    held there; ``None`` when there is none to know of: the epoch's last batch, a fit that stops after this step
    (``max_steps`` reached by this step's ``updates`` optimizer steps, ``should_stop``), a fetcher of another kind.

    This reads Lightning's fetcher (``_PrefetchDataFetcher``, Lightning 2.x): a batch it prefetched itself (a loader
    without a length), else one drawn early from its iterator, which it then hands out and counts as usual (so the
    epoch's last batch is still known as such). Lightning passes the batch through its transfer hooks after; the next
    step compares what it was given with what was sampled (:meth:`AheadBackend.take`).
    """
    fetcher = getattr(getattr(trainer, "fit_loop", None), "_data_fetcher", None)
    if not isinstance(fetcher, _PrefetchDataFetcher) or trainer.should_stop or fetcher.iterator is None:
        return None
    if 0 <= trainer.max_steps <= trainer.global_step + updates:
        return None
    if fetcher.batches:
        item = fetcher.batches[0]
    elif fetcher.done:
        return None
    else:
        if not isinstance(fetcher.iterator, _Lookahead):  # a new one each epoch (Lightning's iter(fetcher))
            fetcher.iterator = _Lookahead(fetcher.iterator)
        try:
            item = fetcher.iterator.peek()
        except StopIteration:
            return None
    return item[0] if isinstance(item, tuple) else item  # (batch, batch_idx, dataloader_idx)


def ahead_of(backend: RolloutBackend, async_rollout: bool) -> RolloutBackend:
    """``backend`` as an :class:`AheadBackend` when ``GRPOConfig.async_rollout`` is on (``lightning_grpo.backends.
    build.check_async_rollout`` checked the run), else ``backend`` itself."""
    return cast("RolloutBackend", AheadBackend(backend)) if async_rollout else backend


def step_rollout(module: Any, batch: Batch, context: StepContext) -> Rollout:
    """This step's rollout: sampled ahead during the step before if the module's backend is an
    :class:`AheadBackend` that did (``rollout/staleness`` 1), else ``module.generate(batch)`` now (0); then the next
    step's rollout is launched (:func:`next_batch`), unless this step is the fit's last.

    Args:
        module: The ``GRPOModule`` (after this step's ``sync``): its backend, ``generate``, tokenizer, turn settings,
            sampling settings and config.
        batch: This step's prompts.
        context: This step's context (its ``log`` and ``global_step``).
    """
    backend, trainer = module.rollout_backend, getattr(module, "_trainer", None)
    if not isinstance(backend, AheadBackend) or trainer is None:
        return module.generate(batch)
    ranks = RankVotes.of(context.sum_across_ranks, context.device, trainer.global_rank, trainer.world_size)
    rollout = agreed_ahead(lambda: backend.take(batch, context.global_step), ranks)
    staleness = 0.0 if rollout is None else 1.0
    rollout = module.generate(batch) if rollout is None else rollout
    context.log("rollout/staleness", staleness, on_step=True, batch_size=len(batch.get("prompt", ())) or 1)
    config = module.config
    updates = config.ppo_epochs * -(-len(rollout) // (config.mini_batch_size or len(rollout)))
    following = next_batch(trainer, updates)
    if following is not None:
        stand_in, settings = backend.stand_in(module.policy), module.sampling_settings()
        sample = partial(
            sample_apart, backend.session_ahead(stand_in, settings), stand_in, backend.own_tokenizer(module.tokenizer),
            settings, module.agent, max_prompt_length=config.max_prompt_length, limits=module.agent_limits,
        )  # fmt: skip
        backend.launch(following, sample, context.global_step)
    return rollout


def agreed_ahead(take: Callable[[], Rollout | None], ranks: RankVotes | None) -> Rollout | None:
    """``take()`` (the rollout sampled ahead, or ``None``), agreed by the ranks on the main thread after the join:
    a failure on any rank stops every rank (:func:`~lightning_grpo.rollout.rank_agreement.agreed_rollout`'s vote),
    and unless every rank has one, none uses its own (they all sample now, their collectives in step).

    Raises:
        RankFailureError: The rollout ahead failed on some rank (several processes; the cause of each named).
        RuntimeError: It failed, on one process (:meth:`AheadBackend.take`).
    """
    rollout = agreed_rollout(take, ranks)
    if ranks is None:
        return rollout
    have = ranks.sum_across_ranks(torch.tensor([float(rollout is not None)], dtype=torch.float64, device=ranks.device))
    return rollout if int(have.item()) == ranks.world_size else None


def sample_apart(
    session: Any,
    stand_in: nn.Module,
    tokenizer: Any,
    settings: SamplingSettings,
    agent: Any,
    batch: Batch,
    *,
    max_prompt_length: int,
    limits: Any,
) -> Rollout:
    """The rollout of ``batch`` through ``session`` (a backend's, opened for it; closed here), as
    ``GRPOModule.generate`` samples it (single turn), but given ``stand_in`` for the policy: the background thread
    never touches the policy (not even its train/eval mode), and a ``samples_apart`` backend samples with the weights
    it was synced with."""
    with closing(session):
        rollout, _ = sample_batch(
            stand_in, tokenizer, batch, settings, agent, None, session=session,
            max_prompt_length=max_prompt_length, limits=limits,
        )  # fmt: skip
    return rollout
