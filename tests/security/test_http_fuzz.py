"""`http_request` against a misbehaving server and fuzzed arguments: only a result or a `ToolError`.

The server on 127.0.0.1 speaks raw bytes, one request per connection, and misbehaves per path:
it trickles, bombs, lies about lengths and encodings, and breaks HTTP. Every outcome is exact: a
`ToolError` with our wording, or a result whose body stays within the cap.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masterplanner import ToolError
from masterplanner.tools.http import HttpPolicy, HttpResult, http_request

pytestmark = pytest.mark.security

MiB = 1 << 20


def _compress(data: bytes, wbits: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return packer.compress(data) + packer.flush()


def _zeros_compressed(size: int, wbits: int) -> bytes:
    """`size` zero bytes compressed, without holding them all at once."""
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    out = b"".join(packer.compress(ZERO_MIB) for _ in range(size // MiB))
    return out + packer.flush()


GZIP, ZLIB, RAW = 31, 15, -15
ZERO_MIB = bytes(MiB)
BOMB_SIZE = 50 * MiB
GZIP_GZIP_BOMB = _compress(_zeros_compressed(BOMB_SIZE, GZIP), GZIP)
DEFLATE_BOMB = _zeros_compressed(BOMB_SIZE, ZLIB)
RAW_DEFLATE_BOMB = _zeros_compressed(BOMB_SIZE, RAW)
GZIP_OF_TEXT = _compress(b"hello, compressed world", GZIP)


def _head(status: str = "200 OK", *headers: str) -> bytes:
    return ("\r\n".join([f"HTTP/1.1 {status}", *headers, "Connection: close"]) + "\r\n\r\n").encode()


def _whole(body: bytes, *headers: str) -> bytes:
    return _head("200 OK", f"Content-Length: {len(body)}", *headers) + body


class _Request:
    def __init__(self, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        self.method, self.target, self.headers, self.body = method, target, headers, body
        split = urlsplit(target)
        self.path, self.query = (
            split.path,
            {k: v[0] for k, v in parse_qs(split.query, encoding="latin-1").items()},
        )


class _Misbehaving:
    """A raw HTTP/1.1 server on 127.0.0.1 that does per path what `_answer` says."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.requests: list[_Request] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.listener.close()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = self._read(conn)
                if request is not None:
                    self.requests.append(request)
                    self._answer(conn, request)
            except OSError:
                return  # the client went away: expected for cut-off bodies

    @staticmethod
    def _read(conn: socket.socket) -> _Request | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk or len(data) > MiB:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        while len(body) < int(headers.get("content-length", "0")):
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return _Request(method, target, headers, body)

    def _trickle(self, conn: socket.socket, data: bytes, every_s: float) -> None:
        for byte in data:
            if self.stopping.is_set():
                return
            conn.sendall(bytes([byte]))
            time.sleep(every_s)

    def _endless(self, conn: socket.socket, chunks: Iterator[bytes]) -> None:
        for chunk in chunks:
            if self.stopping.is_set():
                return
            conn.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")

    def _answer(self, conn: socket.socket, request: _Request) -> None:  # noqa: C901 - one branch per path
        path, query = request.path, request.query
        send = conn.sendall
        if path == "/ok":
            send(_whole(b"hello", "Content-Type: text/plain; charset=utf-8"))
        elif path == "/echo":
            echoed = {"method": request.method, "target": request.target, "headers": request.headers}
            send(_whole(json.dumps({**echoed, "body": request.body.decode("latin-1")}).encode()))
        elif path == "/trickle-body":
            send(_head("200 OK", "Content-Length: 100"))
            self._trickle(conn, b"x" * 100, 0.1)
        elif path == "/trickle-head":
            self._trickle(conn, _whole(b"late"), 0.1)
        elif path == "/slow-redirect":
            time.sleep(0.25)
            hops = int(query.get("n", "1"))
            target = f"/slow-redirect?n={hops - 1}" if hops > 1 else "/ok"
            send(_head("302 Found", f"Location: {target}", "Content-Length: 0"))
        elif path == "/bomb":
            send(_whole(GZIP_GZIP_BOMB, "Content-Encoding: gzip, gzip"))
        elif path == "/deflate-bomb":
            send(_whole(DEFLATE_BOMB, "Content-Encoding: deflate"))
        elif path == "/raw-deflate-bomb":
            send(_whole(RAW_DEFLATE_BOMB, "Content-Encoding: deflate"))
        elif path == "/endless":
            send(_head("200 OK", "Transfer-Encoding: chunked"))
            self._endless(conn, iter(lambda: b"z" * 65536, b""))
        elif path == "/endless-gzip":
            send(_head("200 OK", "Transfer-Encoding: chunked", "Content-Encoding: gzip"))
            packer = zlib.compressobj(9, zlib.DEFLATED, GZIP)
            self._endless(
                conn, iter(lambda: packer.compress(ZERO_MIB) + packer.flush(zlib.Z_SYNC_FLUSH), b"")
            )
        elif path == "/layered":
            layered = _compress(_compress(b"gzip then deflate: ok", GZIP), ZLIB)
            send(_whole(layered, "Content-Encoding: gzip", "Content-Encoding: deflate"))
        elif path == "/raw-deflate":
            send(_whole(_compress(b"raw deflate text", RAW), "Content-Encoding: deflate"))
        elif path == "/x-gzip":
            send(_whole(GZIP_OF_TEXT, "Content-Encoding: x-gzip", "Content-Type: text/plain"))
        elif path == "/identity":
            send(_whole(b"plain", "Content-Encoding: identity"))
        elif path == "/triple":
            triple = _compress(_compress(GZIP_OF_TEXT, GZIP), GZIP)
            send(_whole(triple, "Content-Encoding: gzip, gzip, gzip"))
        elif path == "/encoding":
            send(_whole(b"\x1b\x00\x00payload", f"Content-Encoding: {query['name']}"))
        elif path == "/bad-gzip":
            send(_whole(b"this is not gzip at all", "Content-Encoding: gzip"))
        elif path == "/cut-gzip":
            send(_whole(GZIP_OF_TEXT[: len(GZIP_OF_TEXT) // 2], "Content-Encoding: gzip"))
        elif path == "/charset":
            body = query.get("body", "caf\u00e9").encode("latin-1")
            send(_whole(body, f"Content-Type: text/plain; charset={query['name']}"))
        elif path == "/non-utf8":
            send(_whole(b"ok \xff\xfe end", "Content-Type: text/plain; charset=utf-8"))
        elif path == "/utf8-across-cap":
            send(_whole("a\u00e9\u00e9".encode(), "Content-Type: text/plain; charset=utf-8"))
        elif path == "/short":
            send(_head("200 OK", "Content-Length: 1000") + b"0123456789")
        elif path == "/bad-chunked":
            send(_head("200 OK", "Transfer-Encoding: chunked") + b"zz\r\nhello\r\n0\r\n\r\n")
        elif path == "/cut-chunked":
            send(_head("200 OK", "Transfer-Encoding: chunked") + b"5\r\nhello\r\n")
        elif path == "/garbage-status":
            send(b"GARBAGE\r\n\r\n")
        elif path == "/bad-header-line":
            send(b"HTTP/1.1 200 OK\r\nno colon in this line\r\nContent-Length: 0\r\n\r\n")
        elif path == "/huge-header":
            send(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 200_000 + b"\r\nContent-Length: 0\r\n\r\n")
        elif path == "/switch":
            send(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\nstuff")
        elif path == "/http2-preface":
            send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        elif path == "/two-lengths":
            send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nokk")
        elif path == "/negative-length":
            send(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nok")
        elif path == "/http10-until-close":
            send(b"HTTP/1.0 200 OK\r\n\r\nuntil close")
        elif path == "/continue-first":
            send(b"HTTP/1.1 100 Continue\r\n\r\n" + _whole(b"ok"))
        elif path == "/close":
            pass
        elif path == "/half-head":
            send(b"HTTP/1.1 200 OK\r\nContent-Ty")
        elif path == "/reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        elif path == "/br-head":
            send(_head("200 OK", "Content-Encoding: br", "Content-Length: 10"))
        elif path == "/redirect":
            location = [f"Location: {query['to']}"] if query.get("to") else []
            send(_head(f"{query.get('status', '302')} Moved", *location, "Content-Length: 0"))
        else:
            send(_whole(b"not found"))


@pytest.fixture(scope="module")
def server() -> Iterator[_Misbehaving]:
    running = _Misbehaving()
    yield running
    running.stop()


LOOPBACK = HttpPolicy(allowed_domains=("127.0.0.1",), allow_loopback=True, max_bytes=100_000, timeout_s=5.0)


def _fetch(policy: HttpPolicy, url: str, method: str = "GET", **kw: object) -> HttpResult:
    return asyncio.run(http_request(policy, method, url, **kw))  # type: ignore[arg-type]


def _refusal(policy: HttpPolicy, url: str, method: str = "GET") -> str:
    with pytest.raises(ToolError) as caught:
        _fetch(policy, url, method)
    assert type(caught.value) is ToolError
    message = str(caught.value)
    for leak in ("httpx", "httpcore", "h11", "Error", "Exception", "https://www", "For more information"):
        assert leak not in message
    return message


# --- the deadline -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "timeout_s"),
    [
        ("/trickle-body", 0.6),  # headers at once, then a byte every 0.1 s: no single read times out
        ("/trickle-head", 0.6),  # the status line itself a byte every 0.1 s
        ("/slow-redirect?n=4", 0.6),  # each hop 0.25 s, well inside httpx's per-read timeout
    ],
)
def test_the_deadline_covers_the_whole_exchange(server: _Misbehaving, path: str, timeout_s: float) -> None:
    policy = HttpPolicy(allowed_domains=("127.0.0.1",), allow_loopback=True, timeout_s=timeout_s)
    started = time.monotonic()
    message = _refusal(policy, server.url(path))
    elapsed = time.monotonic() - started
    assert f"took longer than {timeout_s:g} s" in message
    assert timeout_s <= elapsed < timeout_s + 0.75


def test_a_quick_enough_redirect_chain_succeeds(server: _Misbehaving) -> None:
    policy = HttpPolicy(allowed_domains=("127.0.0.1",), allow_loopback=True, timeout_s=3.0)
    result = _fetch(policy, server.url("/slow-redirect?n=2"))
    assert (result.status, result.body, result.url) == (200, "hello", server.url("/ok"))


# --- decompression ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/bomb", "/deflate-bomb", "/raw-deflate-bomb", "/endless-gzip"])
def test_compression_bombs_stop_at_the_cap_in_bounded_memory(server: _Misbehaving, path: str) -> None:
    policy = HttpPolicy(allowed_domains=("127.0.0.1",), allow_loopback=True, max_bytes=MiB, timeout_s=10.0)

    async def measured() -> tuple[HttpResult, int]:
        # Measured inside the loop: asyncio.run's own teardown reprs the result (a CPython quirk).
        tracemalloc.start()
        try:
            result = await http_request(policy, "GET", server.url(path))
            return result, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    result, peak = asyncio.run(measured())
    assert (result.status, result.truncated, len(result.body)) == (200, True, MiB)
    assert result.body == "\0" * MiB
    # The bomb is 50 MiB; what may be held is the capped body as bytes, a copy while decoding
    # the text, and the text: about 3 MiB.
    assert peak < 4 * MiB, f"peak {peak / MiB:.1f} MiB"


def test_an_endless_plain_body_stops_at_the_cap(server: _Misbehaving) -> None:
    result = _fetch(LOOPBACK, server.url("/endless"))
    assert (result.truncated, result.body) == (True, "z" * 100_000)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/layered", "gzip then deflate: ok"),
        ("/raw-deflate", "raw deflate text"),
        ("/x-gzip", "hello, compressed world"),
        ("/identity", "plain"),
    ],
)
def test_known_encodings_are_decoded(server: _Misbehaving, path: str, body: str) -> None:
    result = _fetch(LOOPBACK, server.url(path))
    assert (result.status, result.body, result.truncated) == (200, body, False)


def test_we_ask_only_for_encodings_we_decode_and_set_host_ourselves(server: _Misbehaving) -> None:
    headers = {"Accept-Encoding": "br, zstd", "Host": "evil.example", "X-Fine": " kept "}
    result = _fetch(LOOPBACK, server.url("/echo"), headers=headers)
    echoed = json.loads(result.body)["headers"]
    assert echoed["accept-encoding"] == "gzip, deflate"
    assert echoed["host"] == f"127.0.0.1:{server.port}"
    assert echoed["x-fine"] == "kept"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/triple", r"stacks 3 content encodings \(gzip, gzip, gzip\); at most 2 are decoded"),
        ("/encoding?name=br", r"Content-Encoding 'br', which this tool does not decode"),
        ("/encoding?name=zstd", r"Content-Encoding 'zstd', which this tool does not decode"),
        ("/encoding?name=compress", r"Content-Encoding 'compress', which this tool does not decode"),
        ("/encoding?name=x-nonsense", r"Content-Encoding 'x-nonsense', which this tool does not decode"),
        ("/encoding?name=gzip,%20br", r"Content-Encoding 'br', which this tool does not decode"),
        ("/bad-gzip", "the body is not valid gzip data"),
        ("/cut-gzip", "the body ends in the middle of its gzip data"),
    ],
)
def test_unknown_or_broken_encodings_are_refused(server: _Misbehaving, path: str, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        _fetch(LOOPBACK, server.url(path))


def test_an_unknown_encoding_without_a_body_is_no_problem(server: _Misbehaving) -> None:
    result = _fetch(LOOPBACK, server.url("/br-head"), "HEAD")
    assert (result.status, result.body) == (200, "")


# --- charsets -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("name=x-nonsense", "declares charset 'x-nonsense', not a known text encoding"),
        ("name=rot13", "declares charset 'rot13', not a known text encoding"),
        ("name=zlib", "declares charset 'zlib', not a known text encoding"),
        ("name=base64", "declares charset 'base64', not a known text encoding"),
        ("name=utf-99", "declares charset 'utf-99', not a known text encoding"),
        ("name=undefined", "the body cannot be decoded as undefined"),
        ("name=idna&body=%FF%FE", "the body cannot be decoded as idna"),
    ],
)
def test_unknown_charsets_are_refused_by_name(server: _Misbehaving, query: str, message: str) -> None:
    assert message in _refusal(LOOPBACK, server.url(f"/charset?{query}"))


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/charset?name=latin-1", "caf\u00e9"),
        ("/charset?name=ISO-8859-15&body=%A4", "\u20ac"),
        ("/charset?name=%22utf-8%22&body=ok", "ok"),
        ("/charset?name=%22%22&body=ok", "ok"),  # an empty charset is none: UTF-8
        ("/non-utf8", "ok \ufffd\ufffd end"),
    ],
)
def test_known_charsets_decode_and_invalid_bytes_become_replacement_characters(
    server: _Misbehaving, path: str, body: str
) -> None:
    assert _fetch(LOOPBACK, server.url(path)).body == body


def test_a_character_cut_by_the_cap_is_dropped(server: _Misbehaving) -> None:
    policy = HttpPolicy(allowed_domains=("127.0.0.1",), allow_loopback=True, max_bytes=4)
    result = _fetch(policy, server.url("/utf8-across-cap"))  # a, é, é: 5 bytes, cut after 4
    assert (result.body, result.truncated) == ("a\u00e9", True)


# --- broken HTTP --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/short", "the server closed the connection after 10 of the 1000 body bytes it announced"),
        ("/bad-chunked", "the server's chunked body is malformed or ends before its last chunk"),
        ("/cut-chunked", "the server's chunked body is malformed or ends before its last chunk"),
        ("/garbage-status", "the server's status line or headers are not valid HTTP"),
        ("/bad-header-line", "the server's status line or headers are not valid HTTP"),
        ("/huge-header", "the server's status line and headers are too large"),
        ("/switch", "the server's status line or headers are not valid HTTP"),
        ("/http2-preface", "the server's status line or headers are not valid HTTP"),
        ("/two-lengths", "the server's status line or headers are not valid HTTP"),
        ("/negative-length", "the server's status line or headers are not valid HTTP"),
        ("/close", "the server closed the connection before sending a complete status line and headers"),
        ("/half-head", "the server closed the connection before sending a complete status line and headers"),
        ("/redirect?to=http://%5B::1/", "redirects to 'http://[::1/', not a valid URL"),
        ("/redirect?to=http://127.0.0.1:99999/", "has an invalid port"),
        ("/redirect?to=gopher://127.0.0.1/", "only http and https URLs are allowed"),
    ],
)
def test_broken_http_becomes_a_tool_error_in_our_words(server: _Misbehaving, path: str, message: str) -> None:
    assert message in _refusal(LOOPBACK, server.url(path))


@pytest.mark.parametrize(
    ("path", "status", "body"),
    [
        ("/http10-until-close", 200, "until close"),
        ("/continue-first", 200, "ok"),
        ("/redirect?status=302&to=", 302, ""),  # no Location to follow: the 302 itself
    ],
)
def test_odd_but_valid_http_gives_a_result(server: _Misbehaving, path: str, status: int, body: str) -> None:
    result = _fetch(LOOPBACK, server.url(path))
    assert (result.status, result.body) == (status, body)


def test_a_reset_connection_is_a_tool_error(server: _Misbehaving) -> None:
    message = _refusal(LOOPBACK, server.url("/reset"))
    assert message.endswith(
        ("before sending a complete status line and headers", "broke before the response arrived")
    )


def test_a_closed_port_is_a_tool_error() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    message = _refusal(LOOPBACK, f"http://127.0.0.1:{port}/")
    assert message.endswith(f"127.0.0.1 (127.0.0.1 port {port}) refused the connection")


def test_credentials_do_not_follow_a_redirect_to_another_host(server: _Misbehaving) -> None:
    policy = HttpPolicy(allowed_domains=("127.0.0.1", "localhost"), allow_loopback=True)
    secret = {
        "Authorization": "Bearer s3cret",
        "Cookie": "session=1",
        "X-Api-Key": "k3y",
        "Private-Token": "t0ken",
        "Accept": "application/json",
        "User-Agent": "probe",
    }
    same = _fetch(policy, server.url("/redirect?to=/echo"), headers=secret)
    here = json.loads(same.body)["headers"]
    assert (here["authorization"], here["x-api-key"], here["private-token"]) == (
        "Bearer s3cret",
        "k3y",
        "t0ken",
    )
    elsewhere = f"http://localhost:{server.port}/echo"
    moved = _fetch(policy, server.url(f"/redirect?to={elsewhere}"), headers=secret)
    echoed = json.loads(moved.body)["headers"]
    sent_on = {name for name in ("authorization", "cookie", "x-api-key", "private-token") if name in echoed}
    assert (sent_on, echoed["accept"], echoed["user-agent"]) == (set(), "application/json", "probe")


def test_a_303_turns_a_post_into_a_get_without_its_body(server: _Misbehaving) -> None:
    result = _fetch(LOOPBACK, server.url("/redirect?status=303&to=/echo"), "POST", body="secret")
    echoed = json.loads(result.body)
    assert (echoed["method"], echoed["body"]) == ("GET", "")


# --- fuzzing ------------------------------------------------------------------------------------

FUZZ = HttpPolicy(allowed_domains=("*",), allow_loopback=True, max_bytes=2000, timeout_s=2.0)
QUICK_PATHS = [
    "/ok", "/echo", "/layered", "/raw-deflate", "/triple", "/bad-gzip", "/cut-gzip", "/short",
    "/bad-chunked", "/cut-chunked", "/garbage-status", "/bad-header-line", "/close", "/half-head",
    "/non-utf8", "/charset?name=x-nonsense", "/charset?name=undefined", "/encoding?name=br",
    "/redirect?to=/ok", "/redirect?to=http://%5B::1/", "/redirect?to=http://169.254.169.254/",
    "/deflate-bomb", "/endless",
]  # fmt: skip


def _outcome(policy: HttpPolicy, method: object, url: object, headers: object, body: object) -> None:
    """Only a result within the cap or a `ToolError` in our words may come out."""
    try:
        result = asyncio.run(http_request(policy, method, url, headers, body))  # type: ignore[arg-type]
    except ToolError as exc:
        assert type(exc) is ToolError
        ours = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "", str(exc))  # without quoted input
        assert not any(leak in ours for leak in ("httpx", "httpcore", "h11", "Error", "Traceback")), str(exc)
        return
    assert isinstance(result, HttpResult)
    assert len(result.body) <= policy.max_bytes  # each character decoded from at least one byte


def _urls(port: int) -> st.SearchStrategy[str]:
    scheme = st.sampled_from(["http", "https", "HTTP", "ftp", "", "http:", "javascript"])
    host = st.one_of(
        st.sampled_from(
            ["127.0.0.1", "localhost", "[::1]", "[::ffff:127.0.0.1]", "0.0.0.0", "[::]", "127.1"]
        ),
        st.text(max_size=30),
    )
    ports = st.one_of(
        st.just(f":{port}"),
        st.sampled_from([":0", ":65536", ":-1", ":", f":{port}:{port}", ":99999999999999999999"]),
        st.text(alphabet="0123456789abc+- ", min_size=1, max_size=8).map(lambda p: f":x{p}"),
    )
    path = st.one_of(st.sampled_from(QUICK_PATHS), st.text(max_size=40).map(lambda p: "/" + p))
    built = st.builds(lambda s, h, p, q: f"{s}://{h}{p}{q}", scheme, host, ports, path)
    return st.one_of(built, st.text(max_size=80))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_arguments_give_a_result_or_a_tool_error(server: _Misbehaving, data: st.DataObject) -> None:
    url = data.draw(_urls(server.port), label="url")
    method = data.draw(
        st.one_of(
            st.sampled_from(["GET", "get", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"]), st.text(max_size=8)
        ),
        label="method",
    )
    headers = data.draw(
        st.one_of(st.none(), st.dictionaries(st.text(max_size=12), st.text(max_size=30), max_size=4)),
        label="headers",
    )
    body = data.draw(st.one_of(st.none(), st.text(max_size=200)), label="body")
    _outcome(FUZZ, method, url, headers, body)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(QUICK_PATHS),
    method=st.sampled_from(["GET", "HEAD", "POST", "DELETE"]),
    max_bytes=st.integers(1, 5000),
    header_value=st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
)
def test_fuzzed_requests_against_misbehaving_paths(
    server: _Misbehaving, path: str, method: str, max_bytes: int, header_value: str
) -> None:
    policy = HttpPolicy(
        allowed_domains=("127.0.0.1",), allow_loopback=True, max_bytes=max_bytes, timeout_s=2.0
    )
    _outcome(
        policy, method, server.url(path), {"X-Fuzz": header_value}, "a body" if method == "POST" else None
    )
