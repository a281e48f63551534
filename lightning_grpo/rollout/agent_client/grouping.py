"""Calls of one gathered batch that share their context, grouped so that the context is prefilled once.

The G runs of a row start with the same call: G identical contexts. A rollout backend's sampling call already takes
``R`` distinct prompts, each sampled ``num_generations`` times with its prefill shared (the ordinary rollout's first
turn), so a batch of calls is sampled as such a call: identical contexts that start a new branch become one prompt
with ``g`` rows. One ``g`` serves the whole call: the largest for which splitting every group into prompts of ``g``
rows, the last one topped up with padding rows (sampled and dropped), adds at most :data:`PADDING_SLACK` of the
batch's rows. ``g = 1`` (always allowed) samples every call as its own prompt, as without grouping. Calls that
continue a branch are never grouped (with the turn cache, each resumes from its own trajectory's kept cache).

With every group of the same size ``G`` (the first calls of ``R`` rows) the call is exactly the ordinary rollout's
first turn: the same prompts, in the same order, sampled with the same random draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PADDING", "PADDING_SLACK", "CallGroups", "group_calls"]

#: Share of a batch's rows that may be padding rows (sampled, then dropped) to let groups of uneven size share one g.
PADDING_SLACK = 0.125

#: The member index of a padding row.
PADDING = -1


@dataclass(frozen=True)
class CallGroups:
    """A batch of calls as one sampling call.

    Attributes:
        prompts: The batch index of each prompt's first call (its context is the prompt).
        members: ``len(prompts) * g`` batch indices, ``g`` consecutive per prompt (:data:`PADDING`: a padding row).
        g: Rows per prompt (the call's ``num_generations``).
    """

    prompts: list[int]
    members: list[int]
    g: int


def group_calls(contexts: Sequence[Sequence[int]], shared: Sequence[bool]) -> CallGroups:
    """The sampling call of a batch: calls with equal ``contexts`` that may be ``shared`` (they start a new branch)
    grouped in order of their first call, the others alone (see the module docstring).

    Example::

        >>> group_calls([[1, 2], [1, 2], [3], [3]], [True] * 4)
        CallGroups(prompts=[0, 2], members=[0, 1, 2, 3], g=2)
        >>> group_calls([[1, 2], [1, 2], [3]], [True, True, False]).g  # a group of 2 and one alone: no common g
        1
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    alone: list[list[int]] = []
    for index, (context, share) in enumerate(zip(contexts, shared, strict=True)):
        if share:
            groups.setdefault(tuple(context), []).append(index)
        else:
            alone.append([index])
    ordered = sorted([*groups.values(), *alone], key=lambda members: members[0])
    g = _rows_per_prompt([len(members) for members in ordered], len(contexts))
    prompts, rows = [], []
    for members in ordered:
        for start in range(0, len(members), g):
            chunk = members[start : start + g]
            prompts.append(chunk[0])
            rows.extend([*chunk, *[PADDING] * (g - len(chunk))])
    return CallGroups(prompts, rows, g)


def _rows_per_prompt(sizes: list[int], calls: int) -> int:
    """The largest ``g`` whose padding rows stay within :data:`PADDING_SLACK` of ``calls``."""
    allowed = calls + int(calls * PADDING_SLACK)
    return next(g for g in range(max(sizes), 0, -1) if sum(-(-size // g) * g for size in sizes) <= allowed)
