"""Shared argument checks for the algorithm core: shapes and dtypes (catalogue look-up: ``catalogue.py``)."""

from __future__ import annotations

import torch


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
