"""Agents: tools (schemas, call parsing, concurrent execution with timeouts) and multi-turn environments.

Pure library code with no Lightning: the multi-turn rollout (:mod:`lightning_grpo.rollout`) calls it each turn.
See the API page ``docs/api/agents.md``.

Example::

    from lightning_grpo.agents import HermesToolCallParser, ToolExecutor, ToolSet

    tools = ToolSet([calc])
    turn = HermesToolCallParser().parse(generated_text)
    with ToolExecutor(tools, timeout=2.0) as executor:
        results = executor.run(turn.tool_calls)
    messages = [result.to_message() for result in results]  # {"role": "tool", "name": ..., "content": ...}
"""

from __future__ import annotations

from lightning_grpo.agents.environment import (
    Environment,
    EnvironmentEpisode,
    EnvironmentFactory,
    EnvironmentFailedError,
    EnvStep,
    Observation,
    aggregate_turn_rewards,
    normalize_observation,
    step_episodes,
)
from lightning_grpo.agents.execution import ToolExecutor, ToolResult, ToolStatus, execute_tool_calls, format_tool_output
from lightning_grpo.agents.message_checks import ALLOWED_ROLES, check_chat_template_supports_tools, validate_messages
from lightning_grpo.agents.parsing import (
    HermesToolCallParser,
    ParsedTurn,
    ResponseTemplateParser,
    ToolCall,
    ToolCallParser,
    assistant_message,
    call_from_json,
)
from lightning_grpo.agents.tools import Tool, ToolSet

__all__ = [
    "ALLOWED_ROLES",
    "EnvStep",
    "Environment",
    "EnvironmentEpisode",
    "EnvironmentFactory",
    "EnvironmentFailedError",
    "HermesToolCallParser",
    "Observation",
    "ParsedTurn",
    "ResponseTemplateParser",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolExecutor",
    "ToolResult",
    "ToolSet",
    "ToolStatus",
    "aggregate_turn_rewards",
    "assistant_message",
    "call_from_json",
    "check_chat_template_supports_tools",
    "execute_tool_calls",
    "format_tool_output",
    "normalize_observation",
    "step_episodes",
    "validate_messages",
]
