"""`http_request` against SSRF: no spelling of a local or private address reaches a local listener."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from masterplanner import ToolError
from masterplanner.tools.http import HttpPolicy, http_request

pytestmark = pytest.mark.security


class _Server:
    def __init__(self) -> None:
        self.hits: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits.append(self.path)
                if self.path == "/loop":
                    self.send_response(302)
                    self.send_header("Location", "/loop")
                    self.end_headers()
                    return
                if self.path.startswith("/redirect"):
                    self.send_response(302)
                    self.send_header("Location", self.path.split("to=", 1)[1])
                    self.end_headers()
                    return
                body = b"x" * 5000 if self.path == "/big" else b"hello from the listener"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()


@pytest.fixture
def listener() -> Iterator[_Server]:
    server = _Server()
    yield server
    server.httpd.shutdown()


ANY = HttpPolicy(allowed_domains=("*",))


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "127.1", "0x7f.1", "2130706433", "0177.0.0.1", "[::ffff:127.0.0.1]", "[::1]", "localhost"],
)
def test_loopback_spellings_never_connect(listener: _Server, host: str) -> None:
    with pytest.raises(ToolError, match=r"refused|does not resolve"):
        asyncio.run(http_request(ANY, "GET", f"http://{host}:{listener.port}/secret"))
    assert listener.hits == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://169.254.169.254/latest/meta-data/", "not a public address"),
        ("http://10.0.0.1/", "not a public address"),
        ("http://[fd00::1]/", "not a public address"),
        ("http://224.0.0.1/", "multicast"),
        ("http://[64:ff9b::7f00:1]/", "NAT64"),
        ("http://[2002:7f00:1::]/", "6to4"),
        ("http://user:pw@example.com/", "user name or password"),
        ("http://user@example.com/", "user name or password"),
        ("ftp://example.com/", "only http and https"),
        ("file:///etc/passwd", "only http and https"),
    ],
)
def test_private_and_odd_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        asyncio.run(http_request(ANY, "GET", url))


def test_the_allowlist_is_enforced_before_resolving(listener: _Server) -> None:
    policy = HttpPolicy(allowed_domains=("example.com",), allow_loopback=True)
    with pytest.raises(ToolError, match="not on the HTTP allowlist"):
        asyncio.run(http_request(policy, "GET", f"http://127.0.0.1:{listener.port}/"))
    with pytest.raises(ToolError, match="not on the HTTP allowlist"):
        asyncio.run(http_request(policy, "GET", "http://example.com.evil.net/"))
    assert listener.hits == []


def test_allowed_loopback_works_and_every_redirect_is_checked(listener: _Server) -> None:
    policy = HttpPolicy(allowed_domains=("127.0.0.1",), allow_loopback=True, max_bytes=1000)
    result = asyncio.run(http_request(policy, "GET", f"http://127.0.0.1:{listener.port}/hello"))
    assert (result.status, result.body) == (200, "hello from the listener")
    big = asyncio.run(http_request(policy, "GET", f"http://127.0.0.1:{listener.port}/big"))
    assert (len(big.body), big.truncated) == (1000, True)
    for target in ("http://169.254.169.254/", "http://[::ffff:10.0.0.1]/", "http://evil.example/"):
        with pytest.raises(ToolError, match=r"refused|allowlist"):
            asyncio.run(http_request(policy, "GET", f"http://127.0.0.1:{listener.port}/redirect?to={target}"))
    assert listener.hits == [
        "/hello",
        "/big",
        *[
            f"/redirect?to={t}"
            for t in ("http://169.254.169.254/", "http://[::ffff:10.0.0.1]/", "http://evil.example/")
        ],
    ]
    with pytest.raises(ToolError, match="more than 5 redirects"):
        asyncio.run(http_request(policy, "GET", f"http://127.0.0.1:{listener.port}/loop"))
    assert listener.hits[-6:] == ["/loop"] * 6
