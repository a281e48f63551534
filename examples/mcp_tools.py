"""MCP tools: GRPO teaches a policy to call a calculator served by an MCP server (see ``docs/agents.md``).

The task is that of ``examples/tool_calling.py`` (``"3+4?"``; reward 1.0 when the trajectory holds the tool's answer
for the row's numbers), but ``add`` is not a Python function of this process: it is a tool of a Model Context Protocol
server that this script starts itself, as a stdio subprocess (``python examples/mcp_tools.py --serve``), through the
``tools=`` entry ``{"command": [...]}``. At set-up the module lists the server's tools with their JSON schemas; each
call goes over the session (one per process, reused every step); the server is closed when ``fit`` ends::

    U: 3+4?
    A: <tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>
    T: 7          <- from the MCP server
    A: 7

Needs the ``mcp`` extra: ``pip install -e ".[mcp]"`` in a clone (checked first). The tiny model is warmed up
first as in ``tool_calling.py`` (the same task, flags and warm-up: :mod:`lightning_grpo.testing.calculator`), so it
calls the tool now and then; GRPO makes the right call a habit::

    python examples/mcp_tools.py                    # tiny model, CPU, offline: about a minute
    python examples/mcp_tools.py --max-steps 10     # shorter

The last line reads ``mcp_tools: mean reward A -> B over N iterations (S s)``: the mean reward of the first and the last
tenth of the iterations. The tool's result is the same text whether a Python function or the MCP server computes
it, so the curves equal those of ``examples/tool_calling.py`` seed for seed, and so does the claim: **B >= 0.7 and
B - A >= 0.2 on every seed** (the ``mcp_tools`` case of ``python -m benchmarks.learning``; ``tests/examples`` asserts
it for seed 1; figures in docs/benchmarks.md, "Learning over 10 seeds").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def serve() -> None:
    """Run the MCP server of this example on stdio: one tool, ``add``."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("calculator", log_level="ERROR")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    server.run("stdio")


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:  # the server subprocess: it needs neither torch nor us
    serve()
    sys.exit(0)

from lightning_grpo.cli.before_loading import announce_libraries

announce_libraries("examples/mcp_tools.py")  # the imports below take seconds: never silent

import torch
from lightning import Trainer
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule
from lightning_grpo.callbacks import AgentStats, GroupRewardStats
from lightning_grpo.config import AgentConfig
from lightning_grpo.demo import announce_warm_up, fit_and_report
from lightning_grpo.extras import exit_unless_installed
from lightning_grpo.testing.agents import called_add_right
from lightning_grpo.testing.calculator import add_task_flags, grpo_settings, warm_policy


def build(options: argparse.Namespace) -> tuple[GRPOModule, PromptDataModule, Trainer]:
    """The module (its one tool served by this script's MCP server), the data module and the trainer."""
    announce_warm_up("mcp_tools", "tool-call traces", options.warmup_steps)
    tokenizer, rows, model = warm_policy(options)  # tool_calling.py's task and warm-up
    server = {"command": [sys.executable, str(Path(__file__).resolve()), "--serve"]}  # started by the module
    module = GRPOModule(
        model,
        [called_add_right],
        tokenizer=tokenizer,
        tools=[server],
        policy=PolicyConfig(lora_r=8, lora_alpha=16, dtype="float32"),
        grpo=GRPOConfig(**grpo_settings(options), agents=AgentConfig(max_turns=2, tool_timeout=30.0)),
        optimizer=lambda params: torch.optim.AdamW(params, lr=options.lr),
        seed=options.seed,
    )
    data = PromptDataModule(rows, batch_size=options.batch_size, seed=options.seed)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=options.max_steps,
        log_every_n_steps=1,
        logger=CSVLogger(options.output_dir, name="mcp_tools"),
        enable_checkpointing=False,
        enable_progress_bar=options.progress_bar,
        enable_model_summary=False,
        callbacks=[GroupRewardStats(), AgentStats()],  # train/reward_mean (read below) and train/agent/*
    )
    return module, data, trainer


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags; the defaults run in about a minute on two CPU cores."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_task_flags(parser)  # tool_calling.py's flags and defaults
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> tuple[float, float, int]:
    """Warm up, train, and print the mean reward of the first and last tenth of the iterations."""
    options = parse(argv)
    exit_unless_installed("mcp_tools", "mcp")  # before the warm-up, not in the first rollout
    return fit_and_report("mcp_tools", lambda: build(options), seed=options.seed)


if __name__ == "__main__":
    main()
