"""Fixtures of the 2-process tests (gloo on CPU).

Starting a rank costs ~10 s of imports, so one launch per strategy runs every scenario of
:mod:`tests.distributed.worker` and the tests read what it wrote. A launch that fails or hangs (past its timeout)
fails every test that uses it, with the ranks' logs in the message; no worker survives it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed.builders import build_module, perturb_adapter
from tests.distributed.equivalence_cases import EQUIVALENCE_CASES, equivalence_case
from tests.distributed.launch import run_ranks
from tests.distributed.ranks import logged

DDP_SCENARIOS = ["equivalence", "fit", "agents", "logged"]
FSDP_SCENARIOS = ["equivalence", "fit", "resume-full", "uneven", "bf16", "tp-refused", "agents", "logged"]


def _launch(tmp_path_factory: pytest.TempPathFactory, strategy: str, scenarios: list[str], timeout: float) -> Path:
    workdir = tmp_path_factory.mktemp(strategy)
    run_ranks([strategy, str(workdir), *scenarios], workdir, timeout=timeout)
    return workdir


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The work directory of a 2-rank ``DDPStrategy`` run of :data:`DDP_SCENARIOS`."""
    return _launch(tmp_path_factory, "ddp", DDP_SCENARIOS, timeout=240)


@pytest.fixture(scope="session")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The work directory of a 2-rank FSDP2 (``ModelParallelStrategy``) run of :data:`FSDP_SCENARIOS`."""
    return _launch(tmp_path_factory, "fsdp", FSDP_SCENARIOS, timeout=300)


@pytest.fixture(scope="session")
def single_process() -> dict[str, dict]:
    """One process with the whole batch: per equivalence case, the adapter after the step and the logged metrics.

    ``"start"`` holds the (perturbed) adapter before the step.
    """
    start = build_module()
    perturb_adapter(start)
    results = {"start": {"adapter": _adapter(start)}}
    for case in EQUIVALENCE_CASES:
        module, trainer = equivalence_case("single", case)
        results[case] = {
            "adapter": _adapter(module),
            "metrics": {**logged(trainer), "entropy_coef_next": module.entropy_coef},
        }
    return results


def _adapter(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}
