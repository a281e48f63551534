"""Outcome vs process supervision on a two-turn task where credit matters (``grpo`` vs ``grpo_process``).

The task (:class:`EchoEnv`): the policy names a letter, the environment answers "again", the policy names a letter
once more. Turn 1 earns 1 when its letter is one of four "lucky" letters the environment draws at random per episode
and never shows (a coin flip whatever the policy does: the noisy reward of an earlier turn); turn 2 earns 1 when it
repeats turn 1's letter, so the second turn must use what the first produced. The episode's reward is the sum (0 to
2). The tiny model is first warmed up on games whose two letters are drawn uniformly and independently from 8, so
turn 2 repeats turn 1 about an eighth of the time. Only turn 2 can be learned; with outcome supervision its tokens
are credited with turn 1's coin flip too.

Both arms train copies of the same warm model on the same prompts with the same settings and reward function (the
episode sum, which is also what is measured); the only difference is the estimator:

* ``outcome``: ``advantage_estimator="grpo"``: every policy token of a trajectory gets its episode's advantage;
* ``process``: ``advantage_estimator="grpo_process"``: each turn's reward is a step ending at that turn's last token
  (DeepSeekMath §4.1.3), so turn 2's tokens are credited with turn 2's reward only.

See docs/benchmarks.md ("Process supervision")::

    OMP_NUM_THREADS=1 python -m benchmarks.process_supervision --seed 0
    python -m benchmarks.learning --cases process_supervision --seeds 0 1 2 --capabilities native avx2 default --jobs 1
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import warnings
from typing import Any

import lightning as L
import torch
from lightning.pytorch import Callback
from transformers import PreTrainedTokenizerBase

from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig, PromptDataModule
from lightning_grpo.agents import EnvStep
from lightning_grpo.config import AdvantageConfig, AgentConfig, ObjectiveConfig, SamplingConfig
from lightning_grpo.rollout.chat import continuation_ids, render_messages
from lightning_grpo.testing import build_tiny_model, build_tiny_tokenizer
from lightning_grpo.testing.agents import warm_up_on_traces

__all__ = ["EchoEnv", "compare_arms", "main", "run_arm"]

LETTERS = "abcdefgh"
PROMPT = [{"role": "user", "content": "pick"}]


class EchoEnv:
    """Two turns: a letter (1 if it is one of 4 hidden lucky letters of 8), then the same letter (1 if repeated).

    The lucky letters come from :attr:`rng`, which :func:`run_arm` seeds: both arms see the same draws in order.
    """

    rng = random.Random(0)

    def __init__(self, row: dict[str, Any]) -> None:
        self.first: str | None = None
        self.lucky = set(self.rng.sample(LETTERS, len(LETTERS) // 2))

    def reset(self) -> None:
        """No first observation: the prompt is the task."""
        return None

    def step(self, message: dict[str, Any]) -> EnvStep:
        """Judge one turn: the first is lucky or not, the second must repeat the first."""
        text = (message.get("content") or "").strip()
        if self.first is None:
            self.first = text
            return EnvStep(observation="again", reward=float(text in self.lucky))
        return EnvStep(reward=float(text == self.first and len(text) == 1), done=True)


def episode_reward(env_reward: list[float | None], **_: Any) -> list[float]:
    """The sum of the turn rewards (``env_reward``); 0 for a game cut before its first turn was judged."""
    return [0.0 if value is None else float(value) for value in env_reward]


def warm_up_game(tokenizer: PreTrainedTokenizerBase, rng: random.Random) -> tuple[list[int], list[int]]:
    """Token ids and labels of one game with two uniform, independent letters, laid out as the rollout lays it out."""
    history = list(PROMPT)
    ids = tokenizer(render_messages(tokenizer, history), add_special_tokens=False)["input_ids"]
    labels = [-100] * len(ids)
    for turn in range(2):
        letter = rng.choice(LETTERS)
        sampled = [*tokenizer(letter, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        ids, labels = ids + sampled, labels + sampled
        history.append({"role": "assistant", "content": letter})
        if turn == 0:
            inserted = continuation_ids(tokenizer, history, [{"role": "user", "content": "again"}])
            ids, labels = ids + inserted, labels + [-100] * len(inserted)
            history.append({"role": "user", "content": "again"})
    return ids, labels


class Curve(Callback):
    """Per step: the mean episode reward, the mean reward of each turn, and the mean advantage of turn-2 tokens."""

    def __init__(self) -> None:
        self.episode: list[float] = []
        self.turns: list[list[float]] = [[], []]
        self.turn2_advantage: list[float] = []

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        rollout, advantages = outputs["rollout"], outputs["advantages"]
        self.episode.append(float(outputs["rewards"].rewards.mean()))
        for k in range(2):
            values = [r[k] or 0.0 if len(r) > k else 0.0 for r in rollout.turns.turn_rewards]
            self.turns[k].append(sum(values) / len(values))
        if advantages.dim() == 1:  # outcome: one advantage per trajectory
            advantages = advantages[:, None].expand(rollout.sampled_mask.shape)
        inserted_before = (1 - rollout.sampled_mask).cumsum(1) > 0
        second = (rollout.sampled_mask == 1) & inserted_before  # sampled after inserted tokens: turn 2
        self.turn2_advantage.append(float(advantages[second].mean()) if second.any() else 0.0)


def run_arm(model: Any, tokenizer: Any, estimator: str, seed: int, steps: int, lr: float) -> Curve:
    """Train one arm from ``model`` (copied) for ``steps`` iterations; its :class:`Curve`."""
    L.seed_everything(seed, verbose=False)
    EchoEnv.rng = random.Random(seed)
    curve = Curve()
    module = GRPOModule(
        copy.deepcopy(model),
        [episode_reward],
        tokenizer=tokenizer,
        environment_factory=EchoEnv,
        seed=seed,
        policy=PolicyConfig(lora_r=8, lora_alpha=16, dtype="float32"),
        grpo=GRPOConfig(
            sampling=SamplingConfig(num_generations=8, max_new_tokens=24, max_prompt_length=32, temperature=1.0),
            agents=AgentConfig(max_turns=2),
            objective=ObjectiveConfig(kl_coef=0.0),
            advantages=AdvantageConfig(advantage_estimator=estimator),
        ),
        optimizer=lambda params: torch.optim.AdamW(params, lr=lr),
    )
    rows = [{"prompt": PROMPT} for _ in range(64)]
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[curve],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, PromptDataModule(rows, batch_size=4, seed=seed))
    return curve


def compare_arms(seed: int, steps: int = 30, lr: float = 3e-3, warmup_steps: int = 150) -> dict[str, float]:
    """Warm up once, train both arms; mean rewards of the first and last ``steps // 3`` iterations of each.

    ``turn2_gain`` is what process supervision changes: the rate at which turn 2 repeats turn 1 over the last third,
    process minus outcome. Turn 1's reward is a coin flip in both arms.
    """
    tokenizer, rng = build_tiny_tokenizer(), random.Random(seed)
    model = warm_up_on_traces(
        build_tiny_model(tokenizer, seed=seed),
        tokenizer,
        lambda: warm_up_game(tokenizer, rng),
        steps=warmup_steps,
        seed=seed,
    )
    span = max(1, steps // 3)
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    figures = {}
    for arm, estimator in (("outcome", "grpo"), ("process", "grpo_process")):
        curve = run_arm(model, tokenizer, estimator, seed, steps, lr)
        figures[f"{arm}_episode_last"] = mean(curve.episode[-span:])
        figures[f"{arm}_turn2_first"] = mean(curve.turns[1][:span])
        figures[f"{arm}_turn2_last"] = mean(curve.turns[1][-span:])
        figures[f"{arm}_turn2_rise"] = figures[f"{arm}_turn2_last"] - figures[f"{arm}_turn2_first"]
        figures[f"{arm}_turn2_advantage_first"] = mean(curve.turn2_advantage[:span])
    figures["turn2_gain"] = figures["process_turn2_last"] - figures["outcome_turn2_last"]
    return figures


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run both arms for one seed and print their figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    figures = compare_arms(args.seed, args.steps, args.lr)
    print(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
