"""One completion through the model layer: the `chat` purpose, with its usage."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError, MasterplannerError, ModelError
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
    """Send `prompt` to `model` (default: the configured model) and return its answer and usage."""
    if not prompt.strip():
        raise ConfigError("the prompt is empty")
    settings = settings or Settings.load(model=model)
    spec = model or settings.model

    from pydantic_ai import Agent

    from .models import labelled, resolve_model

    ledger = UsageLedger()
    agent = Agent(labelled(resolve_model(spec, settings), "chat", ledger), output_type=str)
    result = await run_agent(agent, prompt)
    return ChatResult(output=result, model=spec, usage=ledger.summary())


def chat(prompt: str, *, model: str | None = None, settings: Settings | None = None) -> ChatResult:
    """Blocking form of `achat`."""
    return asyncio.run(achat(prompt, model=model, settings=settings))


async def run_agent(agent: Any, prompt: str, **options: Any) -> Any:
    """Run a pydantic-ai agent (`options` go to `agent.run`) and return its output.

    Provider and protocol failures become masterplanner errors.
    """
    from pydantic_ai.exceptions import AgentRunError, ModelAuthenticationError, UserError

    try:
        result = await agent.run(prompt, **options)
    except MasterplannerError:
        raise
    except UserError as exc:
        raise ConfigError(str(exc)) from exc
    except ModelAuthenticationError as exc:
        raise ConfigError(f"the model provider rejected the credentials: {exc}") from exc
    except AgentRunError as exc:
        raise ModelError(f"model call failed: {exc}") from exc
    except OSError as exc:
        raise ModelError(f"model call failed: {exc}") from exc
    return result.output
