"""Running pydantic-ai agents with masterplanner's error handling."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ConfigError, MasterplannerError, ModelError

if TYPE_CHECKING:
    from pydantic_ai.settings import ModelSettings

__all__ = ["retry_settings", "run_agent"]


def retry_settings(attempt: int) -> ModelSettings:
    """Model settings for a retry: sampled, seeded with `attempt` so runs stay reproducible.

    A greedy model given the same input writes the same failing reply again (seen with the
    embedded model: invalid plans repeated word for word, a step's tool call cut off at the
    output cap three times in a row).
    """
    return {"temperature": 0.7, "seed": attempt}


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
