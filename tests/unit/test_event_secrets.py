"""Events keep no secret `runs audit` hides: a tool call's credential headers and secrets in its arguments."""

from __future__ import annotations

from masterplanner.engine.tool_calls import _shown_in_events
from masterplanner.redaction import REMOVED


def test_an_http_requests_credential_headers_are_masked_in_its_event() -> None:
    arguments = {
        "url": "https://api.example.com/v1",
        "headers": {
            "Authorization": "Bearer abcdefghijklmnop1234",
            "X-Api-Key": "plain",
            "Accept": "text/plain",
        },
        "body": "password=hunter2hunter2",
    }
    assert _shown_in_events(arguments) == {
        "url": "https://api.example.com/v1",
        "headers": {"Authorization": REMOVED, "X-Api-Key": REMOVED, "Accept": "text/plain"},
        "body": REMOVED,
    }
    assert arguments["headers"]["Authorization"] == "Bearer abcdefghijklmnop1234"  # the call's own copy
