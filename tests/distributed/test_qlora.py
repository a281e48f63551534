"""QLoRA under DDP: an NF4 base on 2 ranks (gloo) takes the same step as one process with the whole batch."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo import PolicyConfig
from tests.distributed.builders import build_module, perturb_adapter
from tests.distributed.equivalence_cases import qlora_case
from tests.distributed.launch import run_ranks

pytest.importorskip("bitsandbytes")


def _adapter(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}


@pytest.mark.distributed
def test_ddp_step_on_an_nf4_base_equals_the_single_process_step(tmp_path):
    run_ranks(["ddp", str(tmp_path), "qlora"], tmp_path, timeout=240)
    ranks = [torch.load(tmp_path / f"qlora-rank{r}.pt") for r in range(2)]
    start = build_module(policy=PolicyConfig(lora_r=4, lora_alpha=8, quantization="nf4", dtype="float32"))
    perturb_adapter(start)
    expected, before = _adapter(qlora_case("single")), _adapter(start)
    assert ranks[0].keys() == expected.keys()
    assert any(not torch.equal(expected[n], before[n]) for n in expected), "the step must move the adapter"
    for name, value in expected.items():
        torch.testing.assert_close(ranks[0][name], ranks[1][name], atol=0, rtol=0)  # DDP keeps the ranks equal
        torch.testing.assert_close(ranks[0][name], value, atol=1e-5, rtol=1e-4)
