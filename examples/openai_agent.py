"""An agent written with the ``openai`` SDK, trained as it is: the calculator task of ``tool_calling.py`` over HTTP.

The agent below is ordinary ``openai`` code: it sends the row's question with the ``add`` tool's schema, runs every
tool call of ``message.tool_calls`` itself, sends the results back as ``tool`` messages and returns its reward (1.0
when a tool result holds the row's sum). ``GRPOModule(agent=agent)`` runs it G times per row; with
``GRPOConfig(agent_transport="http")`` (the default here) each run's client talks to a server on 127.0.0.1 with its
trajectory's own key, exactly as an agent in another process would (``--transport in_process``: the same calls
answered in process, the same trajectories). Every token the policy sampled is trained on; the tool results are
context (docs/agents.md, "Your own agent code", "Agents over HTTP")::

    U: 3+4?
    A: <tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>
    T: 7
    A: 7

As in ``tool_calling.py``, the tiny model (2 layers, 64 wide) is first warmed up for a few seconds on supervised
traces of which a fifth call the tool, so it calls ``add`` now and then; the rise after that is GRPO's.

    python -m examples.openai_agent                     # tiny model, CPU, offline (timings: docs/benchmarks.md)
    python -m examples.openai_agent --max-steps 10      # shorter

Needs the ``http`` extra (``openai``, ``starlette``, ``uvicorn``): ``pip install -e ".[http]"`` in a clone; with
``--transport in_process`` the ``openai`` extra is enough (``pip install -e ".[openai]"``). Checked first.

The last line reads ``openai_agent: mean reward A -> B over N steps (S s)``: the mean reward of the first and the
last tenth of the iterations (figures over seeds and CPU kernels: docs/benchmarks.md, "The openai SDK agent").
"""

from __future__ import annotations

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
from lightning_grpo.demo import fit_and_report
from lightning_grpo.extras import exit_unless_installed
from lightning_grpo.testing import build_tiny_model
from lightning_grpo.testing.agents import add, add_records, tool_name_tokenizer, warm_up_tool_use

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
    tokenizer, rows = tool_name_tokenizer(), add_records(64, seed=options.seed)
    model = warm_up_tool_use(  # supervised: 20% of the traces call add, the others guess; a few seconds
        build_tiny_model(tokenizer, seed=options.seed), tokenizer, rows, call_fraction=options.call_fraction,
        steps=options.warmup_steps, seed=options.seed,
    )  # fmt: skip
    module = GRPOModule(
        model, tokenizer=tokenizer, agent=agent,
        policy=PolicyConfig(lora_r=8, lora_alpha=16, dtype="float32"),
        grpo=GRPOConfig(
            num_generations=options.num_generations, max_new_tokens=128, max_prompt_length=64, kl_coef=0.0,
            agent_transport=options.transport,
        ),
        optimizer=lambda params: torch.optim.AdamW(params, lr=options.lr),
        seed=options.seed,
    )  # fmt: skip
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
    parser.add_argument("--max-steps", type=int, default=60, help="GRPO iterations")
    parser.add_argument("--num-generations", type=int, default=8, help="G, agent runs per prompt")
    parser.add_argument("--batch-size", type=int, default=4, help="prompts per iteration")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--warmup-steps", type=int, default=400, help="supervised steps on noisy traces")
    parser.add_argument("--call-fraction", type=float, default=0.2, help="fraction of warm-up traces calling add")
    parser.add_argument("--transport", choices=("http", "in_process"), default="http", help="agent_transport")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs")
    parser.add_argument("--no-progress-bar", dest="progress_bar", action="store_false")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> tuple[float, float, int]:
    """Warm up, train, and print the mean reward of the first and last tenth of the iterations."""
    options = parse(argv)
    exit_unless_installed("openai_agent", "http" if options.transport == "http" else "openai")  # before the warm-up
    return fit_and_report("openai_agent", lambda: build(options), seed=options.seed)


if __name__ == "__main__":
    main()
