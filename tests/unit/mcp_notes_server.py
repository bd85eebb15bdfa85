"""A tiny MCP server (stdio) for the tests: one tool, `shout` (or the name given as its argument)."""

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")


def shout(text: str) -> str:
    """Return the text in capital letters."""
    if not text:  # a failure of the tool itself, for the tests
        raise ValueError("there is nothing to shout")
    return text.upper()


server.add_tool(shout, name=sys.argv[1] if len(sys.argv) > 1 else "shout")


if __name__ == "__main__":
    server.run()
