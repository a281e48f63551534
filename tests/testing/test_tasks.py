from __future__ import annotations

import pytest

from lightning_grpo.testing import ALPHABET, BUILTIN_TASKS, make_task


def test_builtin_tasks_are_read_only_and_named():
    assert {"addition", "successor"} <= set(BUILTIN_TASKS)
    with pytest.raises(TypeError):
        BUILTIN_TASKS["mine"] = lambda: []  # type: ignore[index]


def test_addition_records_are_correct_sums():
    records = make_task("addition", num_samples=50, max_operand=9, seed=3)
    assert len(records) == 50
    for row in records:
        a, b = row["prompt"].removesuffix("=").split("+")
        assert row["prompt"] == f"{a}+{b}="
        assert 0 <= int(a) <= 9 and 0 <= int(b) <= 9
        assert row["answer"] == str(int(a) + int(b))


def test_addition_respects_max_operand():
    operands = {
        int(x) for row in make_task("addition", num_samples=200, max_operand=3) for x in row["prompt"][:-1].split("+")
    }
    assert operands == {0, 1, 2, 3}


def test_successor_answers_one_digit():
    records = make_task("successor", num_samples=100, seed=1)
    for row in records:
        n = int(row["prompt"].removesuffix("+1="))
        assert 0 <= n <= 8
        assert row["answer"] == str(n + 1) and len(row["answer"]) == 1


@pytest.mark.parametrize("name", sorted(BUILTIN_TASKS))
def test_tasks_are_deterministic_per_seed(name):
    assert make_task(name, num_samples=20, seed=7) == make_task(name, num_samples=20, seed=7)
    assert make_task(name, num_samples=20, seed=7) != make_task(name, num_samples=20, seed=8)


@pytest.mark.parametrize("name", sorted(BUILTIN_TASKS))
def test_task_text_fits_the_tiny_tokenizer_alphabet(name):
    for row in make_task(name, num_samples=30):
        assert set(row["prompt"]) <= set(ALPHABET) and set(row["answer"]) <= set(ALPHABET)
        assert isinstance(row["answer"], str)


def test_unknown_task_lists_valid_names():
    with pytest.raises(ValueError, match=r"Unknown built-in task 'nope'; valid tasks: \[.*'addition'.*'successor'"):
        make_task("nope")


@pytest.mark.parametrize("kwargs", [{"num_samples": 0}, {"num_samples": 2.5}, {"max_operand": -1}])
def test_addition_checks_arguments(kwargs):
    with pytest.raises(ValueError, match="must be an integer >="):
        make_task("addition", **kwargs)
