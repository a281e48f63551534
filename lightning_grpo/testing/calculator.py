"""The calculator task of the agent examples: one task definition and one warm-up for all three of them.

``examples/tool_calling.py`` (``add`` is a Python function), ``examples/mcp_tools.py`` (``add`` is served by an MCP
server) and ``examples/openai_agent.py`` (an ``openai`` SDK agent runs ``add`` itself) train the same tiny policy on
the same rows from the same warm-up with the same settings; only where the tool runs differs. Their flags and their
warm-up live here, so a change to the task lands in all three::

    parser = argparse.ArgumentParser()
    add_task_flags(parser)
    options = parser.parse_args([])
    tokenizer, rows, model = warm_policy(options)  # "a+b?" rows, the tool-name chat template, a warmed tiny model
    grpo = GRPOConfig(**grpo_settings(options), agents=AgentConfig(max_turns=2))

**Why the warm-up takes 800 steps** (:data:`WARMUP_STEPS`; it was 400). The warm-up stands for pretraining: how often
the policy calls its tool (a fifth of its traces, :data:`CALL_FRACTION`) and how reliably it copies the question's
numbers into the call. GRPO only learns from groups that hold both a right and a wrong answer. After 400 steps the tiny
model still miscopied arguments often, and on seed 7 (of 10) GRPO made a call with a wrong first argument its habit: its
entropy fell to 0.1 by step 10, most groups then held no right answer and nothing corrected it (a rise of 0.12; a group
of 16 rose 0.15, an adaptive entropy bonus collapsed to 0). After 800 steps the calls it makes carry the right numbers
(seed 7's first 3 steps: 16 of 16 calls right, against 7 of 14 after 400 steps), as a real model's would once
pretraining or SFT has shown it tool calls, so the calls GRPO reinforces are right ones: the rare call becomes a habit
from the same low start. A warm-up with more calls (half the traces) also fixed seed 7, but from a start so high that
the rise fell to 0.21. Figures over seeds: docs/benchmarks.md, "Learning over 10 seeds".
"""

from __future__ import annotations

import argparse
from typing import Any

from transformers import Qwen2ForCausalLM

from lightning_grpo.config import ObjectiveConfig, SamplingConfig
from lightning_grpo.testing.agents import add_records, tool_name_tokenizer, warm_up_tool_use
from lightning_grpo.testing.tiny_model import build_tiny_model
from lightning_grpo.testing.tokenizer import TinyTokenizer

__all__ = ["CALL_FRACTION", "ROWS", "WARMUP_STEPS", "add_task_flags", "grpo_settings", "warm_policy"]

#: Fraction of the warm-up's traces that call ``add`` with the row's numbers (the others guess): the policy's prior.
CALL_FRACTION = 0.2
#: Supervised warm-up steps (16 traces each): about 10 s on one CPU thread.
WARMUP_STEPS = 800
#: Rows ``"a+b?"`` in the dataset (one-digit ``a`` and ``b``, drawn with the run's seed).
ROWS = 64


def add_task_flags(parser: argparse.ArgumentParser) -> None:
    """Add the calculator task's flags (the same defaults for every example that trains on it)."""
    parser.add_argument("--max-steps", type=int, default=60, help="GRPO iterations")
    parser.add_argument("--num-generations", type=int, default=8, help="G, trajectories per prompt")
    parser.add_argument("--batch-size", type=int, default=4, help="prompts per iteration")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (1e-2 collapses)")
    parser.add_argument("--warmup-steps", type=int, default=WARMUP_STEPS, help="supervised steps on noisy traces")
    parser.add_argument(
        "--call-fraction", type=float, default=CALL_FRACTION, help="fraction of warm-up traces calling add"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs")
    parser.add_argument("--no-progress-bar", dest="progress_bar", action="store_false")


def warm_policy(options: argparse.Namespace) -> tuple[TinyTokenizer, list[dict[str, Any]], Qwen2ForCausalLM]:
    """The task's tokenizer (tools listed by name), its rows and the warmed tiny model, all from ``options.seed``.

    The warm-up is supervised: ``options.call_fraction`` of its traces call ``add`` with the row's numbers and copy
    the result, the others answer a random guess (:func:`~lightning_grpo.testing.agents.warm_up_tool_use`).
    """
    if not 0.0 <= options.call_fraction <= 1.0:
        raise ValueError(
            f"--call-fraction must be in [0, 1] (a fraction of the warm-up's traces), got {options.call_fraction}"
        )
    tokenizer, rows = tool_name_tokenizer(), add_records(ROWS, seed=options.seed)
    model = warm_up_tool_use(
        build_tiny_model(tokenizer, seed=options.seed),
        tokenizer,
        rows,
        call_fraction=options.call_fraction,
        steps=options.warmup_steps,
        seed=options.seed,
    )
    return tokenizer, rows, model


def grpo_settings(options: argparse.Namespace) -> dict[str, Any]:
    """The task's groups of ``GRPOConfig``, by name (an example adds its own ``agents``: ``max_turns``, a transport,
    a timeout)."""
    sampling = SamplingConfig(num_generations=options.num_generations, max_new_tokens=128, max_prompt_length=64)
    return {"sampling": sampling, "objective": ObjectiveConfig(kl_coef=0.0)}
