"""`generate_image`: an OpenAI-compatible images API; the PNG is saved into the workspace.

Offline, charts and diagrams come from `code_execution` (matplotlib and the like) instead.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass
from typing import Any

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
    response = await _requested(config, key, prompt, size)
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


async def _requested(config: ImageConfig, key: str, prompt: str, size: str) -> Any:
    """The images API's answer, once: the SDK's own retries are off, and its failures are in our words."""
    from openai import APIConnectionError, APIStatusError, APITimeoutError, AsyncOpenAI, OpenAIError

    where = config.base_url or "api.openai.com"
    client = AsyncOpenAI(api_key=key, base_url=config.base_url, timeout=config.timeout_s, max_retries=0)
    try:
        return await client.images.generate(
            model=config.model,
            prompt=prompt,
            size=size,
            n=1,
            response_format="b64_json",
        )
    except APITimeoutError:
        raise ToolError(f"the images API at {where} did not answer within {config.timeout_s:g} s") from None
    except APIConnectionError:
        raise ToolError(f"could not reach the images API at {where}") from None
    except APIStatusError as exc:
        raise ToolError(_refusal(where, config, exc.status_code, exc.code)) from None
    except OpenAIError:
        raise ToolError(f"the images API at {where} sent a reply that could not be read") from None
    finally:
        await client.close()


def _refusal(where: str, config: ImageConfig, status: int, code: object) -> str:
    """What an images API's HTTP error means, in our words (its own text gives the SDK's advice and links).

    The error's `code` is named when it is one (`moderation_blocked`): it says why, and no more.
    """
    reason = {
        401: f"it refused the key in {config.api_key_variable}",
        403: f"the key in {config.api_key_variable} may not use model {config.model}",
        404: f"it does not know model {config.model}",
        429: "it is rate limiting requests or the account's quota is used up",
    }.get(status)
    if reason is None:
        reason = "the server failed" if status >= 500 else "it refused the request"
    named = f" ({code})" if isinstance(code, str) and re.fullmatch(r"[a-z][a-z0-9_]{0,39}", code) else ""
    return f"the images API at {where} failed with HTTP {status}{named}: {reason}"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:80]}…"
