"""A user's own environment, written for TRL's ``GRPOTrainer(environment_factory=...)``, trained from YAML.

Nothing here imports lightning_grpo: this is the class a TRL user already has. Its public method ``add`` is the
policy's tool, ``reset`` receives the dataset row's columns, ``get_reward`` scores the trajectory (docs/agents.md,
"Coming from TRL environments"). ``fit.yaml`` beside this file names it by its import path::

    lightning-grpo fit --config examples/own_environment/fit.yaml    # from the repository root: about 2 minutes
"""

from __future__ import annotations


class Calculator:
    """One trajectory's calculator: the reward is 1.0 when one of its ``add`` calls returned the question's sum."""

    def __init__(self) -> None:
        self.expected: int | None = None
        self.results: list[int] = []

    def reset(self, a: int, b: int) -> None:
        """Start a trajectory on the row ``{"prompt": [...], "a": a, "b": b}`` (the prompt already asks ``"a+b?"``)."""
        self.expected, self.results = a + b, []

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.results.append(a + b)
        return a + b

    def get_reward(self) -> float:
        """1.0 when the policy used the calculator on the question's numbers (or on any pair with their sum)."""
        return float(self.expected in self.results)
