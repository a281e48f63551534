"""An agent written with the ``openai`` SDK, trained as it is: the calculator task of ``tool_calling.py`` over HTTP.

The agent below is ordinary ``openai`` code: it sends the row's question with the ``add`` tool's schema, runs every tool
call of ``message.tool_calls`` itself, sends the results back as ``tool`` messages and returns its reward (1.0 when a
tool result holds the row's sum). ``GRPOModule(agent=agent)`` runs it G times per row; with
``GRPOConfig(agents=AgentConfig(agent_transport="http"))`` (the default here) each run's client talks to a server on
127.0.0.1 with its trajectory's own key, exactly as an agent in another process would (``--transport in_process``: the
same calls answered in process, the same trajectories). Every token the policy sampled is trained on; the tool results
are context (docs/agents.md, "Your own agent code", "Agents over HTTP")::

    U: 3+4?
    A: <tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>
    T: 7
    A: 7

As in ``tool_calling.py`` (the same task, flags and warm-up: :mod:`lightning_grpo.testing.calculator`), the tiny
model (2 layers, 64 wide) is first warmed up for about 10 s on supervised traces of which a fifth call the tool, so it
calls ``add`` now and then; the rise after that is GRPO's.

    python -m examples.openai_agent                     # tiny model, CPU, offline (timings: docs/benchmarks.md)
    python -m examples.openai_agent --max-steps 10      # shorter

Needs the ``http`` extra (``openai``, ``starlette``, ``uvicorn``): ``pip install -e ".[http]"`` in a clone; with
``--transport in_process`` the ``openai`` extra is enough (``pip install -e ".[openai]"``). Checked first.

The last line reads ``openai_agent: mean reward A -> B over N iterations (S s)``: the mean reward of the first and the
last tenth of the iterations. **The claim, on every seed and CPU kernel level: B >= 0.7 and B - A >= 0.2** (the
``openai_agent`` case of ``python -m benchmarks.learning``; ``tests/examples`` asserts it for seed 2; figures over
10 seeds: docs/benchmarks.md, "Learning over 10 seeds").
"""

from __future__ import annotations

from lightning_grpo.cli.before_loading import announce_libraries

announce_libraries("examples/openai_agent.py")  # the imports below take seconds: never silent

import argparse
import json
from collections.abc import Sequence
from typing import Any

import torch
from lightning import Trainer
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule
from lightning_grpo.agents import ToolSet
from lightning_grpo.callbacks import GroupRewardStats
from lightning_grpo.config import AgentConfig
from lightning_grpo.demo import announce_warm_up, fit_and_report
from lightning_grpo.extras import exit_unless_installed
from lightning_grpo.testing.agents import add
from lightning_grpo.testing.calculator import add_task_flags, grpo_settings, warm_policy

#: The tool's schema in the OpenAI form (``{"type": "function", "function": {...}}``), from its docstring.
TOOLS = ToolSet([add]).schemas
#: What the agent can run: its own tools, by name.
FUNCTIONS = {"add": add}
#: Most model calls of one run: a tool call, then the answer.
MAX_CALLS = 2


def run_tool(name: str, arguments: str) -> str:
    """The result of one tool call as the ``tool`` message's content; a bad call gets an error text back."""
    try:
        return str(FUNCTIONS[name](**json.loads(arguments)))
    except (KeyError, TypeError, ValueError) as err:
        return f"error: {type(err).__name__}: {err}"


async def agent(client: Any, row: dict[str, Any]) -> float:
    """Answer the row's question with the ``add`` tool; 1.0 when a tool result is the row's sum.

    Args:
        client: An ``openai.AsyncOpenAI`` (given by the trainer; its own code would build one from
            ``OPENAI_BASE_URL``/``OPENAI_API_KEY``).
        row: The dataset row: ``prompt`` (the messages), ``a`` and ``b``.
    """
    messages: list[Any] = list(row["prompt"])
    for turn in range(MAX_CALLS):
        response = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls or turn == MAX_CALLS - 1:
            break
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    right = str(row["a"] + row["b"])
    return float(any(isinstance(m, dict) and m["role"] == "tool" and m["content"] == right for m in messages))


def build(options: argparse.Namespace) -> tuple[GRPOModule, PromptDataModule, Trainer]:
    """The module (``agent=agent``, its returned reward), the data module and the trainer."""
    announce_warm_up("openai_agent", "tool-call traces", options.warmup_steps)
    tokenizer, rows, model = warm_policy(options)  # tool_calling.py's task and warm-up
    module = GRPOModule(
        model,
        tokenizer=tokenizer,
        agent=agent,
        policy=PolicyConfig(lora_r=8, lora_alpha=16, dtype="float32"),
        grpo=GRPOConfig(**grpo_settings(options), agents=AgentConfig(agent_transport=options.transport)),
        optimizer=lambda params: torch.optim.AdamW(params, lr=options.lr),
        seed=options.seed,
    )
    data = PromptDataModule(rows, batch_size=options.batch_size, seed=options.seed)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=options.max_steps,
        log_every_n_steps=1,
        logger=CSVLogger(options.output_dir, name="openai_agent"),
        enable_checkpointing=False,
        enable_progress_bar=options.progress_bar,
        enable_model_summary=False,
        callbacks=[GroupRewardStats()],  # train/reward_mean, read by fit_and_report
    )
    return module, data, trainer


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags (the defaults are ``tool_calling.py``'s)."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_task_flags(parser)  # tool_calling.py's flags and defaults
    parser.add_argument("--transport", choices=("http", "in_process"), default="http", help="agent_transport")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> tuple[float, float, int]:
    """Warm up, train, and print the mean reward of the first and last tenth of the iterations."""
    options = parse(argv)
    exit_unless_installed("openai_agent", "http" if options.transport == "http" else "openai")  # before the warm-up
    return fit_and_report("openai_agent", lambda: build(options), seed=options.seed)


if __name__ == "__main__":
    main()
