"""Learning tests: each agent example, at its defaults and one seed, clears the claims of its ``benchmarks.learning``
case (a mean reward over the last tenth of the iterations and a rise from the first tenth; docs/benchmarks.md,
"Learning over 10 seeds", has every seed). ``make test`` runs them natively and under ``ATEN_CPU_CAPABILITY=default``;
each seed here is one of the matrix's at both levels (``mcp_tools`` follows ``tool_calling`` to the digit)."""

from __future__ import annotations

import pytest

from tests.examples.learning_claims import assert_claims
from tests.examples.test_examples import load_example


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("case", "seed", "needs"),
    [("openai_agent", 2, ("openai", "starlette", "uvicorn")), ("mcp_tools", 1, ("mcp",)), ("multi_turn_env", 0, ())],
)
def test_the_example_learns_what_its_docs_claim(case, seed, needs, tmp_path):
    for extra in needs:  # the example's extra (it exits with the pip command without it)
        pytest.importorskip(extra)
    first, last, steps = load_example(case).main(
        ["--seed", str(seed), "--output-dir", str(tmp_path), "--no-progress-bar"]
    )
    assert steps > 0
    assert_claims(case, first, last)
