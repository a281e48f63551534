"""The trajectory recorder of agent calls: message equality, token-exact continuation, branches, retries."""

from __future__ import annotations

import itertools

import pytest
import torch

from lightning_grpo.rollout.agent_client import TrajectoryRecorder, message_key, normalize_messages, same_messages
from lightning_grpo.rollout.agent_client.agent_types import AgentExecution, AgentStats
from lightning_grpo.rollout.agent_client.branch_rows import branch_rollout
from lightning_grpo.rollout.agent_client.openai_messages import normalize_tools
from lightning_grpo.rollout.chat import continuation_ids, render_messages

USER = {"role": "user", "content": "2+3?"}
ADD = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}}}


def _recorder(tokenizer, max_tokens=200):
    return TrajectoryRecorder(tokenizer, max_tokens, 500, itertools.count().__next__)


def _reply(text="hi"):
    return normalize_messages([{"role": "assistant", "content": text}])[0]


def _sample(tokenizer, text):
    """Token ids of a sampled turn: ``text`` and the end-of-turn token (ids that re-tokenising would not give)."""
    return [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]


# ---------------------------------------------------------------- message equality


def test_message_equality_reads_role_content_tool_calls_and_tool_call_id():
    call = {"id": "a", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    same = {"id": "b", "type": "function", "function": {"name": "add", "arguments": {"b": 2, "a": 1}}}
    other = {"id": "a", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 3}'}}
    one, two, three = normalize_messages([
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "assistant", "content": "", "tool_calls": [same]},  # None == "", ids ignored, JSON parsed
        {"role": "assistant", "content": "", "tool_calls": [other]},
    ])  # fmt: skip
    assert message_key(one) == message_key(two) and message_key(one) != message_key(three)
    tool = normalize_messages([{"role": "tool", "tool_call_id": "a", "content": "3"}])
    assert not same_messages(tool, normalize_messages([{"role": "tool", "tool_call_id": "b", "content": "3"}]))
    text_parts = [{"type": "text", "text": "2+"}, {"type": "text", "text": "3?"}]
    parts = normalize_messages([{"role": "user", "content": text_parts}])
    assert same_messages(parts, normalize_messages([USER]))
    assert not same_messages(normalize_messages([USER]), normalize_messages([{"role": "system", "content": "2+3?"}]))


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([{"role": "robot", "content": "x"}], r"messages\[0\] has role 'robot'; the allowed roles are system, user"),
        ([USER, {"role": "user", "content": [{"type": "image_url"}]}], r"messages\[1\] has content parts"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}],
         r"messages\[0\].tool_calls\[0\] \(f\) has arguments that are not valid JSON"),
        ([], "non-empty list"),
    ],
)  # fmt: skip
def test_bad_messages_are_named(messages, match):
    with pytest.raises(ValueError, match=match):
        normalize_messages(messages)


def test_a_tool_without_a_schema_is_refused():
    with pytest.raises(ValueError, match=r"tools\[1\] \(mul\) has no schema"):
        normalize_tools([ADD, {"type": "function", "function": {"name": "mul"}}])


# ---------------------------------------------------------------- continuation and branches


def test_an_extended_history_continues_the_exact_sampled_ids(tokenizer):
    recorder = _recorder(tokenizer)
    first = normalize_messages([USER])
    plan = recorder.plan(first, None)
    assert plan.context == tokenizer(render_messages(tokenizer, first), add_special_tokens=False)["input_ids"]
    odd = [tokenizer.convert_tokens_to_ids("h"), tokenizer.convert_tokens_to_ids("i"), tokenizer.eos_token_id]
    recorder.record(plan, odd, [-0.1, -0.2, -0.3], True, _reply("hi"))
    second = normalize_messages([USER, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "ok"}])
    plan2 = recorder.plan(second, None)
    inserted = continuation_ids(tokenizer, second[:2], second[2:])
    assert plan2.branch is recorder.branches[0] and plan2.context == [*plan.context, *odd, *inserted]
    recorder.record(plan2, _sample(tokenizer, "yo"), [-0.5] * 3, True, _reply("yo"))
    (branch,) = recorder.branches
    assert branch.tokens == [*odd, *inserted, *_sample(tokenizer, "yo")]
    assert branch.sampled == [1, 1, 1, *[0] * len(inserted), 1, 1, 1]
    assert branch.logprobs == [-0.1, -0.2, -0.3, *[0.0] * len(inserted), -0.5, -0.5, -0.5]


def test_an_edited_history_starts_a_new_branch_and_sampled_tokens_stay_in_one(tokenizer):
    recorder = _recorder(tokenizer)
    plan = recorder.plan(normalize_messages([USER]), None)
    recorder.record(plan, _sample(tokenizer, "hi"), [-1.0] * 3, True, _reply("hi"))
    edited = normalize_messages([USER, {"role": "assistant", "content": "HI"}, {"role": "user", "content": "ok"}])
    plan2 = recorder.plan(edited, None)
    assert plan2.branch is None and plan2.row != recorder.branches[0].row
    recorder.record(plan2, _sample(tokenizer, "yo"), [-2.0] * 3, True, _reply("yo"))
    assert len(recorder.branches) == 2
    assert [sum(b.sampled) for b in recorder.branches] == [3, 3]  # the edited turn is context in branch 2
    assert recorder.branches[1].prompt_ids == plan2.context


@pytest.mark.parametrize(
    "change",
    ["other tools", "an assistant message added", "cut without an end-of-turn token", "shortened"],
)
def test_these_calls_start_a_new_branch(tokenizer, change):
    recorder = _recorder(tokenizer)
    plan = recorder.plan(normalize_messages([USER]), None)
    ended = change != "cut without an end-of-turn token"
    recorder.record(plan, _sample(tokenizer, "hi")[: 3 if ended else 2], [-1.0] * 3, ended, _reply("hi"))
    messages = [USER, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "ok"}]
    tools = [ADD] if change == "other tools" else None
    if change == "an assistant message added":
        messages.append({"role": "assistant", "content": "more"})
    if change == "shortened":
        messages = [USER]
    assert recorder.plan(normalize_messages(messages), normalize_tools(tools)).branch is None


def test_a_call_never_delivered_leaves_no_trace_so_a_retry_does_not_fork(tokenizer):
    recorder = _recorder(tokenizer)
    messages = normalize_messages([USER])
    recorder.plan(messages, None)  # timed out: never recorded
    plan = recorder.plan(messages, None)  # the retry
    recorder.record(plan, _sample(tokenizer, "hi"), [-1.0] * 3, True, _reply("hi"))
    assert len(recorder.branches) == 1 and recorder.branches[0].calls == 1


def test_two_concurrent_calls_on_one_branch_do_not_interleave(tokenizer):
    recorder = _recorder(tokenizer)
    recorder.record(recorder.plan(normalize_messages([USER]), None), _sample(tokenizer, "hi"), [-1.0] * 3, True,
                    _reply("hi"))  # fmt: skip
    base = [USER, {"role": "assistant", "content": "hi"}]
    a = recorder.plan(normalize_messages([*base, {"role": "user", "content": "a"}]), None)
    b = recorder.plan(normalize_messages([*base, {"role": "user", "content": "b"}]), None)
    assert a.branch is b.branch is recorder.branches[0]
    recorder.record(a, _sample(tokenizer, "x"), [-1.0] * 2, True, _reply("x"))
    recorder.record(b, _sample(tokenizer, "y"), [-1.0] * 2, True, _reply("y"))  # re-planned: a new branch
    first, second = recorder.branches
    assert first.messages[-1]["content"] == "x" and first.sampled.count(1) == 3 + 2
    assert second.messages[-1]["content"] == "y" and second.sampled == [1, 1]


def test_the_budget_counts_inserted_tokens(tokenizer):
    recorder = _recorder(tokenizer, max_tokens=20)
    recorder.record(recorder.plan(normalize_messages([USER]), None), _sample(tokenizer, "hi"), [-1.0] * 3, True,
                    _reply("hi"))  # fmt: skip
    plan = recorder.plan(normalize_messages([USER, {"role": "assistant", "content": "hi"}, USER]), None)
    assert plan.budget == 20 - 3 - len(plan.inserted)


def test_a_message_the_template_cannot_render_is_named(tokenizer):
    recorder = _recorder(tokenizer)
    with pytest.raises(ValueError, match=r"cannot render messages\[1\] \(role 'system'\)"):
        recorder.plan(normalize_messages([USER, {"role": "system", "content": "late"}]), None)


def test_a_template_that_re_renders_the_history_differently_starts_a_new_branch(tokenizer):
    """E.g. a template that drops earlier turns' reasoning: the exact ids cannot be continued, so a new branch."""
    recorder = _recorder(tokenizer)
    recorder.record(recorder.plan(normalize_messages([USER]), None), _sample(tokenizer, "hi"), [-1.0] * 3, True,
                    _reply("hi"))  # fmt: skip
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "{{ message.content or '' }}", "{{ message.content if loop.last else '' }}"
    )  # earlier assistant contents vanish once later messages come
    plan = recorder.plan(normalize_messages([USER, {"role": "assistant", "content": "hi"}, USER]), None)
    assert plan.branch is None


# ---------------------------------------------------------------- kept-set margins


def _two_calls(tokenizer, margins):
    """A branch of two calls, the second continuing the first; ``margins`` of each call (``None``: none recorded)."""
    recorder = _recorder(tokenizer)
    plan = recorder.plan(normalize_messages([USER]), None)
    recorder.record(plan, _sample(tokenizer, "hi"), [-1.0] * 3, True, _reply("hi"), margins=margins[0])
    second = normalize_messages([USER, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "ok"}])
    plan2 = recorder.plan(second, None)
    recorder.record(plan2, _sample(tokenizer, "yo"), [-0.5] * 3, True, _reply("yo"), margins=margins[1])
    return recorder, plan2.inserted


def test_margins_follow_the_sampled_tokens_and_are_zero_on_context_and_padding(tokenizer):
    inf = float("inf")
    recorder, inserted = _two_calls(tokenizer, [[0.5, 1.5, inf, 9.0], [2.0, 3.0, 4.0]])  # a margin past the cut: left
    (branch,) = recorder.branches
    assert branch.margins == [0.5, 1.5, inf, *[0.0] * len(inserted), 2.0, 3.0, 4.0]
    short = _recorder(tokenizer)
    short.record(short.plan(normalize_messages([USER]), None), _sample(tokenizer, "hi"), [-1.0] * 3, True, _reply(),
                 margins=[1.0] * 3)  # fmt: skip
    rows = [{"prompt": [USER]}, {"prompt": [USER]}]
    rollout = branch_rollout(tokenizer, rows, [AgentExecution(0, recorder), AgentExecution(1, short)], AgentStats())
    assert rollout.kept_margins.dtype == torch.float32 and rollout.kept_margins.shape == rollout.completion_ids.shape
    assert rollout.kept_margins[0].tolist() == branch.margins
    assert rollout.kept_margins[1].tolist() == [1.0] * 3 + [0.0] * (len(branch.tokens) - 3)  # padding: 0


def test_a_sampler_without_margins_gives_a_rollout_without_them(tokenizer):
    recorder, inserted = _two_calls(tokenizer, [None, None])
    assert recorder.branches[0].margins is None and inserted
    rollout = branch_rollout(tokenizer, [{"prompt": [USER]}], [AgentExecution(0, recorder)], AgentStats())
    assert rollout.kept_margins is None and rollout.logprobs is not None
