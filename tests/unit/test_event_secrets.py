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
            "X-Auth": "hunter2",
            "X-Password": "hunter2",
            "Accept": "text/plain",
        },
        "body": "password=hunter2hunter2",
    }
    assert _shown_in_events(arguments) == {
        "url": "https://api.example.com/v1",
        "headers": {
            "Authorization": REMOVED,
            "X-Api-Key": REMOVED,
            "X-Auth": REMOVED,
            "X-Password": REMOVED,
            "Accept": "text/plain",
        },
        "body": REMOVED,
    }
    assert arguments["headers"]["Authorization"] == "Bearer abcdefghijklmnop1234"  # the call's own copy


def test_a_long_argument_is_cut_and_keeps_no_secret_near_its_start() -> None:
    content = "token=abcdefghij1234567890 " + "a_" * 20_000
    shown = _shown_in_events({"path": "notes.txt", "content": content})
    assert shown == {"path": "notes.txt", "content": f"{REMOVED} " + "a_" * 91 + "a…"}
