"""A small HTTP server on 127.0.0.1 for tests, each request answered by a function of the test's.

`http_server(answer)` serves on a free port until its block ends. `answer` is given each request
(`Received`: method, path, headers, body) and returns the `Reply` to send, or None to close the
connection with no reply (a server that crashed, or one that hung until it was stopped); a `Reply`
in its place answers every request alike. Every request is kept, in order, in `received`. The
server logs nothing.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    """A request the server was sent."""

    method: str
    path: str
    headers: Message
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    """What the server answers: `Content-Length` is always sent, `Content-Type` when given."""

    status: int = 200
    body: bytes = b""
    content_type: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


def json_reply(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, json.dumps(payload).encode(), "application/json", headers or {})


def text_reply(text: str, status: int = 200) -> Reply:
    return Reply(status, text.encode(), "text/plain")


Answer = Callable[[Received], Reply | None] | Reply


@dataclass
class Serving:
    """A running server: its port, its URL on 127.0.0.1 (no trailing slash) and what it was sent."""

    port: int
    received: list[Received]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def paths(self) -> list[str]:
        """The path (and query) of each request, in order."""
        return [request.path for request in self.received]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a handler left waiting (a hung reply) does not hold up the test's end


class _DualStackServer(_Server):
    """Listens on every address of the machine, IPv6 and IPv4 alike."""

    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def _handler(answer: Answer, received: list[Received], keep_alive: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            request = Received(self.command, self.path, self.headers, body)
            received.append(request)
            reply = answer if isinstance(answer, Reply) else answer(request)
            if reply is None:
                self.close_connection = True
                return
            self.send_response(reply.status)
            if reply.content_type is not None:
                self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(reply.body)

        do_GET = do_POST = _answer

    return Handler


@contextmanager
def http_server(answer: Answer, *, keep_alive: bool = False, dual_stack: bool = False) -> Iterator[Serving]:
    """Serve `answer` on a free port of 127.0.0.1 until the block ends.

    `keep_alive`: HTTP/1.1, the connection kept for the client's next request (as a model API
    does); `dual_stack`: on every address of this machine, IPv6 and IPv4, not only 127.0.0.1.
    """
    received: list[Received] = []
    handler = _handler(answer, received, keep_alive)
    server = _DualStackServer(("::", 0), handler) if dual_stack else _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Serving(server.server_address[1], received)
    finally:
        server.shutdown()
        server.server_close()
