"""Async reward functions, concurrent calls, timeouts and per-function seconds."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from lightning_grpo.rewards import RewardError, RewardFunctions

PROMPTS, COMPLETIONS = ["a", "b"], ["x", "yy"]


async def async_len(completions, **kwargs):
    await asyncio.sleep(0.01)
    return [float(len(c)) for c in completions]


def test_async_function_is_awaited():
    scores = RewardFunctions([async_len])(PROMPTS, COMPLETIONS)
    assert scores.rewards.tolist() == [1.0, 2.0]


def test_async_callable_object_and_partial_are_awaited():
    class Judge:
        async def __call__(self, completions, **kwargs):
            return [0.5] * len(completions)

    scores = RewardFunctions({"judge": Judge(), "length": async_len})(PROMPTS, COMPLETIONS)
    assert scores.per_function["judge"].tolist() == [0.5, 0.5]


def test_functions_of_a_step_run_concurrently():
    # Each function waits until the other has started: run one after the other, the first would wait for ever.
    barrier = threading.Barrier(2, timeout=5)

    def sync_a(completions, **kw):
        barrier.wait()
        return [1.0] * len(completions)

    async def async_b(completions, **kw):
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
        return [2.0] * len(completions)

    def sync_c(completions, **kw):
        time.sleep(0.3)
        return [0.0] * len(completions)

    def sync_d(completions, **kw):
        time.sleep(0.3)
        return [0.0] * len(completions)

    assert RewardFunctions([sync_a, async_b])(PROMPTS, COMPLETIONS).rewards.tolist() == [3.0, 3.0]
    start = time.perf_counter()
    scores = RewardFunctions([sync_c, sync_d])(PROMPTS, COMPLETIONS)
    assert time.perf_counter() - start < 0.55  # 0.6 s one after the other
    assert set(scores.seconds) == {"sync_c", "sync_d"} and min(scores.seconds.values()) >= 0.29


def test_timeout_names_the_function_for_sync_and_async():
    def slow(completions, **kw):
        time.sleep(1.0)
        return [0.0] * len(completions)

    async def slow_async(completions, **kw):
        await asyncio.sleep(5)

    for fn in (slow, slow_async):
        start = time.perf_counter()
        with pytest.raises(RewardError, match=rf"'{fn.__name__}' did not finish within its timeout of 0.2 s"):
            RewardFunctions([fn, async_len], timeout={fn.__name__: 0.2})(PROMPTS, COMPLETIONS)
        assert time.perf_counter() - start < 0.9


def test_global_timeout_applies_to_every_function_and_fast_ones_pass():
    reward_fns = RewardFunctions([async_len], timeout=5)
    assert reward_fns.timeouts == (5.0,)
    assert reward_fns(PROMPTS, COMPLETIONS).rewards.tolist() == [1.0, 2.0]


def test_exception_inside_async_function_is_wrapped_naming_it():
    async def broken(completions, **kw):
        raise KeyError("gone")

    with pytest.raises(RewardError, match="reward function 'broken' raised KeyError: 'gone'") as info:
        RewardFunctions([broken, async_len])(PROMPTS, COMPLETIONS)
    assert isinstance(info.value.__cause__, KeyError)


def test_timeout_error_raised_by_the_function_itself_is_not_a_timeout():
    def raises_timeout(completions, **kw):
        raise TimeoutError("upstream API timed out")

    with pytest.raises(RewardError, match="'raises_timeout' raised TimeoutError: upstream API timed out"):
        RewardFunctions([raises_timeout], timeout=30)(PROMPTS, COMPLETIONS)


def test_works_inside_a_running_event_loop():
    async def main():
        return RewardFunctions([async_len])(PROMPTS, COMPLETIONS)

    assert asyncio.run(main()).rewards.tolist() == [1.0, 2.0]


@pytest.mark.parametrize(
    ("timeout", "match"),
    [
        (0, r"timeout\['async_len'\] must be a finite number > 0.0 or None, got 0"),
        (float("inf"), r"timeout\['async_len'\] must be .*, got inf"),
        ("5", r"timeout\['async_len'\] must be .*, got '5' \(str\)"),
        ({"other": 1.0}, r"timeout names unknown reward\(s\) \['other'\]; the rewards are \['async_len'\]"),
    ],
)
def test_bad_timeouts_are_refused(timeout, match):
    with pytest.raises(ValueError, match=match):
        RewardFunctions([async_len], timeout=timeout)
