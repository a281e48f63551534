"""PyTorch's CPU thread count for a fit on CPU: every free core, never a chosen count overridden.

PyTorch starts one intra-op thread per core it may use. That is right on an idle machine for any model big enough
to gain from threads (docs/benchmarks.md, "CPU threads": a 22M-parameter model's step took 42.5 s on 2 threads and
64.9 s on 1), and wrong in two cases, where at fit start on CPU, when nothing chose the count,
:func:`apply_default_cpu_threads` lowers it to :func:`default_cpu_threads`:

* a policy under :data:`SMALL_MODEL_PARAMETERS` parameters (the test models, the demo's) runs on 1 thread: its
  matrices are too small for threads to gain anything over their synchronisation;
* cores that other processes keep busy (measured over a fifth of a second from ``/proc/stat``, this process's own
  time left out) are left to them: threads that wait on a busy core stall every operation (README's Python example:
  67 s to 153 s on a 2-core machine with another job running, against 11 s on one thread). The free cores are
  shared by the training processes of the node, at most 8 each.

The count was chosen, and is never changed, when ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set, when
``torch.set_num_threads`` was called after ``lightning_grpo`` was imported (this module records such calls, even at
PyTorch's own count; a call before the import is seen only when it changed the count), or when the command line's
``torch_num_threads`` set it (:func:`set_cpu_threads`). The count is process-wide and is not restored after ``fit``;
an info line says what was set and why.

Example::

    >>> default_cpu_threads(num_parameters=100_000, cores=16, processes=1)
    1
    >>> default_cpu_threads(num_parameters=500_000_000, cores=16, processes=1)
    8
    >>> default_cpu_threads(num_parameters=22_000_000, cores=2, processes=1)
    2
    >>> default_cpu_threads(num_parameters=22_000_000, cores=2, processes=1, busy_elsewhere=1.0)
    1
"""

from __future__ import annotations

import functools
import os
import time

import torch
from lightning.pytorch.utilities import rank_zero_info

__all__ = [
    "SMALL_MODEL_PARAMETERS",
    "THREAD_VARIABLES",
    "apply_default_cpu_threads",
    "cores_busy_elsewhere",
    "default_cpu_threads",
    "set_cpu_threads",
    "threads_chosen",
]

#: Policies with fewer parameters run on one CPU thread by default (docs/benchmarks.md, "CPU threads").
SMALL_MODEL_PARAMETERS = 5_000_000
#: Environment variables that choose the thread count (PyTorch reads them when it starts).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: Seconds over which :func:`cores_busy_elsewhere` reads the machine's CPU time.
BUSY_WINDOW_S = 0.2
_MAX_DEFAULT_THREADS = 8

_at_import = torch.get_num_threads()  # PyTorch's own count, unless a script set one before importing lightning_grpo
_chosen_by_setting = False
_chosen_by_call = False
_defaulted_to: int | None = None  # the count apply_default_cpu_threads set, which is no choice
_set_num_threads = getattr(torch.set_num_threads, "__wrapped__", torch.set_num_threads)  # PyTorch's own function


@functools.wraps(_set_num_threads)
def _recorded_set_num_threads(num_threads: int) -> None:
    """``torch.set_num_threads``, remembered as a choice (installed below: a call at PyTorch's own count is one)."""
    global _chosen_by_call
    _set_num_threads(num_threads)
    _chosen_by_call = True


torch.set_num_threads = _recorded_set_num_threads


def set_cpu_threads(num_threads: int) -> None:
    """``torch.set_num_threads``, remembered as chosen (the command line's ``torch_num_threads`` calls it)."""
    global _chosen_by_setting
    _set_num_threads(num_threads)
    _chosen_by_setting = True


def threads_chosen() -> str | None:
    """What chose PyTorch's CPU thread count, or ``None`` when nothing did."""
    variables = [name for name in THREAD_VARIABLES if os.environ.get(name)]
    if variables:
        return f"{variables[0]}={os.environ[variables[0]]}"
    if _chosen_by_setting:
        return "torch_num_threads"
    if _chosen_by_call or torch.get_num_threads() not in (_at_import, _defaulted_to):
        return "torch.set_num_threads"
    return None


def default_cpu_threads(num_parameters: int, cores: int, processes: int, busy_elsewhere: float = 0.0) -> int:
    """The thread count of a fit on CPU that chose none (see the module's docstring for the rule).

    Args:
        num_parameters: The policy's parameters, base model included.
        cores: Cores this process may run on.
        processes: Training processes on this node (devices per node under DDP on CPU).
        busy_elsewhere: Cores' worth of CPU time other processes use (:func:`cores_busy_elsewhere`).
    """
    if num_parameters < SMALL_MODEL_PARAMETERS:
        return 1
    free = cores - round(busy_elsewhere)
    return max(1, min(_MAX_DEFAULT_THREADS, free // max(1, processes)))


def cores_busy_elsewhere(window_s: float = BUSY_WINDOW_S) -> float:
    """Cores' worth of CPU time that other processes used over ``window_s`` seconds (0.0 where unknown).

    Reads the machine's busy time from ``/proc/stat`` (Linux) before and after the window and takes this process's
    own CPU time out of it.
    """
    before, own_before, start = _busy_jiffies(), time.process_time(), time.monotonic()
    if before is None:
        return 0.0
    time.sleep(window_s)
    after, own_after, elapsed = _busy_jiffies(), time.process_time(), time.monotonic() - start
    if after is None:
        return 0.0
    busy_s = (after - before) / os.sysconf("SC_CLK_TCK")
    return max(0.0, (busy_s - (own_after - own_before)) / elapsed)


def _busy_jiffies() -> int | None:
    """The machine's non-idle CPU time in clock ticks, from ``/proc/stat``'s first line (``None`` off Linux)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle  # user .. steal; guest time is already counted in user


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
    small = num_parameters < SMALL_MODEL_PARAMETERS
    busy = 0.0 if small else cores_busy_elsewhere()
    threads = min(torch.get_num_threads(), default_cpu_threads(num_parameters, cores, processes, busy))
    if threads == torch.get_num_threads():
        return None
    global _defaulted_to
    _set_num_threads(threads)
    _defaulted_to = threads
    reason = (
        f"a policy under {SMALL_MODEL_PARAMETERS:,} parameters gains nothing from more"
        if small
        else f"other processes keep {busy:.1f} of {cores} cores busy"
    )
    rank_zero_info(
        f"Using {threads} CPU thread(s) of {cores} (torch.set_num_threads; process-wide, kept after fit): {reason}. "
        "Choose the count with OMP_NUM_THREADS, torch.set_num_threads or the config's torch_num_threads "
        "(docs/troubleshooting.md, 'Slow runs on CPU')"
    )
    return threads
