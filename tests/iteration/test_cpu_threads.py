"""PyTorch's CPU threads at fit start: a chosen count is kept, otherwise a CPU fit keeps every free core, one thread
for the tiny models (``lightning_grpo.iteration.cpu_threads``)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from lightning_grpo.iteration import cpu_threads
from lightning_grpo.iteration.cpu_threads import apply_default_cpu_threads, default_cpu_threads, set_cpu_threads
from tests.conftest import make_trainer, prompt_loader

CPU = torch.device("cpu")


@pytest.fixture
def torch_default_two(monkeypatch):
    """PyTorch at its own count of 2 threads with nothing chosen; the test process's count is restored after."""
    before = torch.get_num_threads()
    for name in cpu_threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cpu_threads, "_chosen_by_setting", False)
    monkeypatch.setattr(cpu_threads, "_at_import", 2)  # as if PyTorch started with 2 threads
    torch.set_num_threads(2)
    monkeypatch.setattr(cpu_threads, "_chosen_by_call", False)  # that call was the fixture's, not a choice
    monkeypatch.setattr(cpu_threads, "_defaulted_to", None)
    monkeypatch.setattr(cpu_threads, "cores_busy_elsewhere", lambda: 0.0)  # an idle machine
    yield
    torch.set_num_threads(before)


def test_the_default_is_one_thread_for_small_models_and_every_free_core_for_others():
    assert default_cpu_threads(num_parameters=100_000, cores=64, processes=1) == 1  # the tiny test models
    assert default_cpu_threads(num_parameters=22_000_000, cores=2, processes=1) == 2  # an idle machine: every core
    assert default_cpu_threads(num_parameters=22_000_000, cores=2, processes=1, busy_elsewhere=1.2) == 1
    assert default_cpu_threads(num_parameters=500_000_000, cores=2, processes=1, busy_elsewhere=2.0) == 1  # >= 1
    assert default_cpu_threads(num_parameters=500_000_000, cores=8, processes=2) == 4  # DDP on CPU: per process
    assert default_cpu_threads(num_parameters=500_000_000, cores=8, processes=2, busy_elsewhere=4.4) == 2
    assert default_cpu_threads(num_parameters=500_000_000, cores=64, processes=1) == 8  # at most 8


def test_busy_cores_of_another_process_are_measured():
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
    try:
        assert cpu_threads.cores_busy_elsewhere(window_s=0.5) >= 0.5  # the spinning child holds about one core
    finally:
        spin.kill()
        spin.wait()


@pytest.mark.usefixtures("torch_default_two")
def test_a_cpu_fit_that_chose_nothing_runs_on_one_thread(make_module):
    make_trainer(max_steps=1).fit(make_module(), prompt_loader(["1+1=", "2+2="]))  # GRPOModule.setup applies it
    assert torch.get_num_threads() == 1


@pytest.mark.usefixtures("torch_default_two")
@pytest.mark.parametrize(
    "choose",
    [
        lambda monkeypatch: monkeypatch.setenv("OMP_NUM_THREADS", "2"),
        lambda monkeypatch: monkeypatch.setenv("MKL_NUM_THREADS", "2"),
        lambda monkeypatch: torch.set_num_threads(3),  # the user's torch.set_num_threads
        lambda monkeypatch: torch.set_num_threads(2),  # ... even at PyTorch's own count, which it cannot tell apart
        lambda monkeypatch: set_cpu_threads(2),  # the command line's torch_num_threads, even at PyTorch's own count
    ],
    ids=[
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "torch.set_num_threads",
        "set_num_threads_at_default",
        "torch_num_threads",
    ],
)
def test_a_chosen_thread_count_is_kept(make_module, monkeypatch, choose):
    monkeypatch.setattr(cpu_threads, "SMALL_MODEL_PARAMETERS", 0)  # the tiny model counts as large
    monkeypatch.setattr(cpu_threads, "cores_busy_elsewhere", lambda: 1.0)  # a loaded machine: the default is 1
    choose(monkeypatch)
    chosen = torch.get_num_threads()
    assert apply_default_cpu_threads(CPU, make_module().policy, processes=1) is None
    assert torch.get_num_threads() == chosen


@pytest.mark.usefixtures("torch_default_two")
def test_only_a_fit_on_cpu_is_changed_and_the_count_is_never_raised(make_module, monkeypatch):
    policy = make_module().policy
    assert apply_default_cpu_threads(torch.device("cuda"), policy, processes=1) is None
    assert torch.get_num_threads() == 2
    monkeypatch.setattr(cpu_threads, "SMALL_MODEL_PARAMETERS", 0)  # the tiny model counts as large
    monkeypatch.setattr(cpu_threads.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert apply_default_cpu_threads(CPU, policy, processes=1) is None  # the default, 8, would raise it
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("torch_default_two")
def test_cores_that_other_processes_keep_busy_are_left_to_them(make_module, monkeypatch):
    monkeypatch.setattr(cpu_threads, "SMALL_MODEL_PARAMETERS", 0)  # the tiny model counts as large
    monkeypatch.setattr(cpu_threads.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    policy = make_module().policy
    assert apply_default_cpu_threads(CPU, policy, processes=1) is None  # idle: PyTorch's 2 threads stay
    monkeypatch.setattr(cpu_threads, "cores_busy_elsewhere", lambda: 1.0)
    said = []
    monkeypatch.setattr(cpu_threads, "rank_zero_info", said.append)
    assert apply_default_cpu_threads(CPU, policy, processes=1) == 1
    assert torch.get_num_threads() == 1
    assert "other processes keep 1.0 of 2 cores busy" in said[0]
    assert cpu_threads.threads_chosen() is None  # the package's own call is not a choice
