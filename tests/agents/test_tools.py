"""Tools: schemas from signatures and Google docstrings, clear errors for undocumented tools, ToolSet lookups."""

from __future__ import annotations

import pytest

from lightning_grpo.agents import Tool, ToolSet


def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


async def fetch(url: str) -> str:
    """Fetch a page.

    Args:
        url: The address.
    """
    return url


def no_hints(a, b):
    """Add.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def no_docstring(a: int) -> int:
    return a


def undocumented_arg(a: int, b: int) -> int:
    """Add.

    Args:
        a: The first.
    """
    return a + b


def test_schema_from_signature_and_docstring():
    tool = Tool.from_function(add)
    function = tool.schema["function"]
    assert tool.schema["type"] == "function"
    assert tool.name == function["name"] == "add"
    assert function["description"] == "Add two integers."
    assert function["parameters"]["properties"]["a"] == {"type": "integer", "description": "The first integer."}
    assert function["parameters"]["required"] == ["a"]  # b has a default
    assert not tool.is_async
    assert Tool.from_function(fetch).is_async


@pytest.mark.parametrize(
    ("function", "missing"),
    [(no_hints, "type hint"), (no_docstring, "docstring"), (undocumented_arg, "describing every argument")],
)
def test_undocumented_tool_is_refused_naming_the_function(function, missing):
    with pytest.raises(ValueError, match=missing) as info:
        Tool.from_function(function)
    assert repr(function.__name__) in str(info.value)


def test_non_callable_is_refused():
    with pytest.raises(TypeError, match="callable"):
        Tool.from_function(42)


def test_toolset_schemas_lookup_and_duplicates():
    tools = ToolSet([add, fetch])
    assert tools.names == ["add", "fetch"]
    assert [schema["function"]["name"] for schema in tools.schemas] == ["add", "fetch"]
    assert all(schema["type"] == "function" for schema in tools.schemas)
    assert tools["add"].function(a=1, b=2) == 3
    assert tools.get("nope") is None and "fetch" in tools and len(tools) == 2
    with pytest.raises(KeyError, match="'add', 'fetch'"):
        tools["nope"]
    with pytest.raises(ValueError, match="Two tools are named 'add'"):
        ToolSet([add, Tool.from_function(add)])
