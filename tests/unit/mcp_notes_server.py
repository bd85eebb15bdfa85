"""A tiny MCP server (stdio) for the tests: one tool, `shout`."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")


@server.tool()
def shout(text: str) -> str:
    """Return the text in capital letters."""
    if not text:  # a failure of the tool itself, for the tests
        raise ValueError("there is nothing to shout")
    return text.upper()


if __name__ == "__main__":
    server.run()
