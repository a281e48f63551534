"""The step's time against its compute bound: FLOPs of the real (unpadded) tokens at the measured matmul peak.

The useful work of one rollout of ``B`` prompts of ``P`` tokens and completions of lengths ``L_i`` (padding and
repeated prompts left out, so that every side and layout is held to the same bound):

* a **forward** over the real tokens: ``2 · N_body`` FLOPs per position (each prompt once: ``B · P + Σ L_i``
  positions), ``2 · N_head`` per completion position (only those need logits), and the attention products
  ``4 · layers · attention_dim · c`` for a position attending to ``c`` positions (causal: a prompt's ``P(P+1)/2``,
  completion token ``t`` of row ``i`` ``P + t + 1``);
* **generate** = one forward over those tokens (prefill + decode; sampling itself is not counted);
* each **log-prob pass** (``old_logprobs``, ``reference``) = one forward;
* **update** = ``2 ×`` a forward per update pass (the base is frozen under LoRA: its backward computes activation
  gradients only, as in the update MFU of :mod:`benchmarks.measure`; LoRA's own FLOPs are left out);
* **score** has no bound here (Python).

A phase's bound is its FLOPs over the matmul peak; ``bound / measured`` is the fraction of the peak the phase runs at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.models import ParamCounts

__all__ = ["format_bounds", "forward_flops", "phase_bounds", "side_bounds"]

PHASES = ("generate", "score", "old_logprobs", "reference", "update")


def forward_flops(counts: ParamCounts, prompts: int, prompt_length: int, lengths: Sequence[int]) -> float:
    """FLOPs of one forward over the real tokens (module docstring)."""
    completion = sum(lengths)
    positions = prompts * prompt_length + completion
    attended = prompts * prompt_length * (prompt_length + 1) / 2
    attended += sum(length * prompt_length + length * (length + 1) / 2 for length in lengths)
    attention = 4.0 * counts.layers * counts.attention_dim * attended
    return 2.0 * counts.body * positions + 2.0 * counts.head * completion + attention


def phase_bounds(
    counts: ParamCounts, prompts: int, prompt_length: int, lengths: Sequence[int], peak_flops: float, ppo_epochs: int
) -> dict[str, float]:
    """Seconds each phase needs at least at ``peak_flops`` (module docstring); ``step`` is their sum."""
    forward = forward_flops(counts, prompts, prompt_length, lengths) / peak_flops
    bounds = {"generate": forward, "score": 0.0, "old_logprobs": forward, "reference": forward}
    bounds["update"] = 2.0 * forward * ppo_epochs
    bounds["step"] = sum(bounds.values())
    return bounds


def side_bounds(side: dict[str, Any], bounds: dict[str, float]) -> dict[str, dict[str, float]]:
    """Each phase of a side's summary (phases that did not run dropped) beside its bound and the ratio."""
    measured = {**side["phase_seconds"], "step": side["step_seconds"]}
    rows = {}
    for phase in (*PHASES, "step"):
        if phase == "score" or (phase != "step" and measured[phase] <= 0):
            continue  # e.g. no old log-prob pass with one update per rollout, no reference pass with β = 0
        bound = bounds[phase] if phase != "step" else sum(bounds[p] for p in PHASES if measured[p] > 0)
        rows[phase] = {"seconds": measured[phase], "bound_seconds": bound, "fraction": bound / measured[phase]}
    return rows


def format_bounds(report: dict[str, Any]) -> str:
    """The split of every side's step against its compute bound, one line per phase."""
    peak = report["limits"]["matmul_flops_per_s"]
    lines = [f"compute bound (real tokens at the measured matmul peak, {peak / 1e9:.0f} GFLOP/s):"]
    for name, side in report["sides"].items():
        parts = [
            f"{phase} {row['seconds']:.3g} s vs {row['bound_seconds']:.3g} s ({row['fraction']:.1%})"
            for phase, row in side["bounds"].items()
        ]
        lines.append(f"  {name}: " + "; ".join(parts))
    return "\n".join(lines)
