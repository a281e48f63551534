"""Counting ATen calls and host syncs: the budgets of the hot paths (docs/benchmarks.md, "GPU readiness").

On a GPU, every kernel is a launch and every read of a device value by the host (``.item()``, ``bool(t)``,
``.tolist()``, ``nonzero``, boolean-mask indexing, a copy to the CPU) waits for the device to finish. Neither shows
on a CPU, where both are cheap, so the tests count them here instead of timing them.

Example::

    >>> x = torch.arange(6.0)
    >>> with DispatchCounter() as counter:
    ...     y = (x * 2).sum()
    ...     _ = float(y)  # a host sync
    ...     _ = x[x > 2]  # boolean-mask indexing: a hidden nonzero, a sync
    >>> counter.syncs, counter.calls
    (2, 5)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SYNC_OPS", "DispatchCounter"]

#: ATen operators that make the host wait for the device (their output size or value is data dependent).
SYNC_OPS = frozenset(
    {
        "aten._local_scalar_dense.default",  # .item(), bool(t), int(t), float(t)
        "aten.nonzero.default",
        "aten.masked_select.default",
        "aten._unique2.default",
        "aten.unique_dim.default",
        "aten.unique_consecutive.default",
        "aten.equal.default",
        "aten.is_nonzero.default",
        "aten.allclose.default",
    }
)

#: Tensor methods that read the values on the host (counted once per call; their dispatch is invisible on a CPU
#: tensor, so the CPU tests count them whatever the tensor's device: a conservative budget).
_HOST_READS = frozenset({"tolist", "numpy"})


class DispatchCounter:
    """Counts ATen calls and the calls that sync the host with the device, inside a ``with`` block.

    Attributes:
        calls: ATen operator calls.
        syncs: Host syncs: :data:`SYNC_OPS`, indexing or ``index_put_`` with a boolean mask, ``repeat_interleave``
            with tensor repeats and no ``output_size``, ``.tolist()`` and ``.numpy()`` (of any tensor: on a CPU they
            cannot be told from a host list), and ``.cpu()``/``.to("cpu")`` of a tensor off the CPU.
        ops: Each ATen operator's count; ``sync_ops`` the same for the syncs.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.syncs = 0
        self.ops: Counter[str] = Counter()
        self.sync_ops: Counter[str] = Counter()
        self._modes = (_FunctionCounter(self), _AtenCounter(self))

    def __enter__(self) -> DispatchCounter:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    def count_sync(self, name: str) -> None:
        """Record one host sync by ``name``."""
        self.syncs += 1
        self.sync_ops[name] += 1


class _AtenCounter(TorchDispatchMode):
    def __init__(self, counter: DispatchCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = str(func)
        self.counter.calls += 1
        self.counter.ops[name] += 1
        if name in SYNC_OPS or _hidden_sync(name, args, kwargs):
            self.counter.count_sync(name)
        return func(*args, **kwargs)


def _hidden_sync(name: str, args: tuple, kwargs: dict) -> bool:
    """A boolean-mask index (a ``nonzero`` inside) or ``repeat_interleave`` whose output size needs the data."""
    if name.startswith(("aten.index.", "aten.index_put", "aten._index_put_impl_")):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
    if name == "aten.repeat_interleave.Tensor":
        return kwargs.get("output_size") is None
    if name == "aten.repeat_interleave.self_Tensor":
        return kwargs.get("output_size") is None
    return False


class _FunctionCounter(TorchFunctionMode):
    def __init__(self, counter: DispatchCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _HOST_READS or (name in ("to", "cpu") and _off_host(args) and _to_host(name, args[1:], kwargs)):
            self.counter.count_sync(f"Tensor.{name}")
        return func(*args, **kwargs)


def _off_host(args: tuple) -> bool:
    """Whether the tensor a method is called on lives off the CPU (a CPU-to-CPU copy is no sync)."""
    return bool(args) and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu"


def _to_host(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether ``Tensor.cpu()`` or ``Tensor.to(*args, **kwargs)`` names the CPU as its target."""
    if name == "cpu":
        return True
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, torch.Tensor):
        target = target.device
    if isinstance(target, str | torch.device):
        return torch.device(target).type == "cpu"
    return False
