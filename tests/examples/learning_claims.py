"""The examples' learning claims, read from ``benchmarks.learning.CASES``: the one place the tests, the docs and the
matrix (``python -m benchmarks.learning``) take them from."""

from __future__ import annotations

from benchmarks.learning import CASES


def assert_claims(case: str, first: float, last: float) -> None:
    """Assert that a run whose mean reward went ``first`` -> ``last`` clears every claim of ``CASES[case]``."""
    figures = {"first": first, "last": last, "rise": last - first}
    missed = {
        name: (round(figures[name], 3), floor) for name, floor in CASES[case].claims.items() if figures[name] < floor
    }
    assert not missed, f"{case}: {first:.3f} -> {last:.3f} misses (figure, claim): {missed}"
