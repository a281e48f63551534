"""Reward functions are called by keyword (TRL's convention); today's positional form still works."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from lightning_grpo.rewards import RewardError, RewardFunctions, completion_text, format_reward, math_answer

PROMPTS, COMPLETIONS = ["1+1=", "2+2="], ["2", "5"]
IDS = [[7, 2], [7, 5, 1]]


def test_trl_form_completions_and_kwargs_receives_every_keyword():
    seen: dict[str, Any] = {}

    def trl_style(completions, **kwargs):
        seen.update(kwargs, completions=completions)
        return [1.0] * len(completions)

    RewardFunctions([trl_style])(PROMPTS, COMPLETIONS, {"answer": ["2", "4"]}, completion_ids=IDS, trainer_state="s")
    assert seen == {
        "completions": COMPLETIONS, "prompts": PROMPTS, "answer": ["2", "4"], "completion_ids": IDS,
        "trainer_state": "s",
    }  # fmt: skip


def test_trl_form_with_named_column_gets_exactly_what_it_names():
    def exact(prompts, completions, answer, **kw):
        return [float(c == a) for c, a in zip(completions, answer, strict=True)]

    scores = RewardFunctions([exact])(PROMPTS, COMPLETIONS, {"answer": ["2", "4"]}, completion_ids=IDS)
    assert scores.rewards.tolist() == [1.0, 0.0]


def test_keyword_order_does_not_matter_and_completion_ids_can_be_read():
    def by_ids(completion_ids, completions):  # names matched, not positions
        return [float(len(ids)) for ids in completion_ids]

    assert RewardFunctions([by_ids])(PROMPTS, COMPLETIONS, completion_ids=IDS).rewards.tolist() == [2.0, 3.0]


def test_positional_form_under_other_names_still_works():
    seen = {}

    def old(p, c, **kw):
        seen.update(p=p, c=c, kw=kw)
        return [0.0] * len(c)

    RewardFunctions([old])(PROMPTS, COMPLETIONS, {"answer": ["2", "4"]})
    assert seen == {"p": PROMPTS, "c": COMPLETIONS, "kw": {"answer": ["2", "4"]}}


def test_positional_only_and_varargs_forms_get_prompts_and_completions_positionally():
    def pos_only(prompts, completions, /):
        return [float(len(c)) for c in completions]

    def star(*args, **kwargs):
        return [float(len(c)) for c in args[1]]

    assert RewardFunctions([pos_only, star])(PROMPTS, ["ab", "c"]).per_function["pos_only"].tolist() == [2.0, 1.0]
    assert RewardFunctions([star])(PROMPTS, ["ab", "c"]).rewards.tolist() == [2.0, 1.0]


def test_partial_and_callable_object_are_called_by_keyword():
    class Scorer:
        def __call__(self, *, completions, scale):
            return [s * len(c) for s, c in zip(scale, completions, strict=True)]

    partial = functools.partial(lambda completions, factor: [factor] * len(completions), factor=3.0)
    scores = RewardFunctions({"obj": Scorer(), "part": partial})(PROMPTS, COMPLETIONS, {"scale": [2.0, 2.0]})
    assert scores.per_function["obj"].tolist() == [2.0, 2.0]
    assert scores.per_function["part"].tolist() == [3.0, 3.0]


def test_named_keyword_the_batch_lacks_is_a_clear_error():
    def needs_answer(completions, answer):
        return [0.0] * len(completions)

    with pytest.raises(RewardError, match=r"'needs_answer' needs keyword\(s\) \['answer'\]; the batch offers"):
        RewardFunctions([needs_answer])(PROMPTS, COMPLETIONS, completion_ids=IDS)


def test_conversational_completions_reach_functions_and_builtins_read_the_last_assistant_turn():
    prompts = [[{"role": "user", "content": "2+2?"}]] * 2
    completions = [
        [{"role": "assistant", "content": "<think>x</think><answer>4</answer>"}],
        [
            {"role": "assistant", "content": None, "tool_calls": [{"name": "add"}]},
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "It is 5"},
        ],
    ]
    scores = RewardFunctions([math_answer, format_reward])(prompts, completions, {"answer": ["4", "4"]})
    assert scores.per_function["math_answer"].tolist() == [1.0, 0.0]
    assert scores.per_function["format_reward"].tolist() == [1.0, 0.0]
    assert completion_text(completions[1]) == "It is 5"


def test_error_excerpt_copes_with_message_lists():
    prompts = [[{"role": "user", "content": "hi"}]]
    with pytest.raises(
        RewardError, match=r"row 0 \(prompt '\[\.\.\. user: hi\]', completion '\[\.\.\. assistant: ok\]'"
    ):
        RewardFunctions([lambda prompts, completions: ["x"]])(prompts, [[{"role": "assistant", "content": "ok"}]])


def test_completion_text_refuses_other_types():
    with pytest.raises(TypeError, match="a completion must be a string or a list of chat messages"):
        completion_text(3)


@pytest.mark.parametrize(
    ("ids", "match"),
    [([[1]], r"completion_ids must be a list of 2 lists"), ("ab", r"completion_ids must be a list of 2 lists")],
)
def test_misaligned_completion_ids_are_refused(ids, match):
    with pytest.raises(ValueError, match=match):
        RewardFunctions([math_answer])(PROMPTS, COMPLETIONS, {"answer": ["2", "4"]}, completion_ids=ids)


def test_single_function_is_accepted_without_a_list():
    assert RewardFunctions(lambda completions, **kw: [1.0] * len(completions)).names == ("lambda",)
