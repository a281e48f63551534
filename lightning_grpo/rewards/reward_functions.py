"""The reward-function protocol and :class:`RewardFunctions`, which calls several functions and weights their scores.

A reward function is any callable ``fn(prompts=..., completions=..., completion_ids=..., **columns, **extra) ->
list[float | None]``, called by keyword as TRL calls it; ``async def`` functions are awaited. ``columns`` are the
dataset row fields, one list per field aligned with the samples (``answer=[...]``), plus whatever the caller adds
(``completion_lengths=[...]`` token counts, ``trainer_state``). ``None`` means "this function does not apply to that
row". Completions come in the prompt's form: strings for string prompts, lists of chat messages for conversational
ones. See ``docs/rewards.md``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from lightning_grpo.rewards._concurrency import RewardCall, _CallFailed, run_calls
from lightning_grpo.rewards._signature import KeywordSpec, unique_names
from lightning_grpo.rewards._text import DATASET_INDEX, excerpt
from lightning_grpo.rewards._validation import check_inputs, check_timeouts, check_weights, split_functions
from lightning_grpo.rewards.process_supervision import StepRewards

_FLOAT32_MAX = torch.finfo(torch.float32).max

__all__ = ["RewardError", "RewardFunction", "RewardFunctions", "RewardScores", "TrainerState"]


class RewardFunction(Protocol):
    """What a reward function looks like to a type checker.

    A plain function whose signature names only what it reads (``def f(completions, answer)``) is accepted as well:
    :class:`RewardFunctions` passes it only the keywords its signature accepts.
    """

    def __call__(self, *, prompts: list[Any], completions: list[Any], **kwargs: Any) -> Sequence[float | None]: ...


@dataclass(frozen=True)
class TrainerState:
    """Where training is, for reward functions that change with it: the ``trainer_state`` keyword (TRL's name).

    Args:
        global_step: Optimizer steps taken so far (Lightning's ``trainer.global_step``).
        epoch: The current epoch.
        max_steps: The step limit, ``-1`` when there is none.

    Example::

        >>> def curriculum(completions, trainer_state, **kwargs):
        ...     strict = trainer_state.global_step >= 100
        ...     return [float(len(c) < 10) if strict else 1.0 for c in completions]
    """

    global_step: int = 0
    epoch: int = 0
    max_steps: int = -1

    @classmethod
    def of(cls, trainer: Any) -> TrainerState:
        """The state of a Lightning ``Trainer`` (any object with its attributes); zeros for ``None``."""
        if trainer is None:
            return cls()
        return cls(int(trainer.global_step), int(trainer.current_epoch), int(getattr(trainer, "max_steps", -1)))


class RewardError(RuntimeError):
    """A reward function failed, or returned something that cannot be a reward."""


class RewardInputError(RewardError):
    """Reward functions that need keywords the data does not offer (found at fit start, before any step)."""


class RewardOutputError(RewardError):
    """A reward function returned something that is not one finite reward per completion (the message names the
    function and, for a bad value, the row, dataset row, prompt and completion)."""


@dataclass(frozen=True, eq=False)
class RewardScores:
    """The scores of one batch of completions.

    Args:
        rewards: ``(N,)`` float32, the weighted sum over the functions that applied to each row; NaN where every
            function returned ``None`` for the row.
        per_function: Reward name to ``(N,)`` float32 raw (unweighted) values, NaN where that function returned
            ``None``.
        seconds: Reward name to the wall-clock seconds its call took (the functions run concurrently).
        steps: Reward name to its :class:`~lightning_grpo.rewards.StepRewards` per row (``None`` for rows it scored
            with a number or skipped), for each function that returned step rewards; their totals are in
            ``per_function`` and ``rewards``.
        step_rewards: ``(N, T)`` the weighted reward of each step at the token where it ends, NaN elsewhere (reward
            functions' steps and environment turn rewards); set by ``GRPOModule.score`` for ``grpo_process``.

    Example::

        >>> import torch
        >>> scores = RewardScores(torch.tensor([1.0, float("nan")]), {"f": torch.tensor([1.0, float("nan")])})
        >>> scores.valid
        tensor([ True, False])
    """

    rewards: Tensor
    per_function: dict[str, Tensor]
    seconds: dict[str, float] = field(default_factory=dict)
    steps: dict[str, list[StepRewards | None]] = field(default_factory=dict)
    step_rewards: Tensor | None = None

    @property
    def valid(self) -> Tensor:
        """``(N,)`` bool, ``True`` where at least one function applied to the row."""
        return ~torch.isnan(self.rewards)


class RewardFunctions:
    """Several reward functions with weights, called together, concurrently, on one batch.

    Args:
        functions: Reward functions, as a sequence (names are taken from each function, see below), a mapping from
            name to function, or a single one. A string, or a loaded ``AutoModelForSequenceClassification``, becomes
            a :class:`~lightning_grpo.rewards.RewardModel` (as TRL's ``reward_funcs="<model id>"``). A name is the
            callable's ``name`` attribute if it has one, else its ``__name__``, else its class name in snake_case
            (``FormatReward`` -> ``format_reward``); repeated names get suffixes ``_1``, ``_2``, ...
        weights: One finite weight per function, as a sequence in the order of ``functions`` or a mapping with one
            entry per name. ``None`` weighs every function 1.0.
        timeout: Seconds each function may take per batch: one number for all, or a mapping from reward name to
            seconds (``None`` for no limit). A function past its timeout stops the step with an error naming it.

    Functions are called by keyword: ``prompts``, ``completions``, every column and every extra keyword given to
    :meth:`__call__` (``completion_ids``, ``completion_lengths``, ``trainer_state``, ...); a function without
    ``**kwargs`` receives only the keywords its signature names. A function whose first two parameters are not both
    names on offer (``lambda p, c, **kw``) receives prompts and completions positionally. ``async def`` functions are
    awaited; all functions of a batch run concurrently, the sync ones in threads.

    Example::

        >>> def exact(completions, answer, **kwargs):
        ...     return [float(c == a) if a is not None else None for c, a in zip(completions, answer, strict=True)]
        >>> async def short(prompts, completions, **kwargs):
        ...     return [float(len(c) < 3) for c in completions]
        >>> reward_fns = RewardFunctions([exact, short], weights=[1.0, 0.5], timeout=60)
        >>> scores = reward_fns(["1+1=", "2+2="], ["2", "five"], {"answer": ["2", None]})
        >>> scores.rewards  # row 0: 1.0*1 + 0.5*1; row 1: exact skipped, 0.5*0
        tensor([1.5000, 0.0000])
        >>> reward_fns.names
        ('exact', 'short')
    """

    def __init__(
        self,
        functions: Sequence[Callable[..., Any] | str] | Mapping[str, Callable[..., Any]] | Callable[..., Any] | str,
        weights: Sequence[float] | Mapping[str, float] | None = None,
        *,
        timeout: float | Mapping[str, float | None] | None = None,
    ) -> None:
        names, fns = split_functions(functions)
        self._functions = fns
        self._names = unique_names(names)
        self._weights = check_weights(weights, self._names)
        self._timeouts = check_timeouts(timeout, self._names)
        self._specs = tuple(KeywordSpec.of(fn, name) for fn, name in zip(fns, self._names, strict=True))

    @classmethod
    def of(
        cls,
        functions: RewardFunctions | Sequence[Callable[..., Any]] | Mapping[str, Callable[..., Any]],
        weights: Sequence[float] | Mapping[str, float] | None = None,
        *,
        timeout: float | Mapping[str, float | None] | None = None,
    ) -> RewardFunctions:
        """``RewardFunctions(functions, weights, timeout=timeout)``; a ``RewardFunctions`` is returned as it is.

        Raises:
            ValueError: ``functions`` is a ``RewardFunctions`` and ``weights`` or ``timeout`` is given too (set them
                in one place).
        """
        if not isinstance(functions, RewardFunctions):
            return cls(functions, weights, timeout=timeout)
        if weights is not None or timeout is not None:
            raise ValueError(
                "reward_funcs is a RewardFunctions, which holds its weights and timeouts: give reward_weights and "
                "GRPOConfig.faults.reward_timeout as None, or pass the functions as a list"
            )
        return functions

    @property
    def names(self) -> tuple[str, ...]:
        """The reward names, in order; the keys of :attr:`RewardScores.per_function`."""
        return self._names

    @property
    def weights(self) -> tuple[float, ...]:
        """The weights, in the order of :attr:`names`."""
        return self._weights

    @property
    def functions(self) -> tuple[Callable[..., Any], ...]:
        """The functions, in the order of :attr:`names` (strings already turned into reward models)."""
        return self._functions

    @property
    def timeouts(self) -> tuple[float | None, ...]:
        """Seconds each function may take, in the order of :attr:`names`; ``None`` for no limit."""
        return self._timeouts

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> RewardFunctions:
        """Move the reward models among the functions (anything with a ``place`` method) to ``device``/``dtype``."""
        for fn in self._functions:
            place = getattr(fn, "place", None)
            if callable(place):
                place(device, dtype)
        return self

    def __len__(self) -> int:
        return len(self._functions)

    def __repr__(self) -> str:
        pairs = ", ".join(f"{name}={weight:g}" for name, weight in zip(self._names, self._weights, strict=True))
        return f"{type(self).__name__}({pairs})"

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        columns: Mapping[str, Sequence[Any]] | None = None,
        **extra: Any,
    ) -> RewardScores:
        """Score a batch with every function (concurrently) and combine the scores.

        Args:
            prompts: ``N`` prompts, one per completion: strings or lists of chat messages.
            completions: ``N`` completions, in the prompts' form.
            columns: Dataset fields, each a sequence of ``N`` values aligned with the completions.
            **extra: More keywords for the functions, e.g. ``completion_ids`` (``N`` lists of token ids),
                ``completion_lengths`` (token counts) or ``trainer_state``.

        Returns:
            The weighted rewards, the raw values of each function and the seconds each took.

        Raises:
            ValueError: If the inputs are misaligned or a column name clashes with an argument.
            RewardError: If a function lacks a keyword it requires, raises, runs past its timeout, or returns the
                wrong length, a non-numeric value, NaN or infinity.
        """
        keywords = check_inputs(prompts, completions, dict(columns or {}), extra)
        prompts, completions = list(prompts), list(completions)
        calls = [self._call(i, prompts, completions, keywords) for i in range(len(self._functions))]
        try:
            outputs, seconds = run_calls(calls)
        except _CallFailed as failed:
            raise _failure(failed) from failed.error
        per_function, steps = {}, {}
        for name, output in zip(self._names, outputs, strict=True):
            values = _as_list(output, name, len(completions))
            per_function[name] = _to_tensor(values, name, prompts, completions, keywords.get(DATASET_INDEX))
            if any(isinstance(value, StepRewards) for value in values):
                steps[name] = [value if isinstance(value, StepRewards) else None for value in values]
        values = torch.stack(list(per_function.values()))  # (F, N)
        weights = torch.tensor(self._weights, dtype=torch.float32, device=values.device).unsqueeze(1)  # (F, 1)
        applied = ~torch.isnan(values)
        total = torch.where(applied, values * weights, torch.zeros_like(values)).sum(0)  # (N,)
        rewards = torch.where(applied.any(0), total, torch.full_like(total, math.nan))
        return RewardScores(rewards=rewards, per_function=per_function, seconds=seconds, steps=steps)

    def check_keywords(self, offered: Iterable[str], where: str = "the batch") -> None:
        """Refuse, before any step, a function whose required parameters none of the ``offered`` keywords fill.

        Args:
            offered: Every keyword a call will offer (``prompts``, ``completions``, the data's columns, extras).
            where: What offers them, for the message (e.g. ``"the data (columns ['answer'])"``).

        Raises:
            RewardInputError: Naming the function, the keywords it lacks and the fix.
        """
        keywords = {key: None for key in offered if key not in ("prompts", "completions")}
        for name, spec in zip(self._names, self._specs, strict=True):
            try:
                spec.arguments([], [], keywords)
            except KeyError as err:
                raise RewardInputError(
                    f"reward function {name!r} needs keyword(s) {err.args[0]}, which {where} does not offer; "
                    f"it offers {sorted({'prompts', 'completions', *keywords})}. Rename the function's parameters "
                    "to those names, give them defaults, or add the columns to the data."
                ) from None

    def _call(self, index: int, prompts: list[Any], completions: list[Any], keywords: dict[str, Any]) -> RewardCall:
        name, spec = self._names[index], self._specs[index]
        try:
            args, kwargs = spec.arguments(prompts, completions, keywords)
        except KeyError as err:
            offered = sorted({"prompts", "completions", *keywords})
            raise RewardError(
                f"reward function {name!r} needs keyword(s) {err.args[0]}; the batch offers {offered}"
            ) from None
        return RewardCall(name, self._functions[index], args, kwargs, self._timeouts[index])


def _failure(failed: _CallFailed) -> RewardError:
    name, error = failed.call.name, failed.error
    if error is None:
        return RewardError(
            f"reward function {name!r} did not finish within its timeout of {failed.call.timeout:g} s; raise "
            f"GRPOConfig(faults=FaultConfig(reward_timeout={{{name!r}: ...}})) (YAML: "
            "model.init_args.grpo.faults.reward_timeout) or "
            "RewardFunctions(timeout=...), or make it faster (a sync function is abandoned in its daemon thread)"
        )
    return RewardError(f"reward function {name!r} raised {type(error).__name__}: {error}")


def _row_context(index: int, prompts: list[Any], completions: list[Any], dataset_index: Any = None) -> str:
    dataset = f"dataset row {dataset_index[index]}, " if dataset_index is not None else ""
    return f"row {index} ({dataset}prompt {excerpt(prompts[index])}, completion {excerpt(completions[index])})"


def _as_list(output: Any, name: str, n: int) -> list[Any]:
    """The function's output as a list of length ``n``; tensors and arrays are converted with ``tolist``."""
    if hasattr(output, "tolist") and not isinstance(output, (list, tuple)):
        output = output.tolist()
    if not isinstance(output, (list, tuple)):
        raise RewardOutputError(
            f"reward function {name!r} must return a list of {n} values (float or None); got {type(output).__name__}"
        )
    if len(output) != n:
        raise RewardOutputError(
            f"reward function {name!r} must return one value per completion: expected {n}, got {len(output)}"
        )
    return list(output)


def _to_float(value: Any) -> float | None:
    """``value`` as a float (bools count as 0/1; step rewards as their sum), or ``None`` when it is not a number."""
    if isinstance(value, StepRewards):
        return value.total
    if isinstance(value, numbers.Real):  # bool, int, float, Fraction, NumPy scalars
        return float(value)
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_complex():
        return float(value.item())
    return None


def _to_tensor(
    values: list[Any], name: str, prompts: list[Any], completions: list[Any], dataset_index: Sequence[Any] | None
) -> Tensor:
    """``(N,)`` float32 of a function's values, NaN for ``None``; raises on anything that is not a finite number."""
    where = lambda index: _row_context(index, prompts, completions, dataset_index)  # noqa: E731
    floats: list[float] = []
    for index, value in enumerate(values):
        number = math.nan if value is None else _to_float(value)
        if number is None:
            raise RewardOutputError(
                f"reward function {name!r} returned a non-numeric value {value!r:.40} ({type(value).__name__}) at "
                f"{where(index)}; expected a float, int, bool, StepRewards or None"
            )
        floats.append(number)
    tensor = torch.tensor(floats, dtype=torch.float32, device="cpu").reshape(len(floats))  # host values
    for index in (i for i, number in enumerate(floats) if not abs(number) <= _FLOAT32_MAX):  # NaN, inf, overflow
        if values[index] is not None:
            raise RewardOutputError(
                f"reward function {name!r} returned {values[index]!r} at {where(index)}; "
                "rewards must be finite numbers (return None to skip a row)"
            )
    return tensor
