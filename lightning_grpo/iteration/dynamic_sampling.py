"""DAPO's dynamic sampling: drop groups without learning signal and sample more prompts to fill the iteration.

Yu et al. 2025, "DAPO" §3.2 (https://arxiv.org/abs/2503.14476); verl's ``algorithm.filter_groups``. A group whose
valid rewards are all equal (all right, all wrong, or all skipped) has advantage 0 everywhere. With
``GRPOConfig(advantages=AdvantageConfig(dynamic_sampling=True))`` such groups are set aside and more prompts are drawn
from the data module's training order (:meth:`~lightning_grpo.data.PromptDataModule.extra_batches`) and sampled, round
after round, until every rank holds ``batch_size`` informative groups or ``max_sampling_rounds`` rounds were made. Every
rank makes the same number of rounds (the decision is all-reduced), so sharded generation never waits for a rank that
stopped. When rounds run out, the iteration trains on its informative groups topped up with set-aside ones (advantage 0)
so every rank keeps the configured batch shape. See ``docs/dynamic-sampling.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from lightning_grpo.algorithms.advantages import group_stats
from lightning_grpo.iteration.context import IterationContext
from lightning_grpo.rewards import RewardScores
from lightning_grpo.rollout import Rollout

__all__ = ["ExtraBatchSource", "check_datamodule", "dynamic_sample", "group_starts", "informative_groups"]


class ExtraBatchSource(Protocol):
    """A data module that can draw more training batches from its training order, as PromptDataModule does."""

    def extra_batches(self, num_batches: int = 1) -> list[Mapping[str, Sequence[Any]]]: ...


def check_datamodule(datamodule: object) -> None:
    """Refuse, at the start of fit, a data module that cannot supply extra prompts.

    Raises:
        ValueError: Naming what was given and what is needed.
    """
    if not callable(getattr(datamodule, "extra_batches", None)):
        got = "train_dataloaders without a data module" if datamodule is None else type(datamodule).__name__
        raise ValueError(
            f"dynamic_sampling needs PromptDataModule (or a datamodule with `extra_batches`), got {got}; pass a "
            "PromptDataModule to Trainer.fit(datamodule=...) or set advantages.dynamic_sampling to false"
        )


def informative_groups(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Which groups carry learning signal: their valid rewards are not all equal.

    Args:
        rewards: ``(N,)`` rewards, NaN where every reward function skipped the row.
        group_ids: ``(N,)`` group of each row; a group's rows are consecutive.

    Returns:
        ``(starts, informative)``: ``(B,)`` first row of each group, in order; ``(B,)`` bool.

    Example::

        >>> starts, keep = informative_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, float("nan"), 2.0]),
        ...                                   torch.tensor([0, 0, 1, 1, 2, 2]))
        >>> starts.tolist(), keep.tolist()  # group 2 has a single valid reward: no signal
        ([0, 2, 4], [False, True, False])
    """
    constant = group_stats(rewards, group_ids).constant  # (N,) per row, equal within a group
    starts = torch.nonzero(group_starts(group_ids)).flatten()
    return starts, ~constant[starts]


def group_starts(group_ids: Tensor) -> Tensor:
    """``(N,)`` bool: the rows that begin a group (a group's rows are consecutive).

    Example::

        >>> group_starts(torch.tensor([4, 4, 1, 1, 1, 7])).tolist()
        [True, False, True, False, False, True]
    """
    first = torch.ones(min(1, len(group_ids)), dtype=torch.bool, device=group_ids.device)
    return torch.cat([first, group_ids[1:] != group_ids[:-1]])


def dynamic_sample(
    context: IterationContext,
    rollout: Rollout,
    scores: RewardScores,
    *,
    generate: Callable[[Mapping[str, Sequence[Any]]], Rollout],
    score: Callable[[Rollout], RewardScores],
    source: ExtraBatchSource,
    max_rounds: int,
    pad_token_id: int,
) -> tuple[Rollout, RewardScores]:
    """Fill the iteration with informative groups, sampling more prompts while any rank lacks some; log the metrics.

    Args:
        context: The iteration's context (cross-rank decisions, timer, logging, warn-once).
        rollout: The iteration's first rollout (``B`` groups).
        scores: Its scores.
        generate: The module's (possibly overridden) ``generate``: samples the extra prompts.
        score: The module's (possibly overridden) ``score``: scores them.
        source: The data module that supplies the extra prompts.
        max_rounds: Most sampling rounds in the iteration, the first included
            (``GRPOConfig.advantages.max_sampling_rounds``).
        pad_token_id: Pads the rollouts of the rounds to one length.

    Returns:
        A rollout of ``B`` groups, informative ones first, and its scores.
    """
    parts = [(rollout, scores)]
    target = len(informative_groups(scores.rewards, rollout.group_ids)[0])
    while len(parts) < max_rounds and context.any_rank(_count(parts) < target):
        batches = source.extra_batches(1)
        if not context.all_ranks(bool(batches)):  # some rank's epoch has no full batch left
            break
        with context.timer("generate"):
            extra = generate(batches[0])
        with context.timer("score"):
            parts.append((extra, score(extra)))
    merged, merged_scores = _concat(parts, pad_token_id)
    starts, keep = informative_groups(merged_scores.rewards, merged.group_ids)
    order = torch.cat([torch.nonzero(keep).flatten(), torch.nonzero(~keep).flatten()])[:target]
    rows = _group_rows(merged.group_ids, starts, order)
    _log(context, max_rounds, (len(parts), len(starts), int((~keep).sum()), int(keep[order].sum()), target))
    return _renumbered(merged.select(rows)), _select_scores(merged_scores, rows)


def _count(parts: list[tuple[Rollout, RewardScores]]) -> int:
    return sum(int(informative_groups(s.rewards, r.group_ids)[1].sum()) for r, s in parts)


def _concat(parts: list[tuple[Rollout, RewardScores]], pad_token_id: int) -> tuple[Rollout, RewardScores]:
    rollout = Rollout.cat([r for r, _ in parts], pad_token_id=pad_token_id)
    scores = [s for _, s in parts]
    seconds: dict[str, float] = {}
    for s in scores:
        for name, value in s.seconds.items():
            seconds[name] = seconds.get(name, 0.0) + value
    per_function = {name: torch.cat([s.per_function[name] for s in scores]) for name in scores[0].per_function}
    return rollout, RewardScores(torch.cat([s.rewards for s in scores]), per_function, seconds)


def _group_rows(group_ids: Tensor, starts: Tensor, order: Tensor) -> Tensor:
    """Row indices of the groups ``order`` (indices into ``starts``), each group's rows in place."""
    ends = torch.cat([starts[1:], torch.tensor([len(group_ids)], device=starts.device)])
    return torch.cat([torch.arange(int(starts[g]), int(ends[g]), device=group_ids.device) for g in order.tolist()])


def _renumbered(rollout: Rollout) -> Rollout:
    """Group ids 0..B-1 in row order (the kept groups came from several rounds)."""
    ids = rollout.group_ids
    rollout.group_ids = group_starts(ids).to(ids.dtype).cumsum(0) - 1
    return rollout


def _select_scores(scores: RewardScores, rows: Tensor) -> RewardScores:
    rows = rows.to(scores.rewards.device)
    per_function = {name: values[rows] for name, values in scores.per_function.items()}
    return RewardScores(scores.rewards[rows], per_function, dict(scores.seconds))


def _log(context: IterationContext, max_rounds: int, counts: tuple[int, int, int, int, int]) -> None:
    """Global metrics (sums over ranks), and a warning the first time the rounds ran out.

    ``counts``: this rank's rounds, sampled groups, filtered groups, informative groups kept, and target.
    """
    rounds, *local = counts
    target = local[-1]
    totals = context.sum_across_ranks(torch.tensor(local, dtype=torch.float64, device=context.device))
    sampled_all, filtered_all, informative_all, target_all = totals
    values = {
        "train/filtered_groups_frac": filtered_all / sampled_all,
        "train/sampling_rounds": torch.tensor(float(rounds), device=context.device),
        "train/prompts_per_iteration": sampled_all,
        "train/informative_groups_frac": informative_all / target_all,
    }
    for name, value in values.items():
        context.log(name, value.float(), on_step=True, batch_size=target)
    if informative_all < target_all:
        context.warn_once(
            "dynamic_sampling",
            f"dynamic_sampling: the iteration at step {context.global_step} made max_sampling_rounds={max_rounds}"
            f" rounds (or ran out of prompts for this epoch) and found {int(informative_all)} informative groups of "
            f"{int(target_all)} needed; it trains on them plus groups without signal (advantage 0). Raise "
            "max_sampling_rounds, num_generations or temperature (train/informative_groups_frac tracks this).",
        )
