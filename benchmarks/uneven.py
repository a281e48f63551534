"""Scripted uneven completion lengths that both sides of a comparison produce (issue 55).

The lengths are drawn once per workload from a long-tailed distribution (lognormal, clipped to ``[low, high]``, seeded)
and forced on the model itself: :class:`ScriptedEOS` is a forward hook on the causal LM that, while a rollout is being
sampled, forbids EOS before a row's scripted length and makes EOS the only possible token at it. A hook on the model
(not a logits processor) reaches both our sampling and TRL's ``generate``, whose ``generation_kwargs`` cannot carry a
processor. Which row a forward's batch row is follows from the batch size and the decoding position alone (below), so
it works for ``generate``, our own decoding loop, a shared-prompt prefill, and ``drop_finished``.

A completion's length counts its tokens up to and including EOS (the loss mask of both sides).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["ScriptedEOS", "check_lengths", "draw_lengths", "find_causal_lm", "length_summary", "padding_share"]


def draw_lengths(n: int, low: int, high: int, median: float, sigma: float, seed: int) -> list[int]:
    """``n`` completion lengths, lognormal clipped to ``[low, high]``, the longest raised to ``high``.

    The longest draw is set to ``high`` so that the rollout's width is ``high`` (= ``max_new_tokens``) on every side
    and every layout, whatever the draw: padding is then measured against the same longest row everywhere.

    Args:
        n: Number of completions (prompts × G).
        low: Shortest length (at least 2: a completion ends with its EOS).
        high: Longest length (the workload's ``max_new_tokens``).
        median: Median of the lognormal before clipping (``exp(mu)``).
        sigma: Standard deviation of the lengths' logarithm (the tail's weight).
        seed: Seed of the draw (the same lengths on every run and every side).

    Raises:
        ValueError: ``n < 1``, ``low < 2``, ``low > high``, ``median <= 0`` or ``sigma < 0``.
    """
    if n < 1 or low < 2 or low > high or median <= 0 or sigma < 0:
        raise ValueError(
            f"need n >= 1, 2 <= low <= high, median > 0 and sigma >= 0; got n={n}, low={low}, high={high}, "
            f"median={median}, sigma={sigma}"
        )
    normal = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    lengths = (math.log(median) + sigma * normal).exp().round().clamp(low, high).long()
    lengths[int(lengths.argmax())] = high
    return lengths.tolist()


def padding_share(lengths: Sequence[int], width: int | None = None) -> float:
    """Share of the padded positions ``len(lengths) × width`` that are padding (``width``: the longest row)."""
    width = max(lengths) if width is None else width
    if width < max(lengths):
        raise ValueError(f"width={width} is shorter than the longest row ({max(lengths)})")
    return 1.0 - sum(lengths) / (len(lengths) * width)


def length_summary(lengths: Sequence[int], bins: Sequence[int] = (8, 16, 32, 64, 128, 256, 512)) -> dict[str, Any]:
    """Percentiles, mean, padding share and a histogram (counts of lengths up to each bin edge) of ``lengths``."""
    values = torch.tensor(sorted(lengths), dtype=torch.float64)
    pick = lambda q: int(values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))])  # noqa: E731
    edges = [b for b in bins if b < max(lengths)] + [max(lengths)]
    counts, previous = {}, 0
    for edge in edges:
        counts[f"<={edge}"] = sum(1 for length in lengths if previous < length <= edge)
        previous = edge
    return {
        "rows": len(lengths),
        "tokens": int(values.sum()),
        "mean": float(values.mean()),
        "min": int(values[0]),
        "p10": pick(0.1),
        "p50": pick(0.5),
        "p90": pick(0.9),
        "max": int(values[-1]),
        "padding_share": padding_share(lengths),
        "histogram": counts,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """One line of :func:`length_summary`."""
    hist = ", ".join(f"{edge}: {count}" for edge, count in summary["histogram"].items())
    return (
        f"{summary['rows']} completions, {summary['tokens']} tokens: mean {summary['mean']:.1f}, min {summary['min']}, "
        f"p10 {summary['p10']}, p50 {summary['p50']}, p90 {summary['p90']}, max {summary['max']}; padding "
        f"{summary['padding_share']:.1%} of rows x longest; histogram {hist}"
    )


def check_lengths(side: str, produced: Sequence[Sequence[int]], scripted: Sequence[int]) -> None:
    """Refuse a side whose rollouts do not have exactly the scripted lengths (as a multiset, every rollout).

    Raises:
        RuntimeError: No rollout was recorded, or one differs (the message shows the first difference).
    """
    if not produced:
        raise RuntimeError(f"the {side!r} side recorded no completion lengths: the scripted lengths cannot be checked")
    for index, lengths in enumerate(produced):
        if sorted(lengths) != sorted(scripted):
            raise RuntimeError(
                f"the {side!r} side's rollout {index} has completion lengths {sorted(lengths)}, not the scripted "
                f"{sorted(scripted)}: the EOS hook did not hold, and the comparison would be worthless"
            )


def find_causal_lm(model: nn.Module) -> nn.Module:
    """The Hugging Face causal LM inside ``model`` (a PEFT wrapper's base model, or ``model`` itself)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not hasattr(base, "get_output_embeddings"):
        raise TypeError(f"{type(base).__name__} is not a Hugging Face causal LM: the EOS hook cannot be attached")
    return base


class ScriptedEOS:
    """Forward hooks that make the sampled completions end exactly at the scripted lengths.

    Row ``i`` of a rollout (prompts × G, G consecutive per prompt, as both sides order them) ends with EOS as its
    ``lengths[i]``-th token. At a forward deciding completion token ``t`` (``t`` = positions in the cache + positions
    fed − prompt length; a shared-prompt prefix gives ``t < 0`` and is left alone) with ``n`` rows in the batch, the
    rows are: all of them in order (``n = len(lengths)``), or the rows not finished yet in order (``drop_finished``:
    rows with ``lengths[i] > t``), or, while no row may end yet, any rows (a prefill once per prompt). Anything else
    raises. Only forwards while :attr:`active` returns true are touched (the log-prob and update passes are not).

    Args:
        lengths: The scripted length of each row.
        prompt_length: Tokens of every prompt (prompts are not padded).
        eos_token_id: The token that ends a completion.
        active: Whether a rollout is being sampled now (default: inside :meth:`sampling`).
    """

    def __init__(
        self, lengths: Sequence[int], prompt_length: int, eos_token_id: int, active: Callable[[], bool] | None = None
    ) -> None:
        self.lengths = torch.tensor(list(lengths), dtype=torch.long)
        self.prompt_length, self.eos = prompt_length, eos_token_id
        self._sampling = False
        self.active = active or (lambda: self._sampling)
        self._t: int | None = None
        self.handles: list[Any] = []
        self.forced = 0  # rows ended by the hook (for a check)

    def attach(self, model: nn.Module) -> ScriptedEOS:
        """Register the hooks on the causal LM inside ``model`` (once); returns ``self``."""
        if not self.handles:
            lm = find_causal_lm(model)
            self.handles = [
                lm.register_forward_pre_hook(self._before, with_kwargs=True),
                lm.register_forward_hook(self._after, with_kwargs=True),
            ]
        return self

    def detach(self) -> None:
        """Remove the hooks."""
        for handle in self.handles:
            handle.remove()
        self.handles = []

    @contextmanager
    def sampling(self) -> Iterator[None]:
        """Mark the forwards inside as sampling (the default :attr:`active`)."""
        self._sampling = True
        try:
            yield
        finally:
            self._sampling = False

    def _before(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        self._t = None
        if not self.active():
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        past = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
        self._t = past + int(ids.shape[1]) - self.prompt_length

    def _after(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        t = self._t
        if t is None or t < 0:
            return
        logits = output.logits[:, -1]  # (n, V): the next token of each row in the batch
        rows = self._rows(t, len(logits))
        if rows is None:  # no row may end yet: forbid EOS everywhere
            logits[:, self.eos] = float("-inf")
            return
        lengths = self.lengths[rows].to(logits.device)
        logits[lengths - 1 > t, self.eos] = float("-inf")
        end = lengths - 1 == t
        self.forced += int(end.sum())
        logits[end] = float("-inf")
        logits[end, self.eos] = 0.0

    def _rows(self, t: int, n: int) -> torch.Tensor | None:
        """The rollout rows of a batch of ``n`` rows deciding token ``t`` (``None``: no row may end yet)."""
        if n == len(self.lengths):
            return torch.arange(n)
        running = (self.lengths > t).nonzero().squeeze(-1)
        if n == len(running):
            return running
        if t < int(self.lengths.min()) - 1:
            return None
        raise RuntimeError(
            f"a forward with {n} rows decides completion token {t}: neither all {len(self.lengths)} rows nor the "
            f"{len(running)} not finished; the scripted lengths cannot be assigned to its rows"
        )
