"""math_answer: answer extraction, numeric comparison, references, and the optional math-verify fallback."""

from __future__ import annotations

import importlib
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_grpo.rewards import RewardError, RewardFunctions, answers_match, extract_answer, math_answer

# The package re-exports the function ``math_answer``, which hides the submodule of the same name as an attribute.
math_answer_module = importlib.import_module("lightning_grpo.rewards.math_answer")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # \boxed wins over everything, the last one counts, nested braces are kept whole
        (r"first \boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{x^{2}+\{1\}} #### 5 <answer>6</answer> 7", r"x^{2}+\{1\}"),
        (r"\fbox{ 12 }", "12"),
        # an unclosed \boxed is not an answer: fall through to the last number
        (r"so \boxed{42", "42"),
        # #### (GSM8K) before <answer>
        ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "72"),
        ("#### 1\nmore\n#### 2 apples\n", "2 apples"),
        ("<answer>3</answer> #### 9", "9"),
        # <answer> tags, the last pair, content stripped
        ("<think>5+5 is 10</think>\n<answer> 10 </answer>", "10"),
        ("<answer>1</answer><answer>\nfinal: 2\n</answer>", "final: 2"),
        # the last number, with thousands commas, signs, decimals and fractions
        ("I think 3, then 1,234,567.", "1,234,567"),
        ("x=-7.", "-7"),
        ("range 3-5", "5"),  # a hyphen between numbers is not a minus sign
        ("total $1,000.50.", "1,000.50"),
        ("about .5 cups", ".5"),
        ("three quarters: 3/4.", "3/4"),
        # nothing to find
        ("no digits here", None),
        (r"\boxed{ }", None),
        ("<answer></answer> 5", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("predicted", "reference", "expected"),
    [
        ("1,000", "1000", True),  # commas stripped
        ("$18.", "18", True),  # dollar sign and trailing period stripped
        (r"\$18", 18, True),
        ("72.0", 72, True),
        ("-3", "-3.0", True),
        ("-3", "3", False),
        ("3/4", "0.75", True),  # fractions
        (r"\frac{3}{4}", "3/4", True),
        (r"-\dfrac{3}{4}", "-0.75", True),
        ("x = 5", "5", True),
        (r"72 \text{ dollars}", "72", True),
        ("50%", "50", True),
        ("1000000.5", "1000000", True),  # relative difference 5e-7 < 1e-6
        ("1000002", "1000000", False),  # relative difference 2e-6 > 1e-6
        ("1.0000001", "1", True),  # relative difference 1e-7 < 1e-6
        ("1.00001", "1", False),  # relative difference 1e-5 > 1e-6
        ("0", "0.0", True),
        ("3/0", "3/0", True),  # not a number: compared as text
        ("B", "B", True),
        ("B", "C", False),
        (None, "5", False),
    ],
)
def test_answers_match(predicted, reference, expected, monkeypatch):
    monkeypatch.setattr(math_answer_module, "_math_verify", lambda: None)
    assert answers_match(predicted, reference) is expected


def test_math_answer_worked_example():
    completions = [
        r"so the total is \boxed{72}",  # reference extracted from '#### 72' -> 72 == 72 -> 1.0
        "<answer>72.00</answer>",  # numeric reference 72 -> 1.0
        "I get 71",  # last number 71 != 72 -> 0.0
        "no idea",  # no number at all -> 0.0
        "#### 5",  # reference None -> row skipped
        r"\boxed{\frac{1}{2}}",  # reference contains \boxed{0.5} -> 0.5 == 0.5 -> 1.0
    ]
    answers = ["She sold 48 + 24 = 72 clips.\n#### 72", 72, "72", "72", None, r"$\boxed{0.5}$"]
    assert math_answer([""] * 6, completions, answers) == [1.0, 1.0, 0.0, 0.0, None, 1.0]


def test_math_answer_through_reward_functions():
    scores = RewardFunctions([math_answer])(["q1", "q2"], ["#### 4", "#### 5"], {"answer": ["4", None]})
    assert scores.rewards[0].item() == 1.0 and math.isnan(scores.rewards[1].item())


def test_reference_with_marker_but_no_answer_is_an_error():
    with pytest.raises(ValueError, match=r"reference answer 'reasoning\\n#### ' has a '####' or '\\boxed' marker"):
        math_answer(["q"], ["1"], ["reasoning\n#### "])


def test_reference_of_wrong_type_is_an_error_naming_the_function():
    with pytest.raises(RewardError, match=r"'math_answer' raised TypeError: reference answers must be str, int, float"):
        RewardFunctions([math_answer])(["q"], ["1"], {"answer": [[1, 2]]})


def test_answer_column_of_wrong_length():
    with pytest.raises(ValueError, match=r"answer must have one entry per completion \(2\); got 1"):
        math_answer(["q", "q"], ["1", "2"], ["1"])


def test_symbolic_answers_without_math_verify_compare_as_text(monkeypatch):
    monkeypatch.setattr(math_answer_module, "_math_verify", lambda: None)
    assert answers_match(r"\sqrt{4}", "2") is False
    assert answers_match(r"\frac{\pi}{2}", r"\frac{\pi}{2}") is True
    assert math_answer(["q"], [r"\boxed{\sqrt{4}}"], ["2"]) == [0.0]


def test_symbolic_answers_with_math_verify():
    pytest.importorskip("math_verify")
    assert answers_match(r"\sqrt{4}", "2") is True
    assert answers_match(r"\frac{\pi}{2}", r"\pi/2") is True
    assert answers_match(r"\sqrt{2}", r"\sqrt{3}") is False
    assert math_answer(["q"], [r"the answer is \boxed{(x+1)^2}"], [r"\boxed{x^2+2x+1}"]) == [1.0]


@given(st.integers(-(10**9), 10**9))
def test_formatted_integers_round_trip(value):
    # GSM8K style: the reference '#### 1234567' and a completion writing '1,234,567.' agree
    assert math_answer([""], [f"The total is {value:,}."], [f"steps\n#### {value}"]) == [1.0]
