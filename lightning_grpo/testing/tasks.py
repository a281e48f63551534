"""Built-in tiny tasks, generated in code, for tests and the offline demo.

Each task is a function with keyword-only arguments that returns ``list[dict]`` records with a ``prompt`` and an
``answer`` (both strings). Prompts and answers use only digits and ``+=``, so the character-level tokenizer of
:mod:`lightning_grpo.testing.tokenizer` encodes them one token per character. The same arguments always give the
same records.

Example::

    from lightning_grpo.testing import make_task

    records = make_task("addition", num_samples=4, seed=1)
    records[0]  # {'prompt': '2+9=', 'answer': '11'}
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from lightning_grpo.settings_checks import check_number

__all__ = ["BUILTIN_TASKS", "addition", "make_task", "successor"]


def _check_positive(name: str, value: int, minimum: int = 1) -> None:
    check_number(name, value, integer=True, minimum=minimum)


def addition(*, num_samples: int = 256, max_operand: int = 9, seed: int = 0) -> list[dict[str, Any]]:
    """Sums of two random operands: prompt ``"3+4="``, answer ``"7"``.

    Args:
        num_samples: Number of records.
        max_operand: Largest operand; operands are drawn uniformly from ``0..max_operand``.
        seed: Seed of the private random generator (the global random state is not touched).

    Returns:
        Records ``{"prompt": "a+b=", "answer": str(a + b)}``.
    """
    _check_positive("num_samples", num_samples)
    _check_positive("max_operand", max_operand, minimum=0)
    rng = random.Random(seed)
    records = []
    for _ in range(num_samples):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        records.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return records


def successor(*, num_samples: int = 64, seed: int = 0) -> list[dict[str, Any]]:
    """The next digit: prompt ``"5+1="``, answer ``"6"``; ``n`` is drawn from ``0..8`` so the answer is one digit.

    Args:
        num_samples: Number of records.
        seed: Seed of the private random generator (the global random state is not touched).

    Returns:
        Records ``{"prompt": "n+1=", "answer": str(n + 1)}``.
    """
    _check_positive("num_samples", num_samples)
    rng = random.Random(seed)
    records = []
    for _ in range(num_samples):
        n = rng.randint(0, 8)
        records.append({"prompt": f"{n}+1=", "answer": str(n + 1)})
    return records


#: Built-in tasks by name; read-only. Each takes keyword-only arguments and returns ``list[dict]``.
BUILTIN_TASKS: Mapping[str, Callable[..., list[dict[str, Any]]]] = MappingProxyType(
    {"addition": addition, "successor": successor}
)


def make_task(name: str, **kwargs: Any) -> list[dict[str, Any]]:
    """Generate the records of the built-in task ``name``.

    Args:
        name: A key of :data:`BUILTIN_TASKS`.
        **kwargs: Arguments of that task's function (e.g. ``num_samples``, ``seed``).

    Returns:
        The task's records, each with ``prompt`` and ``answer`` strings.

    Raises:
        ValueError: ``name`` is not a built-in task; the message lists the valid names.
    """
    if name not in BUILTIN_TASKS:
        raise ValueError(f"Unknown built-in task {name!r}; valid tasks: {sorted(BUILTIN_TASKS)}")
    return BUILTIN_TASKS[name](**kwargs)
