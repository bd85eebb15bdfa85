"""Running pydantic-ai agents with masterplanner's error handling."""

from __future__ import annotations

from typing import Any

from .errors import ConfigError, MasterplannerError, ModelError

__all__ = ["run_agent"]


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
