"""RewardFunctions: weighted combination, None handling, naming, keyword filtering, and every error it raises."""

from __future__ import annotations

import functools
import math
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lightning_grpo.rewards import (
    OverlongPenalty,
    RewardError,
    RewardFunctions,
    RewardScores,
    format_reward,
    math_answer,
)


def exact(prompts, completions, answer):
    """1.0 where the completion equals the answer; skips rows without an answer."""
    return [None if a is None else float(c == a) for c, a in zip(completions, answer, strict=True)]


def length(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def constant(value):
    def fn(prompts, completions, **kwargs):
        return [value] * len(completions)

    return fn


class ScoreByHand:
    def __call__(self, prompts, completions, **kwargs):
        return [0.0] * len(completions)


PROMPTS = ["1+1=", "2+2=", "3+3="]
COMPLETIONS = ["2", "5", "six"]
COLUMNS = {"answer": ["2", "4", None]}


# ---------------------------------------------------------------- worked examples


def test_weighted_sum_worked_example():
    reward_fns = RewardFunctions([exact, length], weights=[2.0, 0.5])
    scores = reward_fns(PROMPTS, COMPLETIONS, COLUMNS)
    # row 0: exact 1, length 1 -> 2*1 + 0.5*1 = 2.5
    # row 1: exact 0, length 1 -> 2*0 + 0.5*1 = 0.5
    # row 2: exact None (skipped), length 3 -> 0.5*3 = 1.5
    torch.testing.assert_close(scores.rewards, torch.tensor([2.5, 0.5, 1.5]))
    assert scores.rewards.dtype == torch.float32 and scores.rewards.shape == (3,)


def test_per_function_holds_raw_unweighted_values_with_nan_for_none():
    scores = RewardFunctions([exact, length], weights=[2.0, 0.5])(PROMPTS, COMPLETIONS, COLUMNS)
    assert list(scores.per_function) == ["exact", "length"]
    torch.testing.assert_close(scores.per_function["exact"], torch.tensor([1.0, 0.0, math.nan]), equal_nan=True)
    torch.testing.assert_close(scores.per_function["length"], torch.tensor([1.0, 1.0, 3.0]))
    assert all(t.dtype == torch.float32 for t in scores.per_function.values())


def test_row_skipped_by_every_function_is_nan():
    skip_third = functools.partial(exact)  # same skipping rule, registered under a second name
    scores = RewardFunctions({"a": exact, "b": skip_third}, weights=[1.0, 3.0])(PROMPTS, COMPLETIONS, COLUMNS)
    # row 0: 1*1 + 3*1 = 4; row 1: 0; row 2: both skipped -> NaN
    torch.testing.assert_close(scores.rewards, torch.tensor([4.0, 0.0, math.nan]), equal_nan=True)
    assert scores.valid.tolist() == [True, True, False]


def test_row_skipped_by_one_of_two_is_the_weighted_sum_of_the_other():
    scores = RewardFunctions([exact, constant(1.0)], weights=[1.0, -0.25])(PROMPTS, COMPLETIONS, COLUMNS)
    # row 2: exact skipped, constant 1 weighted -0.25 -> -0.25 (not NaN, not renormalised)
    assert scores.rewards[2].item() == pytest.approx(-0.25)


def test_zero_weight_still_counts_as_applied():
    scores = RewardFunctions([exact], weights=[0.0])(PROMPTS, COMPLETIONS, COLUMNS)
    # rows 0 and 1 applied with weight 0 -> 0.0; row 2 skipped -> NaN
    torch.testing.assert_close(scores.rewards, torch.tensor([0.0, 0.0, math.nan]), equal_nan=True)


def test_default_weights_are_one_and_mapping_weights_follow_names():
    assert RewardFunctions([exact, length]).weights == (1.0, 1.0)
    reward_fns = RewardFunctions([exact, length], weights={"length": 0.1, "exact": 3})
    assert reward_fns.weights == (3.0, 0.1)
    assert repr(reward_fns) == "RewardFunctions(exact=3, length=0.1)"
    assert len(reward_fns) == 2


def test_bools_count_as_zero_and_one_and_tensors_are_accepted():
    def as_bools(prompts, completions, **kwargs):
        return [c == "2" for c in completions]

    def as_tensor(prompts, completions, **kwargs):
        return torch.tensor([1.0, 2.0, 3.0])

    def as_scalar_tensors(prompts, completions, **kwargs):
        return [torch.tensor(0.5)] * len(completions)

    scores = RewardFunctions([as_bools, as_tensor, as_scalar_tensors])(PROMPTS, COMPLETIONS)
    # row 0: 1 + 1 + 0.5; row 1: 0 + 2 + 0.5; row 2: 0 + 3 + 0.5
    torch.testing.assert_close(scores.rewards, torch.tensor([2.5, 2.5, 3.5]))


def test_empty_batch_gives_empty_rewards():
    scores = RewardFunctions([length])([], [], {"answer": []})
    assert scores.rewards.shape == (0,) and scores.per_function["length"].shape == (0,)


def test_scores_are_a_frozen_dataclass():
    scores = RewardFunctions([length])(["p"], ["c"])
    assert isinstance(scores, RewardScores)
    with pytest.raises(AttributeError):
        scores.rewards = torch.zeros(1)  # type: ignore[misc]


@given(st.lists(st.tuples(st.none() | st.floats(-10, 10), st.none() | st.floats(-10, 10)), min_size=1, max_size=8))
def test_rewards_equal_weighted_nansum_property(rows):
    first, second = [r[0] for r in rows], [r[1] for r in rows]

    def f(prompts, completions, **kwargs):
        return first

    def g(prompts, completions, **kwargs):
        return second

    scores = RewardFunctions([f, g], weights=[0.5, 2.0])([""] * len(rows), [""] * len(rows))
    for got, (a, b) in zip(scores.rewards.tolist(), rows, strict=True):
        if a is None and b is None:
            assert math.isnan(got)
        else:
            want = (0.0 if a is None else 0.5 * a) + (0.0 if b is None else 2.0 * b)
            assert got == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_built_ins_pickle_for_spawned_processes():
    reward_fns = RewardFunctions([math_answer, format_reward, OverlongPenalty(100, 20)], weights=[1.0, 0.2, 0.5])
    clone = pickle.loads(pickle.dumps(reward_fns))
    args = (["q"], ["<think>x</think><answer>4</answer>"], {"answer": ["4"]})
    # math 1*1 + format 0.2*1 + overlong 0.5*(80 - 90)/20 = 1 + 0.2 - 0.25 = 0.95
    assert clone.names == reward_fns.names
    assert clone(*args, completion_lengths=[90]).rewards.item() == pytest.approx(0.95)


# ---------------------------------------------------------------- names


def test_names_from_name_attribute_dunder_name_and_snake_case_class():
    class Named:
        name = "my_reward"

        def __call__(self, prompts, completions, **kwargs):
            return [0.0] * len(completions)

    reward_fns = RewardFunctions([exact, Named(), ScoreByHand(), lambda p, c, **k: [0.0] * len(c)])
    assert reward_fns.names == ("exact", "my_reward", "score_by_hand", "lambda")


def test_partial_is_named_after_the_wrapped_function():
    assert RewardFunctions([functools.partial(exact)]).names == ("exact",)


def test_duplicate_names_get_suffixes():
    reward_fns = RewardFunctions([length, length, length])
    assert reward_fns.names == ("length", "length_1", "length_2")


def test_suffixes_skip_names_already_taken():
    def length_1(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    # the second "length" cannot become "length_1": that name is taken by the function of that name
    assert RewardFunctions([length, length_1, length]).names == ("length", "length_1", "length_2")


def test_mapping_keys_are_the_names():
    assert RewardFunctions({"correct": exact, "long": length}).names == ("correct", "long")


# ---------------------------------------------------------------- keyword filtering


def test_function_without_kwargs_receives_only_the_keywords_it_names():
    seen = {}

    def picky(prompts, completions, answer, *, level=0):
        seen.update(answer=answer, level=level)
        return [0.0] * len(completions)

    RewardFunctions([picky])(PROMPTS, COMPLETIONS, {**COLUMNS, "level": [1, 2, 3]}, completion_lengths=[1, 1, 3])
    assert seen == {"answer": ["2", "4", None], "level": [1, 2, 3]}


def test_function_with_kwargs_receives_every_column_and_extra():
    seen = {}

    def greedy(prompts, completions, **kwargs):
        seen.update(kwargs)
        return [0.0] * len(completions)

    RewardFunctions([greedy])(PROMPTS, COMPLETIONS, COLUMNS, completion_lengths=[1, 1, 3])
    assert seen == {"answer": ["2", "4", None], "completion_lengths": [1, 1, 3]}


def test_optional_keyword_absent_from_batch_keeps_its_default():
    def with_default(prompts, completions, answer=None):
        return [float(answer is None)] * len(completions)

    assert RewardFunctions([with_default])(["p"], ["c"]).rewards.tolist() == [1.0]


def test_prompts_and_completions_are_passed_positionally_under_any_parameter_names():
    def short_names(p, c, answer):
        return [float(x == a) for x, a in zip(c, answer, strict=True)]

    assert RewardFunctions([short_names])(["q"], ["2"], {"answer": ["2"]}).rewards.tolist() == [1.0]


def test_missing_required_keyword_names_the_function_and_the_keyword():
    with pytest.raises(
        RewardError,
        match=r"'exact' needs keyword\(s\) \['answer'\]; the batch offers \['completions', 'level', 'prompts'\]",
    ):
        RewardFunctions([exact])(["p"], ["c"], {"level": [1]})


# ---------------------------------------------------------------- construction errors


@pytest.mark.parametrize(
    ("functions", "weights", "error", "match"),
    [
        ([], None, ValueError, "at least one reward function; got none"),
        ({}, None, ValueError, "at least one reward function; got none"),
        (3, None, TypeError, "a reward function, a model id, a sequence of them or a mapping.*got int"),
        ([exact, 3], None, TypeError, r"functions\[1\] must be a callable reward function; got int 3"),
        ({"bad": None}, None, TypeError, "bad must be a callable reward function; got NoneType"),
        ([ScoreByHand], None, TypeError, r"the class ScoreByHand; pass an instance, e\.g\. ScoreByHand\(\.\.\.\)"),
        ({"": exact}, None, ValueError, r"non-empty strings; got \[''\]"),
        ([exact, length], [1.0], ValueError, r"one entry per reward function \(2: \['exact', 'length'\]\); got 1"),
        ([exact], [math.nan], ValueError, r"weights\['exact'\] must be a finite number, got nan"),
        ([exact], [math.inf], ValueError, r"weights\['exact'\] must be a finite number, got inf"),
        ([exact], ["1"], ValueError, r"weights\['exact'\] must be a finite number, got '1'"),
        ([exact], [True], ValueError, r"weights\['exact'\] must be a finite number, got True"),
        ([exact], 1.0, TypeError, "sequence of floats, a mapping from name to float, or None; got 1.0"),
        ([exact], {"exact": 1, "other": 2}, ValueError, r"missing \[\], unknown \['other'\]"),
        ([exact, length], {"exact": 1}, ValueError, r"per reward name \['exact', 'length'\]; missing \['length'\]"),
    ],
)
def test_construction_errors_name_what_was_seen_and_what_is_allowed(functions, weights, error, match):
    with pytest.raises(error, match=match):
        RewardFunctions(functions, weights)


def test_single_parameter_function_is_called_by_keyword():
    def one_arg(completions):
        return [float(len(c)) for c in completions]

    assert RewardFunctions(one_arg)(["p"], ["abc"]).rewards.tolist() == [3.0]


# ---------------------------------------------------------------- call errors: inputs


@pytest.mark.parametrize(
    ("prompts", "completions", "columns", "extra", "match"),
    [
        (["a"], ["x", "y"], {}, {}, "same length; got 1 and 2"),
        ("ab", ["x", "y"], {}, {}, "prompts must be a list with one entry per sample.*got str"),
        (
            ["a", "b"],
            ["x", "y"],
            {"answer": ["1"]},
            {},
            r"column 'answer' must have one value per completion \(2\); got 1",
        ),
        (["a", "b"], ["x", "y"], {"answer": "12"}, {}, "column 'answer' must be a sequence of 2 values; got str"),
        (
            ["a", "b"],
            ["x", "y"],
            {"prompts": ["a", "b"]},
            {},
            "'prompts' is passed to reward functions by RewardFunctions",
        ),
        (["a", "b"], ["x", "y"], {"level": [1, 2]}, {"level": [1, 2]}, r"\['level'\] are given both as columns"),
    ],
)
def test_misaligned_inputs_are_refused(prompts, completions, columns, extra, match):
    with pytest.raises(ValueError, match=match):
        RewardFunctions([length])(prompts, completions, columns, **extra)


# ---------------------------------------------------------------- call errors: functions


def test_function_that_raises_is_wrapped_naming_it_and_chained():
    def broken(prompts, completions, **kwargs):
        raise KeyError("no such thing")

    with pytest.raises(RewardError, match="reward function 'broken' raised KeyError: 'no such thing'") as info:
        RewardFunctions([exact, broken])(PROMPTS, COMPLETIONS, COLUMNS)
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize(
    ("output", "match"),
    [
        (1.0, r"'bad' must return a list of 3 values \(float or None\); got float"),
        (None, r"'bad' must return a list of 3 values \(float or None\); got NoneType"),
        ("1.0", r"'bad' must return a list of 3 values \(float or None\); got str"),
        ([1.0, 0.0], "'bad' must return one value per completion: expected 3, got 2"),
        (torch.zeros(4), "'bad' must return one value per completion: expected 3, got 4"),
    ],
)
def test_wrong_return_type_or_length(output, match):
    def bad(prompts, completions, **kwargs):
        return output

    with pytest.raises(RewardError, match=match):
        RewardFunctions([bad])(PROMPTS, COMPLETIONS, COLUMNS)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (math.nan, r"'bad' returned nan at row 1 \(prompt '2\+2=', completion '5'\); rewards must be finite"),
        (-math.inf, r"'bad' returned -inf at row 1 \(prompt '2\+2=', completion '5'\)"),
        (1e300, r"'bad' returned 1e\+300 at row 1"),  # finite in float64, inf in float32
        ("0.5", r"'bad' returned a non-numeric value '0.5' \(str\) at row 1 \(prompt '2\+2=', completion '5'\)"),
        ([1.0], r"'bad' returned a non-numeric value \[1.0\] \(list\) at row 1"),
    ],
)
def test_non_finite_or_non_numeric_value_names_function_row_and_excerpt(value, match):
    def bad(prompts, completions, **kwargs):
        return [1.0, value, 0.0]

    with pytest.raises(RewardError, match=match):
        RewardFunctions([bad])(PROMPTS, COMPLETIONS, COLUMNS)


def test_excerpts_are_cut_to_80_characters():
    def bad(prompts, completions, **kwargs):
        return [math.nan]

    long_prompt, long_completion = "p" * 200, "c" * 200
    with pytest.raises(RewardError) as info:
        RewardFunctions([bad])([long_prompt], [long_completion])
    message = str(info.value)
    assert f"prompt '{'p' * 80}...'" in message and f"completion '{'c' * 80}...'" in message
    assert "p" * 81 not in message
