"""`generate_image`: an OpenAI-compatible images API; the PNG is saved into the workspace.

Offline, charts and diagrams come from `code_execution` (matplotlib and the like) instead.

A request is paid like a model request, and counted as one (`ImageSpending`): priced from the
price table by the tokens the API reports (`models.pricing.image_cost`), its worst case held
to the run's budgets before it is made (the prompt's bytes in, `most_output_tokens` out). Under
a money budget a model the price table lacks is refused before any request, as a run's model of
unknown price is.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import ToolError
from .workspace import Workspace, invalid_text

__all__ = [
    "MAX_PROMPT_CHARS",
    "SIZES",
    "ImageConfig",
    "ImageSpending",
    "check_image_call",
    "generate_image",
    "most_output_tokens",
]

SIZES = ("256x256", "512x512", "1024x1024", "1024x1536", "1536x1024", "1792x1024", "1024x1792")
_PNG = b"\x89PNG\r\n\x1a\n"
MAX_PROMPT_CHARS = 32_000
"""Longest prompt sent (the images API's own limit for gpt-image-1)."""


_MOST_TOKENS, _MOST_PIXELS = 6_240, 1024 * 1536
"""The most output tokens OpenAI lists for an image of gpt-image-1 (high quality, 1024x1536)."""
_PROMPT_TOKENS = 16
"""Tokens reserved beyond the prompt's bytes (as a chat message's)."""


def most_output_tokens(size: str) -> int:
    """The output tokens an image of `size` is held at: gpt-image-1's most, scaled by its pixels."""
    width, _, height = size.partition("x")
    return math.ceil(_MOST_TOKENS * int(width) * int(height) / _MOST_PIXELS)


class ImageSpending(Protocol):
    """How a run holds an image request to its budgets and counts it (the engine's `PaidToolCalls`)."""

    @property
    def money_budget(self) -> bool:
        """Whether the run has a money budget."""
        ...

    async def hold(self, input_tokens: int, output_tokens: int, cost_usd: float) -> Any:
        """Hold a request's worst case (waits while requests in flight hold the rest); what to count it by.

        Raises `BudgetExceededError` when it cannot fit the run's budgets.
        """
        ...

    async def release(self, held: Any) -> None:
        """The held request was not answered: nothing was used."""
        ...

    async def count(
        self,
        held: Any,
        *,
        input_tokens: int,
        output_tokens: int,
        seconds: float,
        cost_usd: float | None,
        failed: bool = False,
    ) -> None:
        """Count the request in the run's usage (`cost_usd` None: its price is not known).

        `failed`: it was made and not answered, a call of no tokens.
        """
        ...


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
    config: ImageConfig,
    workspace: Workspace,
    prompt: str,
    path: str,
    size: str = "1024x1024",
    spending: ImageSpending | None = None,
) -> str:
    """Generate one image for `prompt` and save it at `path` (a .png) in the workspace.

    Every argument is checked before the API is called (`check_image_call`), so a refused call
    costs nothing. `spending`: the run's budgets, which hold the request's worst case before it
    is made, and its usage, which counts it once answered (None: neither).
    """
    from ..models.pricing import image_cost

    check_image_call(workspace, prompt, path, size)
    key = os.environ.get(config.api_key_variable)
    if not key:
        raise ToolError(
            f"generate_image needs the environment variable {config.api_key_variable}, which is not set "
            "(offline, draw charts and diagrams with code_execution instead)"
        )
    worst_in = len(prompt.encode("utf-8", "surrogatepass")) + _PROMPT_TOKENS
    worst_out = most_output_tokens(size)
    worst = image_cost(config.model, config.base_url, worst_in, worst_out)
    if spending is not None and worst is None and spending.money_budget:
        raise ToolError(
            f"the run has a money budget, and generate_image's model {config.model} is not in the price "
            "table, so the budget could not hold its cost: no image was requested"
        )
    held = None if spending is None else await spending.hold(worst_in, worst_out, worst or 0.0)
    started = time.perf_counter()
    try:
        response = await _requested(config, key, prompt, size)
    except BaseException as error:
        if spending is not None and isinstance(error, ToolError):  # made, and failed: a call all the same
            seconds = time.perf_counter() - started
            failed = spending.count(
                held, input_tokens=0, output_tokens=0, seconds=seconds, cost_usd=0.0, failed=True
            )
            await asyncio.shield(failed)
        elif spending is not None:  # not made (cancelled): released
            await asyncio.shield(spending.release(held))
        raise
    if spending is not None:
        used = _tokens_used(response)
        # a reply that says nothing of its tokens has no known price (a server on this machine costs nothing)
        cost = image_cost(config.model, config.base_url, *(used or (0, 0)), reported=used is not None)
        await spending.count(
            held,
            input_tokens=used[0] if used else 0,
            output_tokens=used[1] if used else 0,
            seconds=time.perf_counter() - started,
            cost_usd=cost,
        )
    return _saved(config, workspace, response, path)


def _tokens_used(response: Any) -> tuple[int, int] | None:
    """The image request's input and output tokens, or None when its reply does not say them.

    The SDK does not check a reply: a server may send `usage` in a chat reply's form
    (`prompt_tokens`), only a total, or something that is no object; before, counting such a reply
    failed with Python's error, and kept its budget reservation.
    """
    usage = getattr(response, "usage", None)
    inputs, outputs = getattr(usage, "input_tokens", None), getattr(usage, "output_tokens", None)
    if type(inputs) is int and type(outputs) is int and inputs >= 0 and outputs >= 0:
        return inputs, outputs
    return None


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


def _saved(config: ImageConfig, workspace: Workspace, response: Any, path: str) -> str:
    """The image in `response` written at `path`, or `ToolError` saying what is wrong with it."""
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
