"""PyTorch's CPU threads at fit start: a chosen count is kept, otherwise a CPU fit lowers it to one
that does not oversubscribe a shared machine (``lightning_grpo.iteration.cpu_threads``)."""

from __future__ import annotations

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
    yield
    torch.set_num_threads(before)


def test_the_default_is_one_thread_for_small_models_and_half_the_cores_for_large_ones():
    assert default_cpu_threads(num_parameters=100_000, cores=64, processes=1) == 1  # the tiny test models
    assert default_cpu_threads(num_parameters=500_000_000, cores=2, processes=1) == 1
    assert default_cpu_threads(num_parameters=500_000_000, cores=8, processes=1) == 4
    assert default_cpu_threads(num_parameters=500_000_000, cores=8, processes=2) == 2  # DDP on CPU: per process
    assert default_cpu_threads(num_parameters=500_000_000, cores=64, processes=1) == 8  # at most 8


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
        lambda monkeypatch: set_cpu_threads(2),  # the command line's torch_num_threads, even at PyTorch's own count
    ],
    ids=["OMP_NUM_THREADS", "MKL_NUM_THREADS", "torch.set_num_threads", "torch_num_threads"],
)
def test_a_chosen_thread_count_is_kept(make_module, monkeypatch, choose):
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
