"""Shared argument checks for the algorithm core: catalogue look-up, shape and dtype checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import torch

T = TypeVar("T")


def choose(catalogue: Mapping[str, T], name: str, what: str) -> T:
    """Look ``name`` up in a read-only catalogue, or raise an error that lists the valid names.

    Args:
        catalogue: Name to function mapping.
        name: The requested variant.
        what: What is being chosen, for the message (e.g. ``"advantage estimator"``).

    Raises:
        ValueError: ``name`` is not in the catalogue.
    """
    try:
        return catalogue[name]
    except (KeyError, TypeError):
        valid = ", ".join(repr(k) for k in catalogue)
        raise ValueError(f"unknown {what} {name!r}; valid names: {valid}") from None


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise a ``ValueError`` listing every shape when the given tensors do not all share one shape."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        seen = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"shape mismatch: expected equal shapes, got {seen}")


def check_floating(name: str, tensor: torch.Tensor) -> None:
    """Raise a ``TypeError`` when ``tensor`` is not floating point."""
    if not torch.is_floating_point(tensor):
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")
