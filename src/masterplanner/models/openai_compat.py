"""`openai:` models, including OpenAI-compatible servers that predate `json_schema` output.

OpenAI's structured output is `response_format={"type": "json_schema", …}`. Some compatible
servers — llama-cpp-python's own server among them — reject that form but enforce a schema given
as `{"type": "json_object", "schema": …}`. The model sends the standard form first; when a server
rejects it naming `response_format`, the model switches (for the rest of its life) to the
`json_object` form and repeats the request, so structured output stays grammar-enforced on both.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.settings import ModelSettings

__all__ = ["OpenAICompatibleModel"]


def _rejects_json_schema(error: ModelHTTPError) -> bool:
    body = str(error.body)
    return error.status_code in (400, 422, 500) and "response_format" in body and "json_schema" in body


class OpenAICompatibleModel(OpenAIChatModel):
    """OpenAI chat completions, falling back to `json_object` + schema where `json_schema` is refused."""

    json_object_schema: bool = False
    """True once the server has refused `json_schema` and gets `json_object` with a schema instead."""

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Send the request, switching to the `json_object` form of structured output if refused."""
        # Unprepared parameters say "auto" where the profile's default (native here) applies.
        structured = (
            model_request_parameters.output_object is not None
            and model_request_parameters.output_mode
            in (
                "auto",
                "native",
            )
        )
        if structured and self.json_object_schema:
            return await super().request(
                messages,
                _with_json_object_schema(model_settings, model_request_parameters),
                model_request_parameters,
            )
        try:
            return await super().request(messages, model_settings, model_request_parameters)
        except ModelHTTPError as error:
            if not (structured and _rejects_json_schema(error)):
                raise
        self.json_object_schema = True
        return await super().request(
            messages,
            _with_json_object_schema(model_settings, model_request_parameters),
            model_request_parameters,
        )


def _with_json_object_schema(settings: ModelSettings | None, params: ModelRequestParameters) -> ModelSettings:
    assert params.output_object is not None
    extra: dict[str, Any] = dict((settings or {}).get("extra_body") or {})  # type: ignore[call-overload]
    extra["response_format"] = {"type": "json_object", "schema": params.output_object.json_schema}
    return {**(settings or {}), "extra_body": extra}
