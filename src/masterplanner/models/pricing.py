"""What model requests cost, in US dollars.

Models that run on this machine or not at all cost nothing: the embedded and other GGUF models
(llama.cpp), the scripted model, Ollama, and any OpenAI-compatible server on a loopback address.
Hosted models are priced from `genai-prices`, the maintained price table pydantic-ai uses, by
provider, model name and the request's usage (input read from a cache or written to one at its own
rate); a model it does not know has no price (None), which reports say rather than count as free
(`usage.money`).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from pydantic_ai.messages import ModelResponse
from pydantic_ai.models import Model
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.usage import RequestUsage

from ..settings import provider_of

__all__ = ["costs_nothing", "estimated_cost", "image_cost", "innermost", "price_of", "request_cost"]

_FREE_SYSTEMS = frozenset({"llama.cpp", "scripted", "ollama"})
"""Providers (a model's `system`) that run here: their requests cost nothing."""
_FREE_PROVIDERS = frozenset({"local", "scripted", "ollama"})
"""The same, as the provider part of a model spec."""


def _loopback(url: str | None) -> bool:
    host = urlsplit(url or "").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _priced(provider: str, model_name: str, usage: RequestUsage) -> float | None:
    """The price table's figure for `usage`, or None when it lacks the model or cannot price the usage.

    Input read from a cache or written to one is priced at its own rate (all input was priced as
    fresh: a cache-heavy run showed up to ten times its cost), reasoning as output; a usage with
    more tokens read from the cache than were sent cannot be priced.
    """
    from genai_prices import calc_price  # on first use: it is a fifth of a second to import

    try:
        calculation = calc_price(usage, model_name, provider_id=provider)
    except (LookupError, ValueError):
        return None
    return float(calculation.total_price)


def innermost(model: Model) -> Model:
    """The model behind its wrappers (purpose labels, checkpoints, budgets): who answers."""
    while isinstance(model, WrapperModel):
        model = model.wrapped
    return model


def request_cost(model: Model, response: ModelResponse) -> float | None:
    """What `response` cost: 0 for a model that runs here, the price table's figure, or None.

    A reply naming a model the table lacks (a dated version of the one asked for, say) is priced
    as the model asked for: it was counted as of unknown price, which a money budget cannot hold.
    A reply that reports no tokens at all (an OpenAI-compatible server that sends no `usage`) has
    no known price: it was priced at $0.00, read as free.
    """
    inner = innermost(model)
    if inner.system in _FREE_SYSTEMS or _loopback(inner.base_url):
        return 0.0
    usage = response.usage
    if not (usage.input_tokens or usage.output_tokens):
        return None
    named = response.model_name or inner.model_name
    cost = _priced(inner.system, named, usage)
    if cost is None and named != inner.model_name:
        cost = _priced(inner.system, inner.model_name, usage)
    return cost


def price_of(model: Model, input_tokens: int, output_tokens: int) -> float | None:
    """What a request of `model` using that many tokens would cost (as `request_cost` prices it)."""
    inner = innermost(model)
    if inner.system in _FREE_SYSTEMS or _loopback(inner.base_url):
        return 0.0
    return _priced(
        inner.system, inner.model_name, RequestUsage(input_tokens=input_tokens, output_tokens=output_tokens)
    )


def estimated_cost(
    spec: str, input_tokens: int, output_tokens: int, *, base_url: str | None = None
) -> float | None:
    """What that many tokens would cost with the model `spec` names (None: its price is not known).

    `base_url`: where an `openai:` spec is served (OPENAI_BASE_URL); a loopback server costs nothing.
    """
    if costs_nothing(spec, base_url=base_url):
        return 0.0
    usage = RequestUsage(input_tokens=input_tokens, output_tokens=output_tokens)
    return _priced(provider_of(spec), spec.partition(":")[2].strip(), usage)


def image_cost(
    model_name: str, base_url: str | None, input_tokens: int, output_tokens: int, *, reported: bool = True
) -> float | None:
    """What an image request of `model_name` cost (`generate_image`), by the tokens its reply reported.

    Nothing from a server on this machine; otherwise the price table's figure for OpenAI's model
    of that name (it prices gpt-image-1 and its successors by tokens, not dall-e-2 or dall-e-3),
    or None: the table lacks the model, or the reply reported no tokens (`reported` False).
    """
    if _loopback(base_url):
        return 0.0
    if not reported:
        return None
    return _priced("openai", model_name, RequestUsage(input_tokens=input_tokens, output_tokens=output_tokens))


def costs_nothing(spec: str, *, base_url: str | None = None) -> bool:
    """Whether the model `spec` names runs here or on a loopback server (OPENAI_BASE_URL for `openai:`)."""
    provider = provider_of(spec)
    return provider in _FREE_PROVIDERS or (provider == "openai" and _loopback(base_url))
