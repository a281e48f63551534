"""Agent settings of a conversational rollout: tools, parser, environment, ``max_turns``.

See ``docs/agents.md`` for what each setting does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from transformers import PreTrainedTokenizerBase

from lightning_grpo.agents import (
    EnvironmentFactory,
    HermesToolCallParser,
    Tool,
    ToolCallParser,
    ToolExecutor,
    ToolSet,
    check_chat_template_supports_tools,
)
from lightning_grpo.agents.mcp_tools import MCPToolServer, server_tools, split_tools
from lightning_grpo.agents.trl_environment import TRLEnvironments, trl_environments_of

__all__ = ["AgentSettings"]


@dataclass(frozen=True)
class AgentSettings:
    """How a conversational rollout runs its turns.

    Attributes:
        executor: Runs the policy's tool calls (concurrently, each with a timeout); ``None`` without tools.
        parser: Reads the content and tool calls of an assistant turn.
        environment_factory: Makes one environment per sample from its dataset row; ``None`` without one.
        max_turns: Most policy turns per trajectory; a trajectory that still calls a tool (or whose environment is
            not done) at the last turn is cut and flagged truncated.
        env_reward: How the per-turn environment rewards become the ``env_reward`` keyword of reward functions:
            their ``"sum"`` or the ``"last"`` one.
        trl_environments: TRL-style environments (``environment_factory`` without ``step``, or a dict of them);
            ``None`` without (``docs/agents.md``, "Coming from TRL environments").
        servers: The MCP tool servers of ``tools=``, whose sessions :meth:`close` ends.
    """

    executor: ToolExecutor | None = None
    parser: ToolCallParser = field(default_factory=HermesToolCallParser)
    environment_factory: EnvironmentFactory | None = None
    max_turns: int = 1
    env_reward: Literal["sum", "last"] = "sum"
    trl_environments: TRLEnvironments | None = None
    servers: tuple[MCPToolServer, ...] = ()

    @classmethod
    def build(
        cls,
        tokenizer: PreTrainedTokenizerBase,
        *,
        tools: Sequence[Callable[..., Any] | dict[str, Any] | MCPToolServer] | None = None,
        tool_parser: ToolCallParser | None = None,
        environment_factory: EnvironmentFactory | TRLEnvironments | dict[str, Callable[[], Any]] | None = None,
        max_turns: int = 1,
        tool_timeout: float = 10.0,
        env_reward: Literal["sum", "last"] = "sum",
    ) -> AgentSettings:
        """Settings from the module's arguments; tools are checked (schemas) and so is the tokenizer's template.

        ``tools`` may hold MCP server entries (:mod:`lightning_grpo.agents.mcp_tools`): they are started here and
        their tools listed. ``environment_factory`` is ours or TRL-style, told apart by
        :func:`~lightning_grpo.agents.trl_environment.is_trl_factory`.

        Raises:
            ValueError: A tool lacks type hints or a docstring, a tool name is defined twice, the chat template does
                not render tools, or a TRL-style environment lacks ``reset``.
            MCPServerError: An MCP server did not start or answer.
        """
        python, servers = split_tools(list(tools or []))
        all_tools: list[Tool] = [Tool.from_function(tool) for tool in python]
        try:
            all_tools = server_tools(all_tools, servers) if servers else all_tools
            trl = trl_environments_of(environment_factory)
        except BaseException:
            for server in servers:
                server.close()
            raise
        if isinstance(trl, TRLEnvironments):
            trl.tools, environment_factory = all_tools, None
            trl.check_tools()
        else:
            trl = None
        executor = None
        if all_tools or trl is not None:
            executor = ToolExecutor(ToolSet(all_tools), timeout=tool_timeout)
            check_chat_template_supports_tools(tokenizer)
        if environment_factory is not None and not callable(environment_factory):
            raise TypeError(f"environment_factory must be callable (row -> Environment), got {environment_factory!r}")
        parser = tool_parser if tool_parser is not None else HermesToolCallParser()
        return cls(executor, parser, environment_factory, max_turns, env_reward, trl, tuple(servers))  # type: ignore[arg-type]

    @property
    def multi_turn(self) -> bool:
        """Whether trajectories can have several turns (tools or an environment are set)."""
        return self.executor is not None or self.environment_factory is not None or self.trl_environments is not None

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The tools' JSON schemas for the chat template, or ``None`` without tools."""
        return self.executor.tools.schemas if self.executor is not None and len(self.executor.tools) else None

    @property
    def has_environment(self) -> bool:
        """Whether an environment (ours or TRL-style) serves the trajectories (it offers reward keywords too)."""
        return self.environment_factory is not None or self.trl_environments is not None

    def prompts_of(self, batch: Any) -> list[Any]:
        """The batch's prompts; with TRL-style environments, rows without one start empty (``reset`` fills it).

        Raises:
            KeyError: The batch has no ``"prompt"`` key and no TRL-style environment is set.
        """
        if "prompt" in batch:
            return list(batch["prompt"])
        if self.trl_environments is None or not batch:
            raise KeyError(f"a batch must have a 'prompt' key (strings or chat messages); got keys {sorted(batch)}")
        return [[] for _ in next(iter(batch.values()))]

    def close(self) -> None:
        """End the MCP servers' sessions (they reopen on next use)."""
        for server in self.servers:
            server.close()
