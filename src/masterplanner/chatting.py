"""One completion through the model layer: the `chat` purpose, with its usage."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from .agents import run_agent
from .errors import ConfigError, json_kind
from .redaction import secret_parts, secret_refusal
from .settings import Settings
from .usage import UsageLedger

__all__ = ["ChatResult", "achat", "chat"]


@dataclass(frozen=True)
class ChatResult:
    """The answer to one chat prompt."""

    output: str
    model: str
    usage: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form printed by `masterplanner chat --json`."""
        return {"model": self.model, "output": self.output, "usage": self.usage}


async def achat(prompt: str, *, model: str | None = None, settings: Settings | None = None) -> ChatResult:
    """Send `prompt` to `model` (default: the configured model) and return its answer and usage.

    `ConfigError` for a prompt that is empty or holds what looks like a secret.
    """
    if not isinstance(prompt, str):
        raise ConfigError(f"the prompt should be text, got {json_kind(prompt)}")
    if not prompt.strip():
        raise ConfigError("the prompt is empty")
    if secret_parts(prompt):  # it would be sent to the model (a hosted one keeps what it is sent)
        raise ConfigError(secret_refusal("the prompt", not_in="a prompt"))
    settings = settings or Settings.load(model=model)
    spec = model or settings.model

    from pydantic_ai import Agent

    from .models import labelled, resolve_model_or_setting

    ledger = UsageLedger()
    agent = Agent(labelled(resolve_model_or_setting(spec, settings), "chat", ledger), output_type=str)
    result = await run_agent(agent, prompt)
    return ChatResult(output=result, model=spec, usage=ledger.summary())


def chat(prompt: str, *, model: str | None = None, settings: Settings | None = None) -> ChatResult:
    """Blocking form of `achat` (from code that runs no event loop; in a coroutine, await `achat`)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(achat(prompt, model=model, settings=settings))
    raise ConfigError("chat() blocks, and this thread runs an event loop: await achat() here instead")
