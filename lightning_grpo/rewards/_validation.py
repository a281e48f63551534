"""Checks on what :class:`~lightning_grpo.rewards.RewardFunctions` is given: functions, weights, batch inputs."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightning_grpo.rewards._signature import reward_name

__all__ = ["check_inputs", "check_weights", "split_functions"]


def split_functions(
    functions: Sequence[Callable[..., Any]] | Mapping[str, Callable[..., Any]],
) -> tuple[list[str], tuple[Callable[..., Any], ...]]:
    """Names and callables from a sequence or a mapping, checked."""
    if isinstance(functions, Mapping):
        bad = [key for key in functions if not isinstance(key, str) or not key]
        if bad:
            raise ValueError(f"reward names (the mapping's keys) must be non-empty strings; got {bad!r}")
        names, fns = list(functions.keys()), tuple(functions.values())
    elif isinstance(functions, Sequence) and not isinstance(functions, (str, bytes)):
        fns = tuple(functions)
        names = []
    else:
        raise TypeError(
            "functions must be a sequence of reward functions or a mapping from name to reward function; "
            f"got {type(functions).__name__} (wrap a single function in a list)"
        )
    if not fns:
        raise ValueError("RewardFunctions needs at least one reward function; got none")
    for index, fn in enumerate(fns):
        _check_callable(fn, names[index] if names else f"functions[{index}]")
    return (names or [reward_name(fn) for fn in fns]), fns


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
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
            raise ValueError(f"weights must be finite numbers; got {weight!r} for {name!r}")
    return tuple(float(weight) for weight in weights)


def check_inputs(
    prompts: Sequence[str], completions: Sequence[str], columns: dict[str, Sequence[Any]], extra: dict[str, Any]
) -> dict[str, Any]:
    """The keywords for the functions (columns plus extras), after checking that columns align with the samples."""
    for key, values in (("prompts", prompts), ("completions", completions)):
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ValueError(f"{key} must be a list of strings, one per sample; got {type(values).__name__}")
    n = len(completions)
    if len(prompts) != n:
        raise ValueError(f"prompts and completions must have the same length; got {len(prompts)} and {n}")
    for key in ("prompts", "completions"):
        if key in columns or key in extra:
            raise ValueError(f"{key!r} is passed positionally to reward functions; it cannot also be a column")
    clash = sorted(set(columns) & set(extra))
    if clash:
        raise ValueError(f"keywords {clash} are given both as columns and as extra keywords; give each once")
    for key, values in columns.items():
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            raise ValueError(f"column {key!r} must be a sequence of {n} values; got {type(values).__name__}")
        if len(values) != n:
            raise ValueError(f"column {key!r} must have one value per completion ({n}); got {len(values)}")
    return {**columns, **extra}
