"""Environments: stateful multi-turn tasks (games, code execution with feedback, simulated users).

One environment instance per sample, made by a factory from the dataset row. ``reset()`` gives the first observation
(appended to the prompt); after each assistant turn, ``step(message)`` gives the next observation, an optional
reward for the turn, and whether the episode is done.

An observation may be ``None`` (nothing to add), a string (one ``user`` message with that content), one message dict,
or a list of messages; :func:`normalize_observation` turns each into a list of messages.

Failures are split on purpose: a *tool* failing is a model mistake and becomes a message the model sees (see
:mod:`lightning_grpo.agents.execution`); an *environment* failing is a bug in user code and raises
:class:`EnvironmentFailedError`, naming the environment class and the dataset row.

Example::

    class GuessNumber:
        def __init__(self, row):
            self.target, self.tries = row["target"], 0

        def reset(self):
            return "Guess a number from 1 to 9."

        def step(self, message):
            self.tries += 1
            guess = message["content"].strip()
            if guess == str(self.target):
                return EnvStep(observation=None, reward=1.0, done=True)
            hint = "higher" if guess < str(self.target) else "lower"
            return EnvStep(observation=hint, reward=0.0, done=self.tries >= 3)

    episode = EnvironmentEpisode(GuessNumber, row, index=0)
    prompt = row["prompt"] + episode.reset()
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from lightning_grpo.agents.message_checks import validate_messages
from lightning_grpo.settings_checks import check_number

__all__ = [
    "EnvStep",
    "Environment",
    "EnvironmentEpisode",
    "EnvironmentFactory",
    "EnvironmentFailedError",
    "Observation",
    "aggregate_turn_rewards",
    "normalize_observation",
    "step_episodes",
    "turn_reward_problem",
]

#: What ``reset`` and ``step`` may return as an observation.
Observation = list[dict[str, Any]] | dict[str, Any] | str | None


@dataclass(frozen=True)
class EnvStep:
    """What an environment returns after an assistant turn.

    Attributes:
        observation: Messages to append before the next assistant turn (``None``, a string, a message, or a list).
        reward: The turn's reward, or ``None`` for none.
        done: Whether the episode is over (no further assistant turn).
    """

    observation: Observation = None
    reward: float | None = None
    done: bool = False


@runtime_checkable
class Environment(Protocol):
    """A stateful multi-turn task, one instance per sample (see the module docs)."""

    def reset(self) -> Observation:
        """The first observation, appended to the prompt (``None`` for none)."""
        ...

    def step(self, message: dict[str, Any]) -> EnvStep:
        """React to one assistant message (``{"role": "assistant", "content": ..., ["tool_calls": ...]}``)."""
        ...


#: Makes the environment of one sample from its dataset row.
EnvironmentFactory = Callable[[dict[str, Any]], Environment]


class EnvironmentFailedError(RuntimeError):
    """An environment (user code) raised or returned something invalid; names the environment and the row."""


def normalize_observation(observation: Observation, *, name: str = "observation") -> list[dict[str, Any]]:
    """An observation as a list of messages: ``None`` -> ``[]``, a string -> one ``user`` message, a dict -> ``[dict]``.

    Raises:
        ValueError: The observation is of another type, or its messages are invalid (see
            :func:`~lightning_grpo.agents.message_checks.validate_messages`).
    """
    if observation is None:
        return []
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    if isinstance(observation, dict):
        observation = [observation]
    if not isinstance(observation, list):
        raise ValueError(
            f"{name} must be None, a string, a message dict or a list of messages, got {type(observation).__name__}."
        )
    return validate_messages(observation, name=name)


def turn_reward_problem(reward: Any) -> str:
    """Why ``reward`` cannot be a turn's reward (``""``: it can, being ``None`` or a finite real number).

    The one check of an environment's turn rewards: :meth:`EnvironmentEpisode.step` and the per-turn credit of
    process supervision (:mod:`lightning_grpo.rollout.process_supervision`) both refuse what it names.

    Example::

        >>> turn_reward_problem(0.5), turn_reward_problem(None)
        ('', '')
        >>> turn_reward_problem(float("nan"))
        'reward nan is not finite'
    """
    if reward is None:
        return ""
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        return f"reward {reward!r} is not a number"
    if not math.isfinite(reward):
        return f"reward {reward!r} is not finite"
    return ""


def aggregate_turn_rewards(rewards: Sequence[float | None], mode: Literal["sum", "last"] = "sum") -> float | None:
    """One reward from per-turn rewards: their sum, or the last one given. ``None`` entries are skipped.

    Args:
        rewards: The rewards of the turns, ``None`` where a turn gave none.
        mode: ``"sum"`` or ``"last"``.

    Returns:
        The aggregate, or ``None`` when every entry is ``None`` (or there are none).

    Raises:
        ValueError: ``mode`` is not ``"sum"`` or ``"last"``.
    """
    if mode not in ("sum", "last"):
        raise ValueError(f"mode must be 'sum' or 'last', got {mode!r}.")
    given = [float(reward) for reward in rewards if reward is not None]
    if not given:
        return None
    return sum(given) if mode == "sum" else given[-1]


class EnvironmentEpisode:
    """One environment instance for one sample, with its rewards, and errors that name the environment and row.

    Args:
        factory: Makes the environment from the row (a class taking the row is a factory).
        row: The sample's dataset row.
        index: The row's index, for error messages.
        row_label: What ``index`` counts: ``"dataset row"`` (``PromptDataModule``'s ``dataset_index`` column) or
            ``"batch row"`` (data without it).

    Raises:
        EnvironmentFailedError: The factory raised.

    Attributes:
        environment: The environment instance.
        rewards: The per-turn rewards so far (``None`` where a turn gave none).
        done: Whether the environment said the episode is over.
    """

    def __init__(
        self, factory: EnvironmentFactory, row: dict[str, Any], index: int, row_label: str = "dataset row"
    ) -> None:
        self.row = row
        self.index, self.row_label = index, row_label
        self.rewards: list[float | None] = []
        self.done = False
        self._label = getattr(factory, "__name__", None) or type(factory).__name__
        self.environment = self._call(factory, "creation", row)
        self._label = type(self.environment).__name__
        for method in ("reset", "step"):
            if not callable(getattr(self.environment, method, None)):
                raise self._error("creation", f"has no {method}() method; an environment needs reset() and step()")

    def reset(self) -> list[dict[str, Any]]:
        """The first observation as messages (see :func:`normalize_observation`)."""
        observation = self._call(self.environment.reset, "reset()")
        return self._normalize(observation, "reset()")

    def step(self, message: dict[str, Any]) -> EnvStep:
        """Step with one assistant message; returns the step with its observation as a list of messages."""
        result = self._call(self.environment.step, "step()", message)
        if not isinstance(result, EnvStep):
            raise self._error("step()", f"returned {type(result).__name__}; it must return an EnvStep")
        reward, problem = result.reward, turn_reward_problem(result.reward)
        if problem:
            raise self._error("step()", f"returned a {problem}; it must be a finite number or None")
        observation = self._normalize(result.observation, "step()")
        self.rewards.append(None if reward is None else float(reward))
        self.done = bool(result.done)
        return EnvStep(observation=observation, reward=reward, done=self.done)

    def reward(self, mode: Literal["sum", "last"] = "sum") -> float | None:
        """The episode's reward from its per-turn rewards (see :func:`aggregate_turn_rewards`)."""
        return aggregate_turn_rewards(self.rewards, mode)

    def _call(self, function: Callable[..., Any], what: str, *args: Any) -> Any:
        try:
            return function(*args)
        except Exception as err:
            raise self._error(what, f"raised {type(err).__name__}: {err}") from err

    def _normalize(self, observation: Observation, what: str) -> list[dict[str, Any]]:
        try:
            return normalize_observation(observation, name=f"the observation of {what}")
        except ValueError as err:
            raise self._error(what, f"returned an invalid observation: {err}") from err

    def _error(self, what: str, problem: str) -> EnvironmentFailedError:
        return EnvironmentFailedError(
            f"Environment {self._label} failed in {what} for {self.row_label} {self.index} "
            f"(prompt: {_excerpt(self.row)}): {problem}. This is a bug in the environment, not in the model's output."
        )


def _excerpt(row: Any, limit: int = 80) -> str:
    """A short, one-line excerpt of the row's prompt, for error messages."""
    prompt = row.get("prompt", row) if isinstance(row, dict) else row
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        prompt = prompt[-1].get("content", prompt)
    text = " ".join(str(prompt).split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def step_episodes(
    episodes: Sequence[EnvironmentEpisode], messages: Sequence[dict[str, Any]], *, max_workers: int = 8
) -> list[EnvStep]:
    """Step several episodes with their assistant messages concurrently (in threads), in order.

    Environments are user code: the first failure raises its :class:`EnvironmentFailedError` (the others still
    finish their step). Use ``max_workers=1`` for environments that are not thread-safe.

    Args:
        episodes: The episodes still running.
        messages: One assistant message per episode.
        max_workers: Most steps running at once, >= 1.

    Returns:
        One :class:`EnvStep` per episode, observations as lists of messages.
    """
    if len(episodes) != len(messages):
        raise ValueError(f"Got {len(episodes)} episodes but {len(messages)} messages; pass one message per episode.")
    check_number("max_workers", max_workers, integer=True, minimum=1)
    if max_workers == 1 or len(episodes) <= 1:
        return [episode.step(message) for episode, message in zip(episodes, messages, strict=True)]
    with ThreadPoolExecutor(max_workers=min(max_workers, len(episodes))) as pool:
        futures = [pool.submit(episode.step, message) for episode, message in zip(episodes, messages, strict=True)]
        return [future.result() for future in futures]
