"""The model seam: turn a model spec string into a pydantic-ai `Model`.

| spec | model |
| --- | --- |
| `local` | the embedded SmolLM2-135M-Instruct GGUF, in-process through llama.cpp |
| `local:/path/model.gguf` | any GGUF file, same behaviour |
| `openai:NAME` | OpenAI, or an OpenAI-compatible server at `OPENAI_BASE_URL` (vLLM, llama.cpp, Ollama) |
| `anthropic:NAME` | Anthropic (`ANTHROPIC_API_KEY`) |
| `ollama:NAME` | Ollama's OpenAI endpoint at `OLLAMA_BASE_URL` (default `http://127.0.0.1:11434/v1`) |
| `scripted:FILE` | the deterministic scripted model (tests, demos, benchmarks) |

Provider SDKs are imported only when their spec is resolved, so `masterplanner --help` stays fast.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, MissingCredentialError, ModelSpecError
from ..settings import PROVIDERS, missing_credential, provider_of
from .labelled import LabelledModel, labelled

if TYPE_CHECKING:
    from pydantic_ai.models import Model

    from ..settings import Settings

__all__ = [
    "MODEL_FORMS",
    "PROVIDERS",
    "LabelledModel",
    "context_window",
    "labelled",
    "missing_credential",
    "provider_of",
    "resolve_model",
    "resolve_model_or_setting",
    "takes_tool_aids",
    "with_tool_aids",
]

MODEL_FORMS = (
    "local",
    "local:/path/model.gguf",
    "openai:NAME",
    "anthropic:NAME",
    "ollama:NAME",
    "scripted:FILE",
)

DEFAULT_OLLAMA_BASE_URL = "http://127.0.0.1:11434/v1"

CONTEXT_TOKENS = "masterplanner_context_tokens"
"""Profile key: the context window in tokens, for a model whose window the engine must plan for."""
MAX_OUTPUT_TOKENS = "masterplanner_max_output_tokens"
"""Profile key: the most tokens one reply of such a model may take."""


def context_window(model: Model) -> tuple[int, int] | None:
    """`(context tokens, most output tokens)` when the model's profile gives its window, else None.

    The embedded and other GGUF models set it (their window is small and fixed); providers'
    models leave it out and the run's own budgets apply.
    """
    tokens, output = model.profile.get(CONTEXT_TOKENS), model.profile.get(MAX_OUTPUT_TOKENS)
    if isinstance(tokens, int) and isinstance(output, int) and tokens > 0 and output > 0:
        return tokens, output
    return None


def takes_tool_aids(model: Model) -> bool:
    """Whether tool-use aids apply to `model`.

    The in-process llama.cpp model, and the scripted model standing in for a small one
    (`"small_model": true`), so tests drive the aided steps through the engine; others take none.
    """
    from .local import STRUCTURED_PLANS, LocalModel
    from .scripted import ScriptedModel

    if isinstance(model, ScriptedModel):
        return bool(model.profile.get(STRUCTURED_PLANS, False))
    return isinstance(model, LocalModel)


def with_tool_aids(model: Model, aids: object) -> Model | None:
    """The model with tool-use `aids` applied to its requests, or None when it takes no aids."""
    from .local import LocalModel, ToolAids
    from .scripted import ScriptedModel

    if not isinstance(aids, ToolAids) or not takes_tool_aids(model):
        return None
    if isinstance(model, LocalModel | ScriptedModel):
        return model.aided(aids)
    return None


def _unknown(spec: str, why: str) -> ModelSpecError:
    return ModelSpecError(f"unknown model {spec!r} ({why}); valid forms: {', '.join(MODEL_FORMS)}")


def resolve_model(spec: str, settings: Settings | None = None) -> Model:
    """Return the pydantic-ai model that `spec` names (see the module docstring for the forms)."""
    spec = spec.strip()
    if spec == "local":
        return _local(None, settings)
    provider, sep, name = spec.partition(":")
    if not sep or not name.strip():
        raise _unknown(spec, "expected PROVIDER:NAME" if sep else "no provider prefix")
    name = name.strip()
    match provider:
        case "local":
            return _local(Path(name).expanduser(), settings)
        case "scripted":
            from .scripted import ScriptedModel

            return ScriptedModel(Path(name).expanduser())
        case "openai":
            return _retried(_openai(spec, name), settings)
        case "anthropic":
            return _retried(_anthropic(spec, name), settings)
        case "ollama":
            return _retried(_ollama(name), settings)
    raise _unknown(spec, f"no provider {provider!r}")


def resolve_model_or_setting(spec: str | None, settings: Settings) -> Model:
    """The model `spec` names, or when it is None, empty or the setting's value, the `model` setting's.

    An error in the setting's spec (an unknown form, a model or script file that is not there)
    says it is the `model` setting and where that came from: a spec in a settings file was
    reported as if typed on the command line, and `doctor` pointed at MASTERPLANNER_MODEL.
    A missing API key is not the setting's fault and is raised as it is.
    """
    if spec and spec != settings.model:
        return resolve_model(spec, settings)
    try:
        return resolve_model(settings.model, settings)
    except MissingCredentialError:
        raise
    except ConfigError as exc:
        located = copy.copy(exc)
        located.args = (settings.problem_in("model", str(exc)),)
        raise located from None


def _retried(model: Model, settings: Settings | None) -> Model:
    """A model server's model, its requests tried again on failures in passing (`retries`)."""
    from ..settings import Settings
    from .retries import RetriedModel

    settings = settings or Settings.load()
    return RetriedModel(model, attempts=settings.model_attempts, timeout_s=settings.model_timeout_s)


def _local(path: Path | None, settings: Settings | None) -> Model:
    from ..settings import Settings
    from .local import LocalModel

    settings = settings or Settings.load()
    return LocalModel(
        path,
        context_tokens=settings.local_context_tokens,
        threads=settings.local_threads,
        max_output_tokens=settings.local_max_output_tokens,
    )


def _openai(spec: str, name: str) -> Model:
    if (variable := missing_credential("openai")) is not None:
        raise MissingCredentialError(variable, spec)
    from pydantic_ai.profiles import ModelProfile
    from pydantic_ai.providers.openai import OpenAIProvider

    from .openai_compat import OpenAICompatibleModel

    # Compatible servers (llama.cpp, vLLM, Ollama, LM Studio) enforce a response_format schema with a
    # grammar, while many of them lack tool_choice="required": prefer native structured output there.
    profile = (
        ModelProfile(supports_json_schema_output=True, default_structured_output_mode="native")
        if os.environ.get("OPENAI_BASE_URL")
        else None
    )
    return OpenAICompatibleModel(name, provider=OpenAIProvider(), profile=profile)


def _anthropic(spec: str, name: str) -> Model:
    if (variable := missing_credential("anthropic")) is not None:
        raise MissingCredentialError(variable, spec)
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    return AnthropicModel(name, provider=AnthropicProvider())


def _ollama(name: str) -> Model:
    from pydantic_ai.models.ollama import OllamaModel
    from pydantic_ai.providers.ollama import OllamaProvider

    base_url = os.environ.get("OLLAMA_BASE_URL") or DEFAULT_OLLAMA_BASE_URL
    return OllamaModel(name, provider=OllamaProvider(base_url=base_url))
