"""Tools: python callables the policy may call, with the JSON schemas chat templates render.

A tool is a plain function (sync or ``async``) with type hints on every argument and a Google-style docstring that
describes each argument. Its schema is built by :func:`transformers.utils.get_json_schema`, the helper chat templates
are written against, so a schema here is exactly what ``tokenizer.apply_chat_template(..., tools=[fn])`` would render.

Example::

    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        \"\"\"
        return a + b

    tools = ToolSet([add])
    tools.schemas  # [{"type": "function", "function": {"name": "add", ...}}]
    tools["add"].function(a=1, b=2)  # 3
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from transformers.utils import get_json_schema
from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

__all__ = ["Tool", "ToolSet"]


@dataclass(frozen=True)
class Tool:
    """One callable tool and its JSON schema.

    Build it with :meth:`from_function` (or let :class:`ToolSet` do it); the constructor takes a ready schema.

    Attributes:
        name: The name the policy calls the tool by (the function's ``__name__``).
        function: The callable, sync or ``async``; called with keyword arguments.
        schema: ``{"type": "function", "function": {"name", "description", "parameters"}}``, the form chat
            templates expect in ``tools=[...]``.
        is_async: Whether ``function`` is a coroutine function (awaited on an event loop rather than run in a thread).
        signature: The function's signature, used to check the policy's arguments before the call.
    """

    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]
    is_async: bool = False
    signature: inspect.Signature | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_function(cls, function: Callable[..., Any]) -> Tool:
        """Build a tool from a callable, its schema from the signature and Google docstring.

        Args:
            function: A function or method with a type hint on every argument and a docstring whose ``Args:``
                section describes every argument.

        Returns:
            The tool.

        Raises:
            TypeError: ``function`` is not callable.
            ValueError: A type hint, the docstring, or an argument's description is missing; the message names the
                function and what to add.
        """
        if isinstance(function, Tool):
            return function
        if not callable(function):
            raise TypeError(f"A tool must be a callable (a function or method), got {type(function).__name__}.")
        name = getattr(function, "__name__", None) or type(function).__name__
        try:
            schema = get_json_schema(function)
        except TypeHintParsingException as err:
            raise ValueError(
                f"Tool {name!r} cannot be used: every argument needs a type hint the schema can express "
                f"(str, int, float, bool, list, dict, Literal, Optional, ...). transformers says: {err}"
            ) from err
        except DocstringParsingException as err:
            raise ValueError(
                f"Tool {name!r} cannot be used: it needs a Google-style docstring with a one-line description and an "
                f"'Args:' section describing every argument (the model reads them). transformers says: {err}"
            ) from err
        return cls(
            name=schema["function"]["name"],
            function=function,
            schema=schema,
            is_async=_is_async(function),
            signature=inspect.signature(function),
        )


def _is_async(function: Callable[..., Any]) -> bool:
    """Whether calling ``function`` returns a coroutine (an ``async def`` function or callable object)."""
    if inspect.iscoroutinefunction(function):
        return True
    call = getattr(function, "__call__", None)  # noqa: B004 - callable objects with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)


class ToolSet:
    """Several tools, looked up by name.

    Args:
        tools: Callables (or :class:`Tool` objects). Names must be unique.

    Raises:
        ValueError: Two tools share a name, or a tool has no usable schema (see :meth:`Tool.from_function`).

    Example::

        tools = ToolSet([add, search])
        tokenizer.apply_chat_template(messages, tools=tools.schemas, add_generation_prompt=True, tokenize=False)
        tools.get("add")  # the Tool, or None for an unknown name
    """

    def __init__(self, tools: Iterable[Callable[..., Any] | Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            tool = Tool.from_function(item)
            if tool.name in self._tools:
                raise ValueError(
                    f"Two tools are named {tool.name!r}; tool names must be unique because the model calls tools "
                    "by name. Rename one of the functions."
                )
            self._tools[tool.name] = tool

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools' schemas, in order, as ``tools=`` of ``apply_chat_template`` expects."""
        return [tool.schema for tool in self._tools.values()]

    @property
    def names(self) -> list[str]:
        """The tools' names, in order."""
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or ``None`` when there is none."""
        return self._tools.get(name)

    def __getitem__(self, name: str) -> Tool:
        tool = self._tools.get(name)
        if tool is None:
            raise KeyError(f"No tool named {name!r}; the tools are {self.names}.")
        return tool

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolSet({self.names})"
