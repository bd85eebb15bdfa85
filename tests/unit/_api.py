"""Reading the REST API's answers in the tests."""

from typing import Any

import httpx
from pydantic import TypeAdapter


def typed(model: Any, response: httpx.Response) -> Any:
    """The answer read as the OpenAPI document says it is (the models forbid fields they do not name)."""
    assert response.is_success, response.text
    return TypeAdapter(model).validate_python(response.json())
