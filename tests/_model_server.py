"""An OpenAI-compatible model server on 127.0.0.1 for tests, which misbehaves when told to.

It answers `POST …/chat/completions` from rules. A rule answers a request whose text (the
request's JSON: messages, tools, response format) contains every string of its `match`, and whose
conversation already holds `turn - 1` assistant replies when it gives `turn`. Its `reply` is text,
a JSON value (sent as the message's text, as a model answering in a schema does), or
`{"tool_calls": [{"name": …, "args": {…}}]}`. Before answering, a rule plays its `faults` one per
request, in order, and then `always` on every request if given:

| fault | what the client gets |
| --- | --- |
| `429` / `429:S` | HTTP 429, with `Retry-After: S` when S is given |
| `500` | HTTP 500 with an error body |
| `401` | HTTP 401 whose message echoes the key the client sent, as some proxies do |
| `hang` | nothing: the connection stays open and silent until the server stops |
| `malformed` | HTTP 200 whose body is cut-off JSON |
| `wrong_schema` | a well-formed completion whose text is `{"unexpected": true}` |
| `crash` | the connection closed with no reply |
| `no_usage` | the rule's reply without `usage`, as some OpenAI-compatible servers send it |

Every request is logged (`requests`): when, which rule and what it was given.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from _http_server import Received, Reply, http_server, json_reply


@dataclass
class Rule:
    match: list[str]
    reply: Any = "ok"
    faults: list[str] = field(default_factory=list)
    always: str | None = None
    turn: int | None = None


@dataclass(frozen=True)
class Served:
    at: float
    rule: int
    given: str
    text: str = ""
    """The request's JSON text."""


class ModelServer:
    """The server's rules and log (see the module docstring); `base_url` once started."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self.requests: list[Served] = []
        self.unmatched: list[str] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.base_url = ""

    def served(self, text: str) -> list[Served]:
        """The requests answered by the rules that match on `text`, in order."""
        rules = {index for index, rule in enumerate(self.rules) if text in rule.match}
        return [served for served in self.requests if served.rule in rules]

    def given(self, text: str) -> list[str]:
        """What the requests answered by the rules matching on `text` were given, in order."""
        return [served.given for served in self.served(text)]

    def texts(self, text: str) -> list[str]:
        """The JSON text of the requests answered by the rules matching on `text`, in order."""
        return [served.text for served in self.served(text)]

    def _choose(self, text: str, turn: int) -> tuple[int, str] | None:
        with self._lock:
            for index, rule in enumerate(self.rules):
                if all(wanted in text for wanted in rule.match) and rule.turn in (None, turn):
                    given = rule.faults.pop(0) if rule.faults else rule.always or "reply"
                    self.requests.append(Served(time.monotonic(), index, given, text))
                    return index, given
            self.unmatched.append(text[-2000:])
            return None

    def answer(self, request: Received) -> Reply | None:
        """The reply to `request` (the rules' models listed, or a chat completion), or None for none."""
        if request.method == "GET":
            return json_reply({"object": "list", "data": [{"id": "faulty", "object": "model"}]})
        body = json.loads(request.body or b"{}")
        turn = 1 + sum(message.get("role") == "assistant" for message in body.get("messages", []))
        chosen = self._choose(json.dumps(body), turn)
        if chosen is None:
            return json_reply({"error": {"message": "no rule of the test server matches this request"}}, 404)
        index, given = chosen
        kind, _, seconds = given.partition(":")
        if kind == "429":
            headers = {"Retry-After": seconds} if seconds else {}
            return json_reply(
                {"error": {"message": "rate limit reached", "type": "rate_limit"}}, 429, headers
            )
        if kind == "401":
            key = request.headers.get("Authorization", "").removeprefix("Bearer ")
            message = f"Incorrect API key provided: {key}"
            return json_reply({"error": {"message": message, "type": "invalid_request_error"}}, 401)
        if kind == "500":
            return json_reply({"error": {"message": "the server had an error", "type": "server_error"}}, 500)
        if kind == "hang":
            self._stopping.wait(600)
            return None
        if kind == "crash":
            return None
        if kind == "malformed":
            cut = b'{"id": "x", "choices": [{"index": 0, "message": {"role": "assist'
            return Reply(200, cut, "application/json")
        reply = {"unexpected": True} if kind == "wrong_schema" else self.rules[index].reply
        completion = _completion(reply, body.get("model", "faulty"))
        if kind == "no_usage":
            del completion["usage"]
        return json_reply(completion)


def _completion(reply: Any, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if isinstance(reply, dict) and "tool_calls" in reply:
        message["tool_calls"] = [
            {
                "id": f"call_{number}",
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call.get("args", {}))},
            }
            for number, call in enumerate(reply["tool_calls"])
        ]
        finish = "tool_calls"
    else:
        message["content"] = reply if isinstance(reply, str) else json.dumps(reply)
        finish = "stop"
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


@contextmanager
def model_server(rules: list[Rule]) -> Iterator[ModelServer]:
    """Serve `rules` on a free port of 127.0.0.1 until the block ends."""
    server = ModelServer(rules)
    with http_server(server.answer, keep_alive=True) as http:
        server.base_url = f"{http.url}/v1"
        try:
            yield server
        finally:
            server._stopping.set()  # a hung request ends before the server stops
