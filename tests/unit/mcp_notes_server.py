"""A tiny MCP server (stdio) for the tests: one tool, `shout` (or one under each name given)."""

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("notes")


def shout(text: str) -> str:
    """Return the text in capital letters."""
    if not text:  # a failure of the tool itself, for the tests
        raise ValueError("there is nothing to shout")
    if text == "token":  # a failure quoting the secret the server was given, for the tests
        raise ToolError(f"the service refused NOTES_TOKEN {os.environ.get('NOTES_TOKEN')}")
    if text == "whoami":  # an answer quoting the secret the server was given, for the tests
        return f"SIGNED IN WITH {os.environ.get('NOTES_TOKEN')}"
    if text == "never":  # a call the server never answers, for the tests
        time.sleep(3600)
    return os.environ.get("NOTES_LABEL", "") + text.upper()  # a label: which server answered


for name in sys.argv[1:] or ["shout"]:
    server.add_tool(shout, name=name)


if __name__ == "__main__":
    server.run()
