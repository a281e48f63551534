"""MCP tool servers in ``tools=``: stdio subprocesses and streamable HTTP on loopback, listed at set-up, called under
the Python tools' timeout and error-as-message rules, one session reused, closed at the end of fit and on an exception
(no orphan process), and clear errors for servers that do not start, die, or clash with a Python tool
(docs/agents.md, "MCP tool servers")."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lightning_grpo.agents import ToolCall, ToolExecutor
from lightning_grpo.agents.mcp_tools import MCPServerError, MCPServerExitedError, MCPToolServer, server_tools
from lightning_grpo.agents.tools import Tool

pytest.importorskip("mcp")

SERVER = str(Path(__file__).with_name("mcp_servers.py"))
STDIO = [sys.executable, SERVER, "stdio"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is not running
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def _pid(executor: ToolExecutor) -> int:
    (result,) = executor.run([ToolCall("pid", {})])
    assert result.status == "ok", result.content
    return int(result.content)


@pytest.fixture(scope="module")
def stdio_server():
    server = MCPToolServer(command=STDIO, env={"LG_TEST": "from-the-entry"})
    yield server
    server.close()


def test_stdio_tools_are_listed_and_called_with_the_python_tools_rules(stdio_server):
    tools = stdio_server.tools()
    names = [tool.name for tool in tools]
    assert names == ["add", "slow", "boom", "pid", "env", "die"]
    add = tools[0].schema
    assert add["type"] == "function" and add["function"]["description"] == "Add two integers."
    assert add["function"]["parameters"]["required"] == ["a", "b"]
    assert add["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    with ToolExecutor(tools, timeout=1.0) as executor:
        start = time.perf_counter()
        results = executor.run([
            ToolCall("add", {"a": 2, "b": 3}), ToolCall("boom", {"message": "bad input"}),
            ToolCall("slow", {"seconds": 5}), ToolCall("env", {"name": "LG_TEST"}), ToolCall("nope", {}),
        ])  # fmt: skip
        assert time.perf_counter() - start < 3.0  # the slow call times out; the others run beside it
        assert [r.status for r in results] == ["ok", "error", "timeout", "ok", "unknown_tool"]
        assert results[0].content == "5" and results[3].content == "from-the-entry"
        assert results[1].content.startswith("Error: tool 'boom' raised MCPToolError:")
        assert results[2].content == "Error: tool 'slow' timed out after 1.0 s."
        first = _pid(executor)
        assert _pid(executor) == first  # one session, one process, reused from call to call
    with ToolExecutor(stdio_server.tools(), timeout=1.0) as executor:
        assert _pid(executor) == first  # and across executors (steps) of the process


def test_a_pickled_server_opens_its_own_session(stdio_server):
    stdio_server.start()
    tools = pickle.loads(pickle.dumps(stdio_server.tools()))  # what a spawned DDP rank receives
    copy = tools[0].function.server
    assert copy is not stdio_server and copy._session is None and copy._pid is None
    with ToolExecutor(tools, timeout=5.0) as executor, ToolExecutor(stdio_server.tools()) as original:
        assert _pid(executor) != _pid(original)  # its own subprocess and session, opened on first use
    copy.close()


def test_close_ends_the_subprocess_and_a_later_call_reopens():
    server = MCPToolServer(command=STDIO)
    with ToolExecutor(server.tools(), timeout=5.0) as executor:
        pid = _pid(executor)
        server.close()
        assert _wait_gone(pid), "the server subprocess outlived close()"
    with ToolExecutor(server.tools(), timeout=5.0) as executor:
        assert _pid(executor) != pid
    server.close()


def test_a_server_that_does_not_start_is_named_with_its_stderr():
    crash = [sys.executable, SERVER, "crash"]
    with pytest.raises(MCPServerError) as error:
        MCPToolServer(command=crash, startup_timeout=20).tools()
    message = str(error.value)
    assert f"MCP stdio server `{' '.join(crash)}` could not be started" in message
    assert "cannot start: missing configuration FOO_TOKEN" in message  # its stderr
    with pytest.raises(MCPServerError, match="could not be started"):
        MCPToolServer(command=["/nonexistent/mcp-server"]).tools()
    with pytest.raises(
        MCPServerError, match=r"did not answer within 3.0 s\. Its stderr ends with:\nhanging, pid"
    ) as hang:
        MCPToolServer(command=[sys.executable, SERVER, "hang"], startup_timeout=3).tools()
    assert _wait_gone(int(str(hang.value).rsplit("pid ", 1)[1])), "a server that never answered was left running"
    port = _free_port()
    with pytest.raises(MCPServerError, match=rf"MCP HTTP server http://127.0.0.1:{port}/mcp could not be started"):
        MCPToolServer(url=f"http://127.0.0.1:{port}/mcp", startup_timeout=10).tools()


@pytest.mark.parametrize("on_exit", ["continue", "stop"])
def test_a_server_dying_mid_run(on_exit):
    server = MCPToolServer(command=STDIO, on_exit=on_exit)
    with ToolExecutor(server.tools(), timeout=5.0) as executor:
        pid = _pid(executor)
        if on_exit == "continue":
            (died,) = executor.run([ToolCall("die", {})])  # its own call sees the connection close
            assert died.status == "error" and "is no longer running or answering" in died.content
        else:
            with pytest.raises(MCPServerExitedError):
                executor.run([ToolCall("die", {})])
        assert _wait_gone(pid)
        if on_exit == "continue":
            (result,) = executor.run([ToolCall("add", {"a": 1, "b": 1})])
            assert result.status == "error" and "is no longer running or answering" in result.content
            assert " ".join(STDIO) in result.content
        else:
            with pytest.raises(MCPServerExitedError, match="is no longer running or answering"):
                executor.run([ToolCall("add", {"a": 1, "b": 1})])
    server.close()


def test_a_tool_defined_in_process_and_by_a_server_names_both(stdio_server):
    def add(a: int, b: int) -> int:
        """Add.

        Args:
            a: First.
            b: Second.
        """
        return a + b

    with pytest.raises(ValueError, match=r"Tool 'add' is defined twice: by the Python function .*add and by the MCP"):
        server_tools([Tool.from_function(add)], [stdio_server])


def test_entries_are_checked():
    with pytest.raises(ValueError, match="exactly one of 'command'"):
        MCPToolServer.of({"command": ["x"], "url": "http://h/mcp"})
    with pytest.raises(ValueError, match=r"unknown keys \['args'\]"):
        MCPToolServer.of({"command": ["x"], "args": []})
    with pytest.raises(ValueError, match="on_exit must be"):
        MCPToolServer.of({"url": "http://h/mcp", "on_exit": "retry"})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def http_url():
    port = _free_port()
    process = subprocess.Popen([sys.executable, SERVER, "http", str(port)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(timeout=10)


def test_streamable_http_tools_with_timeout_and_errors(http_url):
    server = MCPToolServer.of({"url": http_url})
    with ToolExecutor(server.tools(), timeout=1.0) as executor:
        results = executor.run([
            ToolCall("add", {"a": 4, "b": 5}), ToolCall("slow", {"seconds": 5}), ToolCall("boom", {"message": "x"}),
        ])  # fmt: skip
        assert [r.status for r in results] == ["ok", "timeout", "error"]
        assert results[0].content == "9"
        assert _pid(executor) == _pid(executor)
    server.close()


def _cli(tmp_path, entries):
    from lightning_grpo.cli import GRPOCLI
    from tests.cli.conftest import TINY

    config = tmp_path / "tools.yaml"
    config.write_text(yaml.safe_dump({"model": {"init_args": {"tools": entries}}}))
    return GRPOCLI(
        args=[
            "--config", str(TINY), "--config", str(config), "--model.init_args.grpo.agents.max_turns=2",
            f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}",
        ],
        run=False,
    )  # fmt: skip


def test_yaml_tools_entries_naming_servers_parse_through_the_cli(tmp_path, http_url):
    entry = {"command": STDIO, "env": {"LG_TEST": "yaml"}, "on_exit": "continue", "startup_timeout": 60}
    agent = _cli(tmp_path, ["examples.tool_calling.calc", entry]).model.agent
    (server,) = agent.servers
    assert server.label == f"MCP stdio server `{' '.join(STDIO)}`" and server.on_exit == "continue"
    names = [schema["function"]["name"] for schema in agent.tool_schemas]
    assert names == ["calc", "add", "slow", "boom", "pid", "env", "die"]
    (result,) = agent.executor.run([ToolCall("env", {"name": "LG_TEST"})])
    assert result.content == "yaml"
    agent.close()
    with pytest.raises(
        ValueError, match=r"Tool 'add' is defined twice: by the MCP stdio server .* and by the MCP HTTP"
    ):
        _cli(tmp_path, [{"command": STDIO}, {"url": http_url}])


# ---------------------------------------------------------------- in a fit


def _module(reward):
    from lightning_grpo import GRPOConfig, GRPOModule, PolicyConfig
    from lightning_grpo.config import AgentConfig, SamplingConfig
    from lightning_grpo.testing.agents import short_turn_model, tool_name_tokenizer

    tokenizer = tool_name_tokenizer()  # tools by name only: short prompts
    grpo = GRPOConfig(
        sampling=SamplingConfig(num_generations=2, max_new_tokens=24, max_prompt_length=200),
        agents=AgentConfig(max_turns=2),
    )
    return GRPOModule(short_turn_model(tokenizer), [reward], tokenizer=tokenizer, tools=[{"command": STDIO}],
                      policy=PolicyConfig(lora_r=4, lora_alpha=8), grpo=grpo)  # fmt: skip


BATCH = {"prompt": [[{"role": "user", "content": "add 2 and 3"}], [{"role": "user", "content": "go"}]]}


def test_a_fit_closes_its_servers_at_the_end_and_on_an_exception():
    import torch

    from tests.conftest import make_trainer

    def length(completions, **_):
        return [float(len(c)) for c in completions]

    module = _module(length)
    (server,) = module.agent.servers
    pid = _pid(module.agent.executor)
    loader = torch.utils.data.DataLoader([BATCH], batch_size=None)
    make_trainer(max_steps=1).fit(module, loader)
    assert _wait_gone(pid), "the MCP server subprocess outlived the fit"
    assert server._session is None

    def fails(completions, **_):
        raise RuntimeError("reward crashed")

    module = _module(fails)
    pid = _pid(module.agent.executor)
    with pytest.raises(Exception, match="reward crashed"):
        make_trainer(max_steps=1).fit(module, loader)
    assert _wait_gone(pid), "the MCP server subprocess outlived a failed fit"


def test_the_package_imports_and_runs_python_tools_without_mcp():
    code = (
        "import sys; sys.modules['mcp'] = None\n"
        "import lightning_grpo, lightning_grpo.agents.mcp_tools as m\n"
        "from lightning_grpo.testing.agents import add\n"
        "from lightning_grpo.agents import ToolExecutor, ToolCall\n"
        "print(ToolExecutor([add]).run([ToolCall('add', {'a': 1, 'b': 2})])[0].content)\n"
        "try:\n    m.MCPToolServer(command=['x'])\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path.cwd())
    assert out.stdout.splitlines()[0] == "3"
    assert 'needs mcp, which is not installed: pip install ".[mcp]" in a clone' in out.stdout
