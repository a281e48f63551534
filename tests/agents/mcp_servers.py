"""Small MCP servers for the tests: ``python tests/agents/mcp_servers.py stdio|http PORT|crash``."""

from __future__ import annotations

import os
import sys
import time


def build():
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("test-tools", log_level="CRITICAL")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def slow(seconds: float) -> str:
        """Sleep, then answer."""
        time.sleep(seconds)
        return "done"

    @server.tool()
    def boom(message: str) -> str:
        """Always fails."""
        raise ValueError(message)

    @server.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @server.tool()
    def env(name: str) -> str:
        """An environment variable of the server process."""
        return os.environ.get(name, "")

    @server.tool()
    def die() -> str:
        """Exit the server process at once."""
        os._exit(3)

    return server


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "hang":  # starts, never answers
        print(f"hanging, pid {os.getpid()}", file=sys.stderr, flush=True)
        time.sleep(600)
    if mode == "crash":
        print("cannot start: missing configuration FOO_TOKEN", file=sys.stderr)
        sys.exit(2)
    if mode == "stdio":
        print(f"server starting, LG_TEST={os.environ.get('LG_TEST')}", file=sys.stderr)
        build().run("stdio")
    else:
        build().run("streamable-http", port=int(sys.argv[2]))
