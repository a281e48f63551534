"""One step ahead (``GRPOConfig.backend.async_rollout``): the next iteration's rollout is sampled in a background
thread while this iteration scores, computes its log-probs and updates the policy (docs/vllm.md, "One step ahead
(async_rollout)").

Only a backend whose ``samples_apart`` is true serves it (its sampling runs outside the trainer process, from the
adapter its last ``sync`` sent: ``vllm_server``); :mod:`lightning_grpo.backends.build` refuses the others. The
module's backend is then an :class:`AheadBackend` (:func:`ahead_of`), which owns the background thread and the
rollout sampled ahead. ``training_step`` takes the rollout sampled ahead for its batch (:func:`take_ahead`), samples
the batch itself when there is none, then launches the next one (:func:`launch_ahead`), handing both plain values:
the batch, the global step, the ranks' votes, the next batch and its sampling settings.

* **Iteration k+1's prompts**: during iteration k, the batch Lightning will hand to iteration k+1 is drawn one batch
  early from the fit loop's data fetcher (:func:`~lightning_grpo.data.lookahead.next_batch`) and held there, so
  Lightning hands exactly it to iteration k+1; iteration k+1 checks that the batch it was given equals the one sampled
  ahead, else it drops that rollout and samples synchronously. Same prompts, same order, same number of iterations.
* **Weights**: the next rollout starts right after this iteration's ``sync`` (the weights before its update), so it
  samples with the adapter of the iteration before the one it trains (staleness 1; the first iteration of a fit and of
  each epoch, and one after a dropped rollout, sample synchronously: staleness 0). Logged as ``rollout/staleness``.
  The behaviour log-probs the backend recorded (``Rollout.logprobs``) are what the rollout correction compares with.
* **Threads**: the background thread only samples (:func:`sample_apart`: through one session of the backend, opened
  on the main thread within the iteration's seeding, given an empty stand-in for the policy and its own copy of the
  tokenizer); it holds no collective, never logs, never touches the policy. Every ``sync`` on the main thread (the
  next iteration's, validation's) first waits for it; an exception there is raised on the main thread at the next
  iteration, as its cause. Under DDP the ranks then agree on the main thread (:func:`agreed_ahead`): a failure on one
  rank stops all of them, naming it, and a rank without a rollout ahead makes every rank sample synchronously.
  ``close`` (the end of fit, or an exception anywhere, the update's included: ``CloseRolloutBackend``) cancels it at
  its next sampling call, closes the backend (a request in flight fails) and joins it.
* **Checkpoints** hold no rollout: a resumed run samples its first iteration synchronously (staleness 0), then runs
  ahead.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from functools import partial
from typing import Any, cast

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_grpo.backends.protocol import RolloutBackend
from lightning_grpo.config import GRPOConfig
from lightning_grpo.rollout import Rollout
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.agent_client import AgentLimits
from lightning_grpo.rollout.agent_wiring import sample_batch
from lightning_grpo.rollout.rank_agreement import RankVotes, agreed_rollout
from lightning_grpo.rollout.sampling_settings import SamplingSettings

__all__ = [
    "AheadBackend",
    "RolloutCancelled",
    "agreed_ahead",
    "ahead_of",
    "launch_ahead",
    "sample_apart",
    "take_ahead",
]

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
        backend: The backend built from ``GRPOConfig.backend.rollout_backend`` (its ``samples_apart`` is true).
        config: The run's settings: ``sampling.max_prompt_length``, and the update's sizes (whether an iteration's
            optimizer steps end the fit).
        tokenizer: The module's tokenizer (the background thread samples with its own copy).
        agent: The module's turn settings (one turn: ``async_rollout`` refuses tools and environments).
        limits: The module's agent-code limits (no agent code runs ahead; ``sample_batch`` takes them).
    """

    def __init__(
        self,
        backend: Any,
        config: GRPOConfig,
        tokenizer: PreTrainedTokenizerBase,
        agent: AgentSettings,
        limits: AgentLimits,
    ) -> None:
        self.backend, self.config = backend, config
        self.tokenizer, self.agent, self.limits = tokenizer, agent, limits
        self._thread: threading.Thread | None = None
        self._cancelled = threading.Event()
        self._background = threading.local()  # .active: this thread samples ahead
        self._ahead: tuple[Batch, Rollout | None, BaseException | None] | None = None
        self._step = -1  # the global step whose sync the rollout ahead sampled with
        self._device = torch.device("cpu")  # the policy's, at start
        self._stand_in: nn.Module | None = None
        self._tokenizer_copy: Any = None

    def __getattr__(self, name: str) -> Any:  # settings_class, records_logprobs, a backend's own attributes
        if "backend" not in self.__dict__:  # being built or copied
            raise AttributeError(name)
        return getattr(self.__dict__["backend"], name)

    def start(self, policy: Any, seed: int, *, sharded: bool) -> None:
        """The wrapped backend's ``start``; the stand-ins for the policy are made on its device from now on.

        Raises:
            ValueError: Under FSDP2 (``sharded``): its sampling keeps every rank in step with collectives
                (``synced_gpus``), which the background thread must not hold.
        """
        if sharded:
            raise ValueError(
                "GRPOConfig.backend.async_rollout=True is not supported under FSDP2 (ModelParallelStrategy): its "
                "sampling holds collectives that a background thread must not; use DDP, or set async_rollout to false"
            )
        self._device = next(policy.parameters()).device
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

    def sample_ahead(self, batch: Batch, settings: SamplingSettings, version: int) -> None:
        """Launch the rollout of ``batch`` (the next iteration's) with the adapter synced at ``version``, through a
        session opened here on the main thread (so that what it draws from torch's generators, e.g. its request
        seeds, comes from this iteration's seeded stream), stopping at a cancel."""
        if self._stand_in is None or next(self._stand_in.parameters()).device != self._device:
            self._stand_in = nn.Module()  # an empty module on the policy's device: the model sampling is given
            self._stand_in.register_parameter("device_marker", nn.Parameter(torch.zeros(0, device=self._device)))
        session = _CancellableSession(self.backend.session(self._stand_in, settings), self._cancelled)
        if self._tokenizer_copy is None:  # a fast tokenizer is not shared across threads
            self._tokenizer_copy = copy.deepcopy(self.tokenizer)
        sample = partial(
            sample_apart,
            session,
            self._stand_in,
            self._tokenizer_copy,
            settings,
            self.agent,
            max_prompt_length=self.config.sampling.max_prompt_length,
            limits=self.limits,
        )
        self.launch(batch, sample, version)

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
                f"step {step}: the rollout sampled ahead (GRPOConfig.backend.async_rollout, during the iteration "
                f"before, with the adapter of step {self._step}) failed: {type(error).__name__}: {error}"
            ) from error
        return rollout if _same_batch(sampled_for, batch) else None


def _same_batch(first: Batch, second: Batch) -> bool:
    try:
        return first.keys() == second.keys() and all(list(first[k]) == list(second[k]) for k in first)
    except (TypeError, RuntimeError, ValueError):  # tensors that do not compare to one bool: not known to match
        return False


def ahead_of(
    backend: RolloutBackend,
    config: GRPOConfig,
    tokenizer: PreTrainedTokenizerBase,
    agent: AgentSettings,
    limits: AgentLimits,
) -> RolloutBackend:
    """``backend`` as an :class:`AheadBackend` when ``config.backend.async_rollout`` is on
    (:func:`~lightning_grpo.backends.build.check_async_rollout` checked the run), else ``backend`` itself."""
    if not config.backend.async_rollout:
        return backend
    return cast("RolloutBackend", AheadBackend(backend, config, tokenizer, agent, limits))


def take_ahead(
    backend: RolloutBackend, batch: Batch, *, step: int, ranks: RankVotes | None, log: Callable[..., Any]
) -> Rollout | None:
    """The rollout ``backend`` sampled ahead for ``batch`` during the iteration before, if every rank has one
    (``rollout/staleness`` 1, logged with ``log``); ``None``: ``batch`` is to be sampled now (0). Always ``None``
    unless ``backend`` is an :class:`AheadBackend`.

    Args:
        backend: The module's backend, after this iteration's ``sync``.
        batch: This iteration's prompts.
        step: The global step (the version this iteration's ``sync`` sent; error messages name it).
        ranks: The ranks' votes on several processes; ``None`` on one.
        log: Logs ``rollout/staleness`` (``LightningModule.log``).

    Raises:
        RankFailureError: The rollout ahead failed on some rank (several processes; the cause of each named).
        RuntimeError: It failed, on one process (:meth:`AheadBackend.take`).
    """
    if not isinstance(backend, AheadBackend):
        return None
    rollout = agreed_ahead(lambda: backend.take(batch, step), ranks)
    log("rollout/staleness", float(rollout is not None), on_step=True, batch_size=len(batch.get("prompt", ())) or 1)
    return rollout


def launch_ahead(
    backend: RolloutBackend,
    upcoming: Callable[[int], Batch | None],
    rows: int,
    settings: Callable[[], SamplingSettings],
    step: int,
) -> None:
    """Launch the next iteration's rollout in ``backend``'s background thread (:meth:`AheadBackend.sample_ahead`),
    unless this iteration is the fit's last or ``backend`` is not an :class:`AheadBackend`.

    Args:
        backend: The module's backend, after this iteration's ``sync``.
        upcoming: ``upcoming(updates)``: the batch Lightning hands to the next iteration when this one takes
            ``updates`` optimizer steps, or ``None`` (:func:`~lightning_grpo.data.lookahead.next_batch`).
        rows: The rows of this iteration's rollout (``ppo_epochs`` passes of ``mini_batch_size`` rows: its updates).
        settings: The module's ``sampling_settings``: what the next rollout is sampled with.
        step: The global step: the adapter version the next rollout samples with.
    """
    if not isinstance(backend, AheadBackend):
        return
    following = upcoming(backend.config.update.updates(rows))
    if following is not None:
        backend.sample_ahead(following, settings(), step)


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
            stand_in,
            tokenizer,
            batch,
            settings,
            agent,
            None,
            session=session,
            max_prompt_length=max_prompt_length,
            limits=limits,
        )
    return rollout
