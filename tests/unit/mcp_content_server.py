"""An MCP server (stdio) for the tests whose tools answer with content other than text."""

import base64

from mcp.server.mcpserver import MCPServer
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

server = MCPServer("content")


def _base64(size: int) -> str:
    return base64.b64encode(bytes(size)).decode()


@server.tool()
def mixed() -> CallToolResult:
    """Text, an image, a sound, resources in it and a link to one."""
    return CallToolResult(
        content=[
            TextContent(type="text", text="here it is"),
            ImageContent(type="image", data=_base64(1234), mime_type="image/png"),
            AudioContent(type="audio", data=_base64(5), mime_type="audio/wav"),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(uri="file:///notes.txt", text="resource text here"),
            ),
            EmbeddedResource(
                type="resource",
                resource=BlobResourceContents(
                    uri="file:///data.bin", blob=_base64(10), mime_type="application/octet-stream"
                ),
            ),
            ResourceLink(type="resource_link", name="report", uri="https://example.com/report.pdf"),
        ]
    )


@server.tool()
def empty() -> str:
    """An empty text."""
    return ""


@server.tool()
def structured() -> CallToolResult:
    """Structured content only, no content blocks."""
    return CallToolResult(content=[], structured_content={"count": 2, "names": ["ä", "b"]})


if __name__ == "__main__":
    server.run()
