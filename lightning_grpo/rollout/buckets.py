"""Shape buckets of the compiled decode path (``GRPOConfig.sampling.decode``): a few shapes, each compiled once.

A compiled decode step is specialised to the shapes of its inputs: the number of rows sampled together and the length
of the static KV cache. Rollouts vary both (prompt lengths, rows left after dynamic sampling, agent turns still
running), so each call is rounded up to a *bucket*: rows to the next power of two (at most twice the rows, padding rows
are masked as finished from the start) and the cache length to the smallest length bucket that holds the longest
prompt plus the turn's ``max_new_tokens``. Each bucket gets one static cache, allocated on first use and reused for the
rest of the run, and one compiled graph.

The default length buckets are a single one: ``max_prompt_length + max_new_tokens`` rounded up to a multiple of
:data:`LENGTH_QUANTUM`. Multi-turn rollouts, whose later turns read the earlier ones, list longer
buckets (``decode_lengths: [512, 1024, 2048]``); a call longer than the longest bucket is sampled by the eager loop
(logged once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "CPU_PREFERS_COMPILED",
    "DECODE_PATHS",
    "LENGTH_QUANTUM",
    "MAX_ROWS_BUCKET",
    "DecodeBuckets",
    "DecodePath",
    "check_decode_lengths",
    "pick_decode_path",
]

#: ``GRPOConfig.sampling.decode``: ``"auto"`` picks per device (:func:`pick_decode_path`), ``"eager"`` is today's
#: sampling (``generate`` or our own loop), ``"compiled"`` the compiled decode step over a static KV cache.
DecodePath = Literal["auto", "eager", "compiled"]
DECODE_PATHS: tuple[str, ...] = get_args(DecodePath)

#: Whether ``decode: auto`` picks the compiled path on the CPU. The one place the CPU choice is written: measured
#: slower on 2026-11-28 (``benchmarks/compiled_decode.py``, 30M model: 0.81x the eager loop with ``multinomial``,
#: 0.97x with ``inverse_cdf``; docs/benchmarks.md, "Compiled decode"); flip it when a measurement says otherwise.
CPU_PREFERS_COMPILED = False

#: Default length buckets are multiples of this many positions.
LENGTH_QUANTUM = 64

#: Row buckets are powers of two up to this; more rows round up to a multiple of it.
MAX_ROWS_BUCKET = 1024


def pick_decode_path(decode: str, device_type: str) -> Literal["eager", "compiled"]:
    """The decode path ``decode`` means on a device of type ``device_type`` (``"cpu"``, ``"cuda"``, ...).

    ``"auto"``: on the CPU the compiled path if :data:`CPU_PREFERS_COMPILED`, else eager; elsewhere eager, today's
    default, until a GPU has measured the compiled path (docs/first-run.md says how to turn it on).

    Raises:
        ValueError: ``decode`` is not one of :data:`DECODE_PATHS`.
    """
    if decode not in DECODE_PATHS:
        raise ValueError(f"decode must be one of {list(DECODE_PATHS)}; got {decode!r}")
    if decode == "auto":
        return "compiled" if device_type == "cpu" and CPU_PREFERS_COMPILED else "eager"
    return "compiled" if decode == "compiled" else "eager"


def check_decode_lengths(lengths: Sequence[int] | None, max_prompt_length: int, max_new_tokens: int) -> None:
    """Refuse length buckets that cannot hold a first-turn sequence (``max_prompt_length + max_new_tokens``).

    Raises:
        ValueError: A bucket is not a positive integer, or is smaller than ``max_prompt_length + max_new_tokens``.
    """
    if lengths is None:
        return
    if not lengths or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in lengths):
        raise ValueError(f"decode_lengths must be a non-empty list of positive integers (or null); got {lengths!r}")
    need = max_prompt_length + max_new_tokens
    short = [n for n in lengths if n < need]
    if short:
        raise ValueError(
            f"decode_lengths {sorted(short)} cannot hold a prompt of max_prompt_length={max_prompt_length} tokens "
            f"plus max_new_tokens={max_new_tokens}: each length bucket must be at least {need} (longer buckets serve "
            "later agent turns); drop them or set decode_lengths to null (one bucket of that size)"
        )


def _round_up(value: int, quantum: int) -> int:
    return -(-value // quantum) * quantum


@dataclass(frozen=True)
class DecodeBuckets:
    """The shapes the compiled decode path rounds each sampling call up to.

    Attributes:
        lengths: Static KV cache lengths, ascending (prompt plus completion positions).

    Example::

        >>> buckets = DecodeBuckets.for_run(None, max_prompt_length=100, max_new_tokens=128)
        >>> buckets.lengths, buckets.rows(24), buckets.length(60, 128)
        ((256,), 32, 256)
        >>> buckets.length(300, 128) is None  # longer than every bucket: the eager loop samples it
        True
    """

    lengths: tuple[int, ...]

    @classmethod
    def for_run(cls, lengths: Sequence[int] | None, *, max_prompt_length: int, max_new_tokens: int) -> DecodeBuckets:
        """The buckets of a run: ``lengths`` checked (:func:`check_decode_lengths`), or the default single bucket."""
        check_decode_lengths(lengths, max_prompt_length, max_new_tokens)
        if lengths is None:
            lengths = [_round_up(max_prompt_length + max_new_tokens, LENGTH_QUANTUM)]
        return cls(tuple(sorted(set(lengths))))

    @staticmethod
    def rows(count: int) -> int:
        """Rows of the bucket of a call sampling ``count`` rows: the next power of two (a multiple of
        :data:`MAX_ROWS_BUCKET` past it)."""
        if count > MAX_ROWS_BUCKET:
            return _round_up(count, MAX_ROWS_BUCKET)
        return 1 << max(count - 1, 0).bit_length()

    def length(self, prompt_width: int, max_new_tokens: int) -> int | None:
        """The smallest length bucket holding ``prompt_width + max_new_tokens`` positions; ``None``: none does."""
        need = prompt_width + max_new_tokens
        return next((n for n in self.lengths if n >= need), None)
