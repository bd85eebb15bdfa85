"""`generate_image`: an OpenAI-compatible images API; the PNG is saved into the workspace.

Offline, charts and diagrams come from `code_execution` (matplotlib and the like) instead.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass

from ..errors import ToolError
from .workspace import Workspace, invalid_text

__all__ = ["MAX_PROMPT_CHARS", "SIZES", "ImageConfig", "check_image_call", "generate_image"]

SIZES = ("256x256", "512x512", "1024x1024", "1024x1536", "1536x1024", "1792x1024", "1024x1792")
_PNG = b"\x89PNG\r\n\x1a\n"
MAX_PROMPT_CHARS = 32_000
"""Longest prompt sent (the images API's own limit for gpt-image-1)."""


@dataclass(frozen=True)
class ImageConfig:
    """Which images API to call; the key comes from `api_key_variable` in the environment."""

    model: str = "gpt-image-1"
    base_url: str | None = None
    api_key_variable: str = "OPENAI_API_KEY"
    timeout_s: float = 120.0


def check_image_call(workspace: Workspace, prompt: str, path: str, size: str) -> None:
    """`ToolError` for an image call refused anyway, before anyone is asked to approve it.

    The prompt, the size, and the path as `write_file` checks it (inside the workspace, not a
    protected name).
    """
    if not isinstance(prompt, str):
        raise ToolError(f"the image prompt must be text, got {type(prompt).__name__}")
    if not prompt.strip():
        raise ToolError("the image prompt is empty")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ToolError(f"the image prompt is {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}")
    invalid = invalid_text(prompt)
    if invalid is not None:
        raise ToolError(f"the image prompt has {invalid}, which is not valid text")
    if not isinstance(path, str) or not path.lower().endswith(".png"):
        raise ToolError(f"path must end in .png, got {_shown(path)}")
    workspace.check_write_path(path)
    if size not in SIZES:
        raise ToolError(f"size must be one of {', '.join(SIZES)}, got {_shown(size)}")


async def generate_image(
    config: ImageConfig, workspace: Workspace, prompt: str, path: str, size: str = "1024x1024"
) -> str:
    """Generate one image for `prompt` and save it at `path` (a .png) in the workspace.

    Every argument is checked before the API is called (`check_image_call`), so a refused call
    costs nothing.
    """
    check_image_call(workspace, prompt, path, size)
    key = os.environ.get(config.api_key_variable)
    if not key:
        raise ToolError(
            f"generate_image needs the environment variable {config.api_key_variable}, which is not set "
            "(offline, draw charts and diagrams with code_execution instead)"
        )
    from openai import AsyncOpenAI, OpenAIError

    client = AsyncOpenAI(api_key=key, base_url=config.base_url, timeout=config.timeout_s, max_retries=1)
    try:
        response = await client.images.generate(
            model=config.model,
            prompt=prompt,
            size=size,
            n=1,
            response_format="b64_json",
        )
    except OpenAIError as exc:
        raise ToolError(f"the images API failed: {type(exc).__name__}: {exc}") from None
    finally:
        await client.close()
    where = config.base_url or "api.openai.com"
    if isinstance(response, str) or not hasattr(response, "data"):  # the SDK's way of giving a non-JSON body
        raise ToolError(f"the images API at {where} answered with something that is not JSON")
    encoded = response.data[0].b64_json if response.data else None
    if not encoded:
        raise ToolError("the images API returned no image data")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ToolError("the images API returned data that is not base64") from None
    if not data.startswith(_PNG):
        raise ToolError("the images API returned something that is not a PNG")
    return workspace.write_bytes(path, data)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:80]}…"
