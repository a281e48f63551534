"""PyTorch's CPU thread count for a fit on CPU: one that does not oversubscribe a shared machine, unless chosen.

PyTorch starts one intra-op thread per core it may use. On a machine where other jobs hold some cores, those
threads wait on each other at every operation: README's Python example took 67 s to 153 s on a 2-core machine with
another job running, against 11 s on one thread. So at fit start on CPU, when nothing chose the count,
:func:`apply_default_cpu_threads` lowers it to :func:`default_cpu_threads`:

* 1 for a policy under :data:`SMALL_MODEL_PARAMETERS` parameters (the test models, the demo's): its matrices are
  too small for threads to gain anything over their synchronisation;
* otherwise half the cores this process may use, shared by the processes of this node, at most 8, at least 1.

The count was chosen when ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set, when ``torch.set_num_threads`` was
called after ``lightning_grpo`` was imported (the count differs from PyTorch's at import), or when the command
line's ``torch_num_threads`` set it (:func:`set_cpu_threads`). The count is process-wide and is not restored after
``fit``; an info line says what was set.

Example::

    >>> default_cpu_threads(num_parameters=100_000, cores=16, processes=1)
    1
    >>> default_cpu_threads(num_parameters=500_000_000, cores=16, processes=1)
    8
    >>> default_cpu_threads(num_parameters=500_000_000, cores=2, processes=1)
    1
"""

from __future__ import annotations

import os

import torch
from lightning.pytorch.utilities import rank_zero_info

__all__ = [
    "SMALL_MODEL_PARAMETERS",
    "THREAD_VARIABLES",
    "apply_default_cpu_threads",
    "default_cpu_threads",
    "set_cpu_threads",
    "threads_chosen",
]

#: Policies with fewer parameters run on one CPU thread by default.
SMALL_MODEL_PARAMETERS = 50_000_000
#: Environment variables that choose the thread count (PyTorch reads them when it starts).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_MAX_DEFAULT_THREADS = 8

_at_import = torch.get_num_threads()  # PyTorch's own count, unless a script set one before importing lightning_grpo
_chosen_by_setting = False


def set_cpu_threads(num_threads: int) -> None:
    """``torch.set_num_threads``, remembered as chosen (the command line's ``torch_num_threads`` calls it)."""
    global _chosen_by_setting
    torch.set_num_threads(num_threads)
    _chosen_by_setting = True


def threads_chosen() -> str | None:
    """What chose PyTorch's CPU thread count, or ``None`` when nothing did."""
    variables = [name for name in THREAD_VARIABLES if os.environ.get(name)]
    if variables:
        return f"{variables[0]}={os.environ[variables[0]]}"
    if _chosen_by_setting:
        return "torch_num_threads"
    if torch.get_num_threads() != _at_import:
        return "torch.set_num_threads"
    return None


def default_cpu_threads(num_parameters: int, cores: int, processes: int) -> int:
    """The thread count of a fit on CPU that chose none (see the module's docstring for the rule).

    Args:
        num_parameters: The policy's parameters, base model included.
        cores: Cores this process may run on.
        processes: Training processes on this node (devices per node under DDP on CPU).
    """
    if num_parameters < SMALL_MODEL_PARAMETERS:
        return 1
    return max(1, min(_MAX_DEFAULT_THREADS, cores // (2 * max(1, processes))))


def apply_default_cpu_threads(device: torch.device, policy: torch.nn.Module, processes: int) -> int | None:
    """On CPU, lower PyTorch's thread count to :func:`default_cpu_threads` when nothing chose it (never raise it).

    ``GRPOModule.setup`` calls it with the strategy's device, the policy and the devices per node.

    Returns:
        The count set, or ``None`` when it was left as it is (another device, chosen, or already as low).
    """
    if device.type != "cpu" or threads_chosen() is not None:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    num_parameters = sum(p.numel() for p in policy.parameters())
    threads = min(torch.get_num_threads(), default_cpu_threads(num_parameters, cores, processes))
    if threads == torch.get_num_threads():
        return None
    torch.set_num_threads(threads)
    rank_zero_info(
        f"Using {threads} CPU thread(s) of {cores} (torch.set_num_threads; process-wide, kept after fit): more "
        "oversubscribe a shared machine. Choose the count with OMP_NUM_THREADS, torch.set_num_threads or the "
        "config's torch_num_threads (docs/troubleshooting.md, 'Slow on CPU')"
    )
    return threads
