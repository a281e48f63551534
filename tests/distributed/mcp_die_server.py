"""An MCP stdio server with one tool, ``die``, that ends the server: ``python tests/distributed/mcp_die_server.py``.

Its one short schema keeps the rendered prompt within the tiny model's 512 positions.
"""

from __future__ import annotations

import os


def main() -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("die", log_level="CRITICAL")

    @server.tool()
    def die() -> str:
        """Exit."""
        os._exit(3)

    server.run("stdio")


if __name__ == "__main__":
    main()
