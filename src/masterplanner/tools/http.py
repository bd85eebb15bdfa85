"""`http_request`: HTTP(S) to allowlisted domains, never to the machine's own or private networks.

Every hop (the first request and each redirect, followed by hand, at most 5) is checked the same
way: http or https only, no user:password in the URL, a well-formed host on the allowlist, and
every address the host resolves to public and not one of this machine's own. The host string is
never trusted (`127.1`, `0x7f.1` and `2130706433` all reach loopback through `getaddrinfo`): the
resolved addresses are checked, and the connection goes to the checked address itself (TLS still
verifies the host name), so a DNS answer cannot change between the check and the connection.
Refused: loopback (unless `allow_loopback`, for tests), the unspecified address, private,
link-local, site-local, unique-local, multicast and broadcast addresses, every IPv6 form that
carries an IPv4 address (mapped, translated, compatible, NAT64 and its local-use range, 6to4,
Teredo), and any address bound to one of this machine's interfaces, public or not. When a redirect
leaves the site (scheme, host and port) a request was sent to, only headers that describe what is
wanted go on (`Accept`, `Content-Type`, `User-Agent`, ...); every other header, which may carry a
credential of any name, stays behind.

What comes back is bounded the same way whatever the server does:

- one deadline, `timeout_s`, covers resolving, connecting, the headers and the body of every hop
  together (a server trickling one byte a second is cut off at the deadline);
- the body is read raw and decoded here (identity, gzip, x-gzip, deflate; at most two layers;
  `br`, which the standard library cannot decode with a bound, and anything else is refused; we
  send `Accept-Encoding: gzip, deflate`), never holding more than `max_bytes` of decoded data,
  so a compression bomb is cut at the cap and marked truncated;
- the text is decoded with the charset the response declares (UTF-8 if none). A charset Python
  does not know, or one that is not a text encoding, is refused with a `ToolError` naming it;
  bytes that are invalid in a known charset become U+FFFD, so the agent still gets the text.

Whatever goes wrong — a malformed URL or header, a broken or hostile server — the caller gets a
`ToolError` saying what, in this module's words; nothing else escapes (except cancellation).
"""

from __future__ import annotations

import asyncio
import codecs
import errno
import functools
import ipaddress
import re
import socket
import ssl
import zlib
from dataclasses import dataclass, field
from typing import TypeAlias
from urllib.parse import SplitResult, urljoin, urlsplit, urlunsplit

import httpx

from .._version import __version__
from ..errors import ToolError
from ..redaction import without_cut_secret

__all__ = ["HttpPolicy", "HttpResult", "check_request", "http_request"]

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Set by us (Host, framing, and Accept-Encoding: only what `_Inflate` can decode with a bound).
_DROPPED_HEADERS = frozenset(
    {"host", "connection", "transfer-encoding", "content-length", "upgrade", "te", "accept-encoding"}
)
_ACCEPT_ENCODING = "gzip, deflate"
# What a request keeps when a redirect takes it to another site: headers that say what is wanted,
# never who asks. Any other header may be a credential (`X-Api-Key`, `Private-Token`, ...) meant
# for the first site only, so it stays behind.
_KEPT_ACROSS_SITES = frozenset(
    {"accept", "accept-language", "content-language", "content-type", "user-agent", "cache-control", "pragma"}
)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# host[:port], the host bracketed if it is an IPv6 literal (`urlsplit` lets `[::1]x` through as ::1).
_NETLOC = re.compile(r"(\[[^\[\]]*\]|[^\[\]:]*)(:[^:]*)?")
_MAX_URL = 8192
_CHUNK = 64 * 1024
_MAX_LAYERS = 2

_Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address

# IPv6 ranges that carry an IPv4 address (a way to reach an IPv4 host the IPv4 checks would refuse).
_CARRIES_IPV4 = (
    (ipaddress.ip_network("::ffff:0:0/96"), "IPv4-mapped"),
    (ipaddress.ip_network("::ffff:0:0:0/96"), "IPv4-translated"),
    (ipaddress.ip_network("::/96"), "IPv4-compatible"),
    (ipaddress.ip_network("64:ff9b::/96"), "NAT64"),
    (ipaddress.ip_network("64:ff9b:1::/48"), "NAT64 local-use"),
    (ipaddress.ip_network("2002::/16"), "6to4"),
    (ipaddress.ip_network("2001::/32"), "Teredo"),
)
# Named here rather than left to `is_global`, whose lists vary between Python versions.
_NOT_PUBLIC = (
    (ipaddress.ip_network("0.0.0.0/8"), "a 'this network' address (0.0.0.0/8)"),
    (ipaddress.ip_network("255.255.255.255/32"), "the broadcast address"),
    (ipaddress.ip_network("fec0::/10"), "a site-local address"),
    (ipaddress.ip_network("fc00::/7"), "a unique-local address"),
    (ipaddress.ip_network("fe80::/10"), "a link-local address"),
    (ipaddress.ip_network("169.254.0.0/16"), "a link-local address"),
)


@dataclass(frozen=True)
class HttpPolicy:
    """Where `http_request` may go, and how much it may take."""

    allowed_domains: tuple[str, ...] = ()
    """Domains (and subdomains) requests may reach; `*` allows any (addresses are still checked)."""
    allow_loopback: bool = False
    """Let requests reach 127.0.0.0/8 and ::1 — for tests only."""
    max_bytes: int = 1_000_000
    """The most decoded body kept; the rest is dropped and the result marked truncated."""
    timeout_s: float = 20.0
    """The whole request, redirects included, from resolving the host to the last body byte."""
    max_redirects: int = 5


@dataclass(frozen=True)
class HttpResult:
    """A response as the agent sees it."""

    status: int
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    body: str = field(default="", repr=False)  # a 1 MB body need not be printed with the result
    truncated: bool = False

    def describe(self) -> str:
        """Status line, a few headers and the body, with truncation marked.

        A body cut at the cap ends before what may be a secret the cap fell inside: what was left
        of it had neither its shape nor its value, and was shown (`without_cut_secret`).
        """
        shown = {
            k: v
            for k, v in self.headers.items()
            if k.lower() in ("content-type", "content-length", "location")
        }
        head = f"HTTP {self.status} from {self.url}" + "".join(f"\n{k}: {v}" for k, v in shown.items())
        if self.truncated:
            return f"{head}\n\n{without_cut_secret(self.body)}\n[… truncated]"
        return f"{head}\n\n{self.body}"


@dataclass(frozen=True)
class _Hop:
    """One checked request target: where to connect and what to call it."""

    url: str
    scheme: str
    host: str
    """The host in ASCII (IDNA) form, as resolved, sent in `Host` and as the TLS server name."""
    port: int
    address: str
    target: str
    """The URL with the checked address in place of the host."""
    host_header: str


def _shown(text: str, limit: int = 200) -> str:
    """`text` quoted for a message, shortened if long."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "…"


# --- the URL and its host ------------------------------------------------------------------------


def _ascii_host(host: str, bracketed: bool, url: str) -> str:
    """`host` (from `urlsplit`, lower-cased) as an IPv6 literal or an ASCII name, else `ToolError`."""
    if bracketed or ":" in host:
        if "%" in host:
            raise ToolError(f"{_shown(url)}: IPv6 zone identifiers are not allowed")
        try:
            return str(ipaddress.IPv6Address(host))
        except ValueError:
            raise ToolError(f"{_shown(url)}: {host!r} is not a valid IPv6 address") from None
    try:
        name = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        raise ToolError(f"{_shown(url)}: {host!r} is not a valid internationalised domain name") from None
    labels = name.removesuffix(".").split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ToolError(
            f"{_shown(url)}: {host!r} is not a valid host name "
            "(labels of 1 to 63 letters, digits, '-' or '_', at most 253 characters in all)"
        )
    return name.lower()


def _split(url: object) -> SplitResult:
    """The parts of a URL that passes the syntax checks, else `ToolError`."""
    if not isinstance(url, str):
        raise ToolError(f"the URL must be text, got {type(url).__name__}")
    if len(url) > _MAX_URL:
        raise ToolError(f"the URL is longer than {_MAX_URL} characters")
    if _CONTROL.search(url):
        raise ToolError(f"{_shown(url)} contains control characters (tab, newline, NUL, …)")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ToolError(f"{_shown(url)} is not a valid URL: its host part cannot be parsed") from None
    if parts.scheme not in ("http", "https"):
        raise ToolError(f"{_shown(url)}: only http and https URLs are allowed")
    if "@" in parts.netloc:
        raise ToolError(f"{_shown(url)}: URLs with a user name or password are refused")
    if not _NETLOC.fullmatch(parts.netloc):
        raise ToolError(f"{_shown(url)} is not a valid URL: its host part cannot be parsed")
    return parts


def _port(parts: SplitResult, url: str) -> int:
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ToolError(f"{_shown(url)} has an invalid port (it must be a number from 1 to 65535)")
    return port or (443 if parts.scheme == "https" else 80)


def _allowed(host: str, domains: tuple[str, ...]) -> bool:
    host = host.rstrip(".")
    for entry in domains:
        if entry.strip() == "*":
            return True
        domain = entry.strip().lstrip("*.").rstrip(".").lower()
        try:
            domain = domain.encode("idna").decode("ascii")
        except UnicodeError:
            continue
        if domain and (host == domain or host.endswith("." + domain)):
            return True
    return False


# --- the addresses it resolves to ----------------------------------------------------------------


def _own_address(address: _Address) -> str | None:
    """Why `address` counts as this machine's own, or None if it does not.

    Binding a fresh socket to an address succeeds exactly when the address is assigned to one of
    this machine's interfaces (the kernel answers EADDRNOTAVAIL otherwise), which covers every
    interface, public or not, without listing them. Any other failure refuses: better a wrong
    refusal than a request to this machine.
    """
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        probe = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return None  # no socket of this family here: this machine has no such address
    with probe:
        try:
            probe.bind((str(address), 0))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return None
            return "an address this machine could not check against its own"
    return "one of this machine's own addresses"


def _refusal(address: _Address, policy: HttpPolicy) -> str | None:
    """Why connecting to `address` is refused, or None."""
    if address.is_unspecified:
        return "the unspecified address (it reaches this machine)"
    if address.is_loopback:
        return None if policy.allow_loopback else "a loopback address"
    if isinstance(address, ipaddress.IPv6Address):
        for network, kind in _CARRIES_IPV4:
            if address in network:
                return f"an IPv6 address that carries an IPv4 address ({kind})"
    if address.is_multicast:
        return "a multicast address"
    for network, kind in _NOT_PUBLIC:
        if address.version == network.version and address in network:
            return kind
    # Before `is_global`: an address of this machine is refused even where it is public, and saying
    # "this machine's own" is the truer reason for, say, the machine's documentation-range address.
    own = _own_address(address)
    if own:
        return own
    if not address.is_global:
        return "not a public address"
    return None


def _allowed_url(url: str, policy: HttpPolicy) -> tuple[SplitResult, str, int]:
    """The URL's parts, host and port if it is well formed and its host is allowed, else `ToolError`."""
    parts = _split(url)
    if not parts.hostname:
        raise ToolError(f"{_shown(url)} has no host")
    host = _ascii_host(parts.hostname, parts.netloc.startswith("["), url)
    port = _port(parts, url)
    if not _allowed(host, policy.allowed_domains):
        allowed = ", ".join(policy.allowed_domains) or "none configured"
        raise ToolError(
            f"{host!r} is not on the HTTP allowlist (allowed: {allowed}; setting http_allowed_domains)"
        )
    return parts, host, port


def check_request(
    policy: HttpPolicy, method: str, url: str, headers: dict[str, str] | None, body: str | None
) -> None:
    """Refuse (`ToolError`) a request whose arguments or URL no answer could make acceptable.

    The checks that need no network: the method, headers and body, the URL's form and the
    allowlist. Where the host resolves to is checked when the request is made (and on every
    redirect).
    """
    _checked_arguments(method, headers, body)
    _allowed_url(url, policy)


async def _checked_hop(url: str, policy: HttpPolicy) -> _Hop:
    """Where to send a request for `url`, if it passes every check, else `ToolError`."""
    parts, host, port = _allowed_url(url, policy)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "the lookup failed"
        raise ToolError(f"{host!r} does not resolve: {reason}") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not addresses:
        raise ToolError(f"{host!r} does not resolve")
    for address in addresses:
        reason = _refusal(address, policy)
        if reason:
            raise ToolError(f"{host!r} resolves to {address}, {reason}; refused")
    literal = f"[{addresses[0]}]" if addresses[0].version == 6 else str(addresses[0])
    name = f"[{host}]" if ":" in host else host
    return _Hop(
        url=url,
        scheme=parts.scheme,
        host=host,
        port=port,
        address=str(addresses[0]),
        target=urlunsplit((parts.scheme, f"{literal}:{port}", parts.path or "/", parts.query, "")),
        host_header=name if parts.port is None else f"{name}:{port}",
    )


# --- the arguments -------------------------------------------------------------------------------


def _checked_arguments(
    method: object, headers: object, body: object
) -> tuple[str, dict[str, str], bytes | None]:
    """(method, headers to send, body bytes) if the arguments are well formed, else `ToolError`."""
    if not isinstance(method, str) or method.upper() not in _METHODS:
        shown = _shown(method, 40) if isinstance(method, str) else type(method).__name__
        raise ToolError(f"method must be one of {', '.join(sorted(_METHODS))}, got {shown}")
    if headers is not None and not isinstance(headers, dict):
        raise ToolError(f"headers must be a mapping of names to values, got {type(headers).__name__}")
    sent: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            shown = _shown(name, 60) if isinstance(name, str) else type(name).__name__
            raise ToolError(f"header name {shown} is not valid (ASCII letters, digits and !#$%&'*+-.^_`|~)")
        if not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value):
            raise ToolError(f"the value of header {name!r} must be printable ASCII text without line breaks")
        if name.lower() not in _DROPPED_HEADERS:
            sent[name] = value.strip(" \t")
    if body is None:
        return method.upper(), sent, None
    if not isinstance(body, str):
        raise ToolError(f"body must be text, got {type(body).__name__}")
    try:
        return method.upper(), sent, body.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError("body is not valid Unicode text (it contains unpaired surrogates)") from None


# --- the body ------------------------------------------------------------------------------------


class _Passthrough:
    """The identity layer: bytes out as they came in, as many as asked for."""

    encoding = "identity"
    finished = complete = True  # nothing of its own to finish

    def __init__(self) -> None:
        self._pending = b""

    def give(self, data: bytes) -> None:
        self._pending += data

    def take(self, limit: int) -> bytes:
        out, self._pending = self._pending[:limit], self._pending[limit:]
        return out


class _Inflate:
    """One gzip or deflate layer, decoded only as far as asked (zlib's `max_length`)."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        gzip = encoding in ("gzip", "x-gzip")
        self._raw_fallback = not gzip  # `deflate` is meant to be zlib-wrapped; some servers send it raw
        self._inflater = zlib.decompressobj(zlib.MAX_WBITS | 16 if gzip else zlib.MAX_WBITS)
        self._pending = b""
        self.started = False

    @property
    def finished(self) -> bool:
        """The compressed stream has ended (what follows it is ignored)."""
        return self._inflater.eof

    @property
    def complete(self) -> bool:
        """Nothing was left half-decoded: the stream ended, or there never was one."""
        return self._inflater.eof or not self.started

    def give(self, data: bytes) -> None:
        self.started = self.started or bool(data)
        self._pending += data

    def take(self, limit: int) -> bytes:
        """Up to `limit` decoded bytes from the input given so far."""
        if self._inflater.eof or (self._raw_fallback and len(self._pending) < 2):
            return b""  # after the end of the stream, or too little to tell zlib from raw deflate
        try:
            out = self._inflater.decompress(self._pending, limit)
        except zlib.error:
            if not self._raw_fallback:
                raise ToolError(f"the body is not valid {self.encoding} data") from None
            self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)
            self._raw_fallback = False
            return self.take(limit)
        self._raw_fallback = False  # zlib accepted the two-byte header
        self._pending = self._inflater.unconsumed_tail
        return out


class _Decoder:
    """Undoes a response's Content-Encoding layers, pulling data through them on demand.

    Each layer holds at most one chunk of input and zlib's window, and hands on no more than
    asked for, so memory stays bounded however much the data expands.
    """

    def __init__(self, content_encoding: list[str]) -> None:
        names = [name.strip().lower() for name in content_encoding]
        names = [name for name in names if name not in ("", "identity")]
        self.problem: str | None = None
        unknown = [name for name in names if name not in ("gzip", "x-gzip", "deflate")]
        if unknown:
            self.problem = (
                f"the response uses Content-Encoding {_shown(unknown[0], 40)}, "
                "which this tool does not decode (it decodes gzip and deflate)"
            )
        elif len(names) > _MAX_LAYERS:
            self.problem = (
                f"the response stacks {len(names)} content encodings ({', '.join(names)}); "
                f"at most {_MAX_LAYERS} are decoded"
            )
        # Applied in the listed order, so undone last-first.
        self._layers: list[_Passthrough | _Inflate] = [_Passthrough()]
        if not self.problem:
            self._layers += [_Inflate(name) for name in reversed(names)]

    def give(self, raw: bytes) -> None:
        """Raw body bytes, as they arrive; `ToolError` if the encoding is one refused."""
        if self.problem and raw:
            raise ToolError(self.problem)
        self._layers[0].give(raw)

    def take(self, limit: int) -> bytes:
        """Up to `limit` decoded bytes; empty when everything given so far is decoded."""
        return self._pull(len(self._layers) - 1, limit)

    def _pull(self, index: int, limit: int) -> bytes:
        layer = self._layers[index]
        got = layer.take(limit)
        while not got and index > 0 and not layer.finished:
            upstream = self._pull(index - 1, _CHUNK)
            if not upstream:
                break
            layer.give(upstream)
            got = layer.take(limit)
        return got

    def check_complete(self) -> None:
        """`ToolError` if a layer's data stopped before its end (the whole body was read)."""
        for layer in self._layers:
            if not layer.complete:
                raise ToolError(f"the body ends in the middle of its {layer.encoding} data")


async def _read_body(
    response: httpx.Response, policy: HttpPolicy, request: str, hop: _Hop
) -> tuple[bytearray, bool]:
    """The decoded body, at most `max_bytes` of it, and whether more was dropped."""
    decoder = _Decoder(response.headers.get_list("content-encoding", split_commas=True))
    data = bytearray()
    # Raw bytes are bounded too: a stream of compressed nothing would otherwise run to the deadline.
    raw_read, raw_limit = 0, 2 * policy.max_bytes + _CHUNK
    try:
        async for chunk in response.aiter_raw():
            raw_read += len(chunk)
            decoder.give(chunk)
            # A chunk at a time, one byte past the cap at most (that byte says there was more).
            while piece := decoder.take(min(_CHUNK, policy.max_bytes + 1 - len(data))):
                data += piece
                if len(data) > policy.max_bytes:
                    del data[policy.max_bytes :]
                    return data, True
            if raw_read > raw_limit:
                return data, True
    except httpx.TimeoutException:
        raise
    except httpx.HTTPError as exc:
        problem = _body_problem(exc, response, raw_read) or _transport_problem(exc, hop, True)
        raise ToolError(f"{request}: {problem}") from None
    decoder.check_complete()
    return data, False


def _text(data: bytes | bytearray, charset: str | None, truncated: bool) -> str:
    """`data` decoded with the declared charset (UTF-8 if none); `ToolError` if it is unknown."""
    name = charset or "utf-8"
    try:
        info = codecs.lookup(name)
        if not info._is_text_encoding:
            raise LookupError(name)
        decoder = codecs.getincrementaldecoder(info.name)(errors="replace")
    except (LookupError, ValueError):
        raise ToolError(
            f"the response declares charset {_shown(name, 60)}, not a known text encoding"
        ) from None
    try:
        # Not final when truncated: a character the cap cut in half is dropped, not replaced.
        return decoder.decode(data, final=not truncated)
    except (UnicodeError, ValueError):
        raise ToolError(f"the body cannot be decoded as {info.name}") from None


# --- the exchange --------------------------------------------------------------------------------


def _transport_problem(exc: httpx.HTTPError, hop: _Hop, reading_body: bool) -> str:
    """What went wrong, in words, for an httpx error while sending or reading."""
    where = f"{hop.host} ({hop.address} port {hop.port})"
    if isinstance(exc, httpx.ConnectError):
        causes = _causes(exc)
        if any(isinstance(c, ssl.SSLCertVerificationError) for c in causes):
            return f"the TLS certificate of {where} could not be verified"
        if any(isinstance(c, ssl.SSLError) for c in causes):
            return f"the TLS handshake with {where} failed"
        if any(isinstance(c, ConnectionRefusedError) for c in causes):
            return f"{where} refused the connection"
        return f"could not connect to {where}"
    if isinstance(exc, httpx.RemoteProtocolError):
        if reading_body:
            return "the server's body ended early or its framing (Content-Length or chunked) is broken"
        hints = [getattr(c, "error_status_hint", None) for c in _causes(exc)]
        if 431 in hints:
            return "the server's status line and headers are too large"
        if any(hints):
            return "the server's status line or headers are not valid HTTP"
        return "the server closed the connection before sending a complete status line and headers"
    if isinstance(exc, httpx.NetworkError | httpx.ProtocolError):
        return f"the connection to {where} broke " + (
            "while reading the body" if reading_body else "before the response arrived"
        )
    return f"the request to {where} failed"


def _causes(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(found) < 10:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _body_problem(exc: httpx.HTTPError, response: httpx.Response, received: int) -> str | None:
    """A sharper account of a body that ended early, when the headers say how long it was."""
    if not isinstance(exc, httpx.RemoteProtocolError):
        return None
    if "chunked" in response.headers.get("transfer-encoding", "").lower():
        return "the server's chunked body is malformed or ends before its last chunk"
    length = response.headers.get("content-length", "")
    if length.isascii() and length.isdigit():
        return f"the server closed the connection after {received} of the {length} body bytes it announced"
    return None


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context for every request (building one loads the CA bundle)."""
    return httpx.create_ssl_context(trust_env=False)


async def _exchange(
    transport: httpx.AsyncHTTPTransport,
    policy: HttpPolicy,
    method: str,
    hop: _Hop,
    headers: dict[str, str],
    content: bytes | None,
) -> HttpResult | tuple[str, int]:
    """The response to one hop: an `HttpResult`, or where a redirect points and its status."""
    sent = httpx.Headers({"User-Agent": f"masterplanner/{__version__}", "Accept": "*/*"})
    sent.update(headers)
    sent.update({"Host": hop.host_header, "Accept-Encoding": _ACCEPT_ENCODING})
    extensions = {"sni_hostname": hop.host, "timeout": httpx.Timeout(policy.timeout_s).as_dict()}
    try:
        request = httpx.Request(method, hop.target, headers=sent, content=content, extensions=extensions)
    except httpx.InvalidURL:
        raise ToolError(f"{_shown(hop.url)} is not a valid URL") from None
    try:
        # The transport, not a client: redirects, cookies and auth stay ours to decide (a client
        # also parses every Location header, and fails on a bad one, even when not following).
        response = await transport.handle_async_request(request)
    except httpx.TimeoutException:
        raise
    except httpx.HTTPError as exc:
        raise ToolError(f"{method} {_shown(hop.url)}: {_transport_problem(exc, hop, False)}") from None
    try:
        if response.is_redirect and "location" in response.headers:
            location = response.headers["location"]
            try:
                return urljoin(hop.url, location), response.status_code
            except ValueError:
                raise ToolError(
                    f"{_shown(hop.url)} redirects to {_shown(location)}, not a valid URL"
                ) from None
        data, truncated = await _read_body(response, policy, f"{method} {_shown(hop.url)}", hop)
        text = _text(data, response.charset_encoding, truncated)
        return HttpResult(response.status_code, hop.url, dict(response.headers), text, truncated)
    finally:
        await response.aclose()


async def _follow(
    policy: HttpPolicy, method: str, url: str, headers: dict[str, str], content: bytes | None
) -> HttpResult:
    """Send the request and follow its redirects, each hop checked before it is sent."""
    hop = await _checked_hop(url, policy)  # before building a transport: most refusals need none
    async with httpx.AsyncHTTPTransport(verify=_tls_context(), trust_env=False) as transport:
        for redirects in range(policy.max_redirects + 1):
            if redirects:
                previous, hop = hop, await _checked_hop(url, policy)
                if (hop.scheme, hop.host, hop.port) != (previous.scheme, previous.host, previous.port):
                    # Credentials meant for one site do not follow a redirect to another.
                    headers = {k: v for k, v in headers.items() if k.lower() in _KEPT_ACROSS_SITES}
            outcome = await _exchange(transport, policy, method, hop, headers, content)
            if isinstance(outcome, HttpResult):
                return outcome
            url, status = outcome
            if status in (301, 302, 303) and method not in ("GET", "HEAD"):
                method, content = "GET", None
    raise ToolError(f"more than {policy.max_redirects} redirects, last to {_shown(url)}")


async def http_request(
    policy: HttpPolicy,
    method: str,
    url: str,
    headers: dict[str, str] | None = None,
    body: str | None = None,
) -> HttpResult:
    """Make one request, following up to `max_redirects` redirects (each checked).

    Raises:
        ToolError: the request was refused or failed (whatever the arguments or the server did).
    """
    method, sent, content = _checked_arguments(method, headers, body)
    try:
        async with asyncio.timeout(policy.timeout_s):
            return await _follow(policy, method, url, sent, content)
    except (TimeoutError, httpx.TimeoutException):
        raise ToolError(
            f"{method} {_shown(str(url))} took longer than {policy.timeout_s:g} s "
            "(resolving, connecting, headers and body together); stopped"
        ) from None
