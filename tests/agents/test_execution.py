"""Concurrent tool execution: results and errors as messages, timeouts for hung tools, concurrency."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from lightning_grpo.agents import ToolCall, ToolExecutor, ToolSet, execute_tool_calls, format_tool_output


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def divide(a: float, b: float) -> float:
    """Divide.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


def lookup(key: str) -> dict:
    """Look a key up.

    Args:
        key: The key.
    """
    return {"key": key, "values": [1, 2]}


_release = threading.Event()


def hang(x: int) -> int:
    """Never return (until the test releases it).

    Args:
        x: Ignored.
    """
    _release.wait(30)
    return x


def slow(x: int) -> int:
    """Sleep half a second.

    Args:
        x: Returned.
    """
    time.sleep(0.5)
    return x


async def aslow(x: int) -> int:
    """Sleep half a second, asynchronously.

    Args:
        x: Returned.
    """
    await asyncio.sleep(0.5)
    return x * 10


async def ahang(x: int) -> int:
    """Sleep for a long time, asynchronously.

    Args:
        x: Ignored.
    """
    await asyncio.sleep(30)
    return x


TOOLS = ToolSet([add, divide, lookup, hang, slow, aslow, ahang])


@pytest.fixture(autouse=True)
def release_hung_tools():
    """A fresh event per test for ``hang`` to wait on; set afterwards so abandoned threads finish."""
    global _release
    _release = threading.Event()
    yield
    _release.set()


@pytest.fixture
def executor():
    with ToolExecutor(TOOLS, timeout=2.0) as executor:
        yield executor


def test_results_in_order_with_statuses(executor):
    calls = [
        ToolCall("add", {"a": 2, "b": 3}),
        ToolCall("lookup", {"key": "k"}),
        ToolCall("divide", {"a": 1, "b": 0}),
        ToolCall("teleport", {}),
        ToolCall("add", {"a": 1}),
        ToolCall("", error="the tool call is not valid JSON (x)"),
    ]
    results = executor.run(calls)
    assert [result.call for result in results] == calls
    assert [result.status for result in results] == ["ok", "ok", "error", "unknown_tool", "error", "parse_error"]
    assert results[0].content == "5"
    assert results[1].content == '{"key": "k", "values": [1, 2]}'
    assert results[2].content == "Error: tool 'divide' raised ZeroDivisionError: division by zero"
    assert results[3].content.startswith("Error: unknown tool 'teleport'; the tools are 'add', 'divide'")
    assert "bad arguments for tool 'add'" in results[4].content and "'b'" in results[4].content
    assert results[5].content.startswith("Error: the tool call is not valid JSON")
    assert results[0].to_message() == {"role": "tool", "name": "add", "content": "5"}


def test_hung_sync_tool_times_out_without_blocking():
    with ToolExecutor(TOOLS, timeout=0.5) as executor:
        start = time.perf_counter()
        results = executor.run([ToolCall("hang", {"x": 1}), ToolCall("add", {"a": 1, "b": 1})])
        elapsed = time.perf_counter() - start
        assert results[0].status == "timeout"
        assert results[0].content == "Error: tool 'hang' timed out after 0.5 s."
        assert results[1].content == "2"
        assert elapsed < 0.5 + 0.4, elapsed
        assert executor.abandoned_threads == 1
        # the executor keeps working after abandoning a thread
        assert executor.run([ToolCall("add", {"a": 2, "b": 2})])[0].content == "4"


def test_hung_async_tool_times_out():
    with ToolExecutor(TOOLS, timeout=0.3) as executor:
        start = time.perf_counter()
        (result,) = executor.run([ToolCall("ahang", {"x": 1})])
        assert result.status == "timeout" and "timed out after 0.3 s" in result.content
        assert time.perf_counter() - start < 0.3 + 0.4


def test_async_tool(executor):
    (result,) = executor.run([ToolCall("aslow", {"x": 4})])
    assert result.status == "ok" and result.content == "40"


@pytest.mark.parametrize("pair", [("slow", "slow"), ("aslow", "aslow"), ("slow", "aslow")])
def test_calls_run_concurrently(executor, pair):
    executor.run([ToolCall("add", {"a": 0, "b": 0})])  # start the loop thread outside the timing
    start = time.perf_counter()
    results = executor.run([ToolCall(name, {"x": 1}) for name in pair])
    elapsed = time.perf_counter() - start
    assert all(result.status == "ok" for result in results)
    assert elapsed < 0.9, elapsed  # two 0.5 s calls in sequence would take >= 1.0 s


def test_max_workers_limits_sync_concurrency():
    with ToolExecutor(TOOLS, timeout=2.0, max_workers=1) as executor:
        start = time.perf_counter()
        executor.run([ToolCall("slow", {"x": 1}), ToolCall("slow", {"x": 2})])
        assert time.perf_counter() - start >= 1.0


def test_run_from_inside_a_running_event_loop():
    async def main():
        return execute_tool_calls([ToolCall("add", {"a": 1, "b": 2})], [add], timeout=1.0)

    assert asyncio.run(main())[0].content == "3"


@pytest.mark.parametrize(("timeout", "max_workers"), [(0, 1), (-1.0, 1), (True, 1), (1.0, 0)])
def test_bad_settings(timeout, max_workers):
    with pytest.raises(ValueError, match=r"timeout|max_workers"):
        ToolExecutor(TOOLS, timeout=timeout, max_workers=max_workers)


def test_long_outputs_are_truncated():
    with ToolExecutor(TOOLS, max_output_chars=20) as executor:
        long, short = executor.run([ToolCall("lookup", {"key": "k" * 50}), ToolCall("add", {"a": 1, "b": 2})])
    assert long.content == '{"key... [truncated]'  # 5 + 15 characters
    assert long.content.endswith("... [truncated]") and len(long.content) == 20
    assert short.content == "3"
    with pytest.raises(ValueError, match="max_output_chars"):
        ToolExecutor(TOOLS, max_output_chars=0)


def test_format_tool_output():
    assert format_tool_output("x") == "x"
    assert format_tool_output(1.5) == "1.5"
    assert format_tool_output(None) == "null"
    assert format_tool_output({1, 2}).startswith("{")  # not JSON: str()
