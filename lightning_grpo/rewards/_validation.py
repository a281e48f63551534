"""Checks on what :class:`~lightning_grpo.rewards.RewardFunctions` is given: functions, weights, batch inputs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from lightning_grpo.rewards._signature import reward_name
from lightning_grpo.settings_checks import check_number

__all__ = ["check_inputs", "check_timeouts", "check_weights", "split_functions"]


def split_functions(
    functions: Sequence[Callable[..., Any] | str] | Mapping[str, Callable[..., Any]] | Callable[..., Any] | str,
) -> tuple[list[str], tuple[Callable[..., Any], ...]]:
    """Names and callables from a sequence, a mapping or a single function, checked.

    A string (a model id or path) or a loaded sequence-classification model becomes a reward model.
    """
    if isinstance(functions, (str, bytes)) or _is_model(functions) or _is_single(functions):
        functions = [functions]
    if isinstance(functions, Mapping):
        bad = [key for key in functions if not isinstance(key, str) or not key]
        if bad:
            raise ValueError(f"reward names (the mapping's keys) must be non-empty strings; got {bad!r}")
        names, fns = list(functions.keys()), tuple(functions.values())
    elif isinstance(functions, Sequence):
        fns = tuple(functions)
        names = []
    else:
        raise TypeError(
            "functions must be a reward function, a model id, a sequence of them or a mapping from name to reward "
            f"function; got {type(functions).__name__}"
        )
    if not fns:
        raise ValueError("RewardFunctions needs at least one reward function; got none")
    fns = tuple(_as_function(fn) for fn in fns)
    for index, fn in enumerate(fns):
        _check_callable(fn, names[index] if names else f"functions[{index}]")
    return (names or [reward_name(fn) for fn in fns]), fns


def _is_single(functions: object) -> bool:
    return callable(functions) and not isinstance(functions, (Sequence, Mapping))


def _is_model(fn: object) -> bool:
    """A loaded Hugging Face model (an ``nn.Module`` with a ``config``), to be wrapped in a reward model."""
    return isinstance(fn, torch.nn.Module) and hasattr(fn, "config")


def _as_function(fn: Any) -> Any:
    """A model id/path or a loaded model as a :class:`~lightning_grpo.rewards.RewardModel`; anything else as is."""
    if isinstance(fn, str) or _is_model(fn):
        from lightning_grpo.rewards.reward_model import RewardModel  # loads transformers only when a model is used

        return RewardModel(fn)
    return fn


def _check_callable(fn: object, where: str) -> None:
    if isinstance(fn, type):
        raise TypeError(f"{where} is the class {fn.__name__}; pass an instance, e.g. {fn.__name__}(...)")
    if not callable(fn):
        raise TypeError(f"{where} must be a callable reward function; got {type(fn).__name__} {fn!r:.80}")


def check_weights(weights: Sequence[float] | Mapping[str, float] | None, names: tuple[str, ...]) -> tuple[float, ...]:
    """One finite float per name, from a sequence, a mapping or ``None`` (all 1.0)."""
    if weights is None:
        return tuple(1.0 for _ in names)
    if isinstance(weights, Mapping):
        missing, unknown = set(names) - set(weights), set(weights) - set(names)
        if missing or unknown:
            raise ValueError(
                f"weights must have one entry per reward name {list(names)}; "
                f"missing {sorted(missing)}, unknown {sorted(map(str, unknown))}"
            )
        weights = [weights[name] for name in names]
    elif not isinstance(weights, Sequence) or isinstance(weights, (str, bytes)):
        raise TypeError(f"weights must be a sequence of floats, a mapping from name to float, or None; got {weights!r}")
    if len(weights) != len(names):
        raise ValueError(
            f"weights must have one entry per reward function ({len(names)}: {list(names)}); got {len(weights)}"
        )
    for name, weight in zip(names, weights, strict=True):
        check_number(f"weights[{name!r}]", weight)
    return tuple(float(weight) for weight in weights)


def check_timeouts(
    timeout: float | Mapping[str, float | None] | None, names: tuple[str, ...]
) -> tuple[float | None, ...]:
    """Seconds per function (``None`` = no limit), from one number, a mapping from name to seconds, or ``None``."""
    if isinstance(timeout, Mapping):
        unknown = sorted(map(str, set(timeout) - set(names)))
        if unknown:
            raise ValueError(f"timeout names unknown reward(s) {unknown}; the rewards are {list(names)}")
        values = [timeout.get(name) for name in names]
    else:
        values = [timeout for _ in names]
    for name, value in zip(names, values, strict=True):
        check_number(f"timeout[{name!r}]", value, minimum=0.0, exclusive_minimum=True, allow_none=True)  # seconds
    return tuple(None if value is None else float(value) for value in values)


def check_inputs(
    prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, Sequence[Any]], extra: dict[str, Any]
) -> dict[str, Any]:
    """The keywords for the functions (columns plus extras), after checking that columns align with the samples."""
    for key, values in (("prompts", prompts), ("completions", completions)):
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ValueError(
                f"{key} must be a list with one entry per sample (strings or lists of chat messages); "
                f"got {type(values).__name__}"
            )
    n = len(completions)
    if len(prompts) != n:
        raise ValueError(f"prompts and completions must have the same length; got {len(prompts)} and {n}")
    for key in ("prompts", "completions"):
        if key in columns or key in extra:
            raise ValueError(f"{key!r} is passed to reward functions by RewardFunctions; it cannot also be a column")
    clash = sorted(set(columns) & set(extra))
    if clash:
        raise ValueError(f"keywords {clash} are given both as columns and as extra keywords; give each once")
    for key, values in columns.items():
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            raise ValueError(f"column {key!r} must be a sequence of {n} values; got {type(values).__name__}")
        if len(values) != n:
            raise ValueError(f"column {key!r} must have one value per completion ({n}); got {len(values)}")
    ids = extra.get("completion_ids")
    if ids is not None and (isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__") or len(ids) != n):
        raise ValueError(
            f"completion_ids must be a list of {n} lists of token ids (one per completion); got {ids!r:.80}"
        )
    return {**columns, **extra}
