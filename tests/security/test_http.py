"""`http_request` against SSRF: no spelling of a local or private address reaches a local listener.

The listener answers on every address of this machine (IPv6 and IPv4, dual stack), so a request
that slipped past a check would show up among the paths it was sent.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterator

import pytest

from _http_server import Received, Reply, Serving, http_server
from masterplanner import ToolError
from masterplanner.tools.http import HttpPolicy, http_request

pytestmark = pytest.mark.security


def _listen(request: Received) -> Reply:
    """`/loop` redirects to itself, `/redirect?to=URL` to URL, `/big` is 5,000 bytes, the rest a greeting."""
    if request.path == "/loop":
        return Reply(302, headers={"Location": "/loop"})
    if request.path.startswith("/redirect"):
        return Reply(302, headers={"Location": request.path.split("to=", 1)[1]})
    body = b"x" * 5000 if request.path == "/big" else b"hello from the listener"
    return Reply(200, body, "text/plain")


@pytest.fixture(scope="module")
def _shared_listener() -> Iterator[Serving]:
    with http_server(_listen, dual_stack=True) as server:
        yield server


@pytest.fixture
def listener(_shared_listener: Serving) -> Serving:
    _shared_listener.received.clear()
    return _shared_listener


ANY = HttpPolicy(allowed_domains=("*",))
ANY_WITH_LOOPBACK = HttpPolicy(allowed_domains=("*",), allow_loopback=True)


def _own_addresses() -> list[str]:
    """This machine's non-loopback addresses outside the ranges refused for being private anyway."""
    found = []
    for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        # A UDP "connect" only picks the source address for a route; nothing is sent.
        with socket.socket(family, socket.SOCK_DGRAM) as udp:
            try:
                udp.connect((probe, 9))
            except OSError:
                continue
            address = ipaddress.ip_address(udp.getsockname()[0])
        private_v6 = address.version == 6 and (
            address.is_link_local or address in ipaddress.ip_network("fc00::/7")
        )
        if not address.is_loopback and not private_v6:
            found.append(f"[{address}]" if address.version == 6 else str(address))
    return found


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "127.1", "0x7f.1", "2130706433", "0177.0.0.1", "[::ffff:127.0.0.1]", "[::1]", "localhost"],
)
def test_loopback_spellings_never_connect(listener: Serving, host: str) -> None:
    with pytest.raises(ToolError, match=r"refused|does not resolve"):
        asyncio.run(http_request(ANY, "GET", f"http://{host}:{listener.port}/secret"))
    assert listener.paths == []


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("[::7f00:1]", r"\(IPv4-compatible\)"),
        ("[::127.0.0.1]", r"\(IPv4-compatible\)"),
        ("[::a00:1]", r"\(IPv4-compatible\)"),
        ("[::808:808]", r"\(IPv4-compatible\)"),
        ("[::ffff:7f00:1]", r"\(IPv4-mapped\)"),
        ("[::ffff:8.8.8.8]", r"\(IPv4-mapped\)"),
        ("[::ffff:0:7f00:1]", r"\(IPv4-translated\)"),
        ("[::ffff:0:127.0.0.1]", r"\(IPv4-translated\)"),
        ("[64:ff9b::7f00:1]", r"\(NAT64\)"),
        ("[64:ff9b::8.8.8.8]", r"\(NAT64\)"),
        ("[64:ff9b:1::7f00:1]", r"\(NAT64 local-use\)"),
        ("[64:ff9b:1:ffff:ffff::1]", r"\(NAT64 local-use\)"),
        ("[2002:7f00:1::]", r"\(6to4\)"),
        ("[2002:808:808::1]", r"\(6to4\)"),
        ("[2001:0:4136:e378:8000:63bf:80ff:fffe]", r"\(Teredo\)"),
        ("[2001::1]", r"\(Teredo\)"),
        ("[fec0::1]", "a site-local address"),
        ("[feff:ffff::1]", "a site-local address"),
        ("[fc00::1]", "a unique-local address"),
        ("[fd00::2]", "a unique-local address"),
        ("[fe80::1]", "a link-local address"),
        ("[::]", "the unspecified address"),
        ("[0:0:0:0:0:0:0:0]", "the unspecified address"),
        ("0.0.0.0", "the unspecified address"),
        ("0", "the unspecified address"),
        ("0.1.2.3", r"a 'this network' address \(0.0.0.0/8\)"),
        ("0.255.255.255", r"a 'this network' address \(0.0.0.0/8\)"),
        ("169.254.169.254", "a link-local address"),
        ("100.64.0.1", "not a public address"),
        ("192.168.1.1", "not a public address"),
        ("255.255.255.255", "the broadcast address"),
        ("[ff02::1]", "a multicast address"),
        ("239.255.255.250", "a multicast address"),
    ],
)
@pytest.mark.parametrize("policy", [ANY, ANY_WITH_LOOPBACK], ids=["strict", "allow_loopback"])
def test_every_address_form_that_reaches_inside_is_refused(
    listener: Serving, host: str, message: str, policy: HttpPolicy
) -> None:
    with pytest.raises(ToolError, match=rf"resolves to .*{message}.*; refused"):
        asyncio.run(http_request(policy, "GET", f"http://{host}:{listener.port}/secret"))
    assert listener.paths == []


@pytest.mark.parametrize(
    "host", _own_addresses() or [pytest.param("none", marks=pytest.mark.skip("no address"))]
)
@pytest.mark.parametrize("policy", [ANY, ANY_WITH_LOOPBACK], ids=["strict", "allow_loopback"])
def test_the_machines_own_addresses_are_refused(listener: Serving, host: str, policy: HttpPolicy) -> None:
    with pytest.raises(ToolError, match="one of this machine's own addresses; refused"):
        asyncio.run(http_request(policy, "GET", f"http://{host}:{listener.port}/secret"))
    assert listener.paths == []


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "localhost", "127.0.0.2"])
def test_allow_loopback_still_reaches_loopback(listener: Serving, host: str) -> None:
    result = asyncio.run(http_request(ANY_WITH_LOOPBACK, "GET", f"http://{host}:{listener.port}/hello"))
    assert (result.status, result.body) == (200, "hello from the listener")
    assert listener.paths == ["/hello"]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://169.254.169.254/latest/meta-data/", "a link-local address"),
        ("http://10.0.0.1/", "not a public address"),
        ("http://[fd00::1]/", "a unique-local address"),
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


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("http://[::1/", "its host part cannot be parsed"),
        ("http://[::1]]:{port}/", "its host part cannot be parsed"),
        ("http://[::1]x:{port}/", "its host part cannot be parsed"),
        ("http://127.0.0.1:{port}:{port}/", "its host part cannot be parsed"),
        ("http://[127.0.0.1]:{port}/", "its host part cannot be parsed"),
        ("http://[v1.x]:{port}/", "'v1.x' is not a valid IPv6 address"),
        ("http://[localhost]:{port}/", "its host part cannot be parsed"),
        ("http://[fe80::1%25lo]:{port}/", "IPv6 zone identifiers are not allowed"),
        ("http://" + "a" * 64 + ".example/", "is not a valid host name"),
        ("http://" + "a." * 127 + "com/", "is not a valid host name"),
        ("http://exa mple.com/", "'exa mple.com' is not a valid host name"),
        ("http://a..b/", "'a..b' is not a valid host name"),
        ("http://exa!mple.com/", "is not a valid host name"),
        ("http://\u2488.com/", "is not a valid host name"),
        ("http://\udcff.com/", "not a valid internationalised domain name"),
        ("http://\u2603" + "x" * 70 + ".com/", "not a valid internationalised domain name"),
        ("http://127.0.0.1:65536/", "has an invalid port"),
        ("http://127.0.0.1:99999999999/", "has an invalid port"),
        ("http://127.0.0.1:0/", "has an invalid port"),
        ("http://127.0.0.1:-1/", "has an invalid port"),
        ("http://127.0.0.1:8o/", "has an invalid port"),
        ("http://:{port}/", "has no host"),
        ("http:///path", "has no host"),
        ("http://", "has no host"),
        ("http://127.0.0.1:{port}/a\nb", "contains control characters"),
        ("http://exa\tmple.com/", "contains control characters"),
        ("http://127.0.0.1:{port}/\r\nX-Injected: 1", "contains control characters"),
        ("http://127.0.0.1:{port}/\x00", "contains control characters"),
        ("http://127.0.0.1:{port}/" + "a" * 9000, "longer than 8192 characters"),
        ("javascript:alert(1)", "only http and https"),
        ("127.0.0.1:{port}/", "only http and https"),
        ("", "only http and https"),
    ],
)
def test_malformed_urls_are_refused_in_words(listener: Serving, path: str, message: str) -> None:
    url = path.replace("{port}", str(listener.port))
    with pytest.raises(ToolError, match=message) as caught:
        asyncio.run(http_request(ANY_WITH_LOOPBACK, "GET", url))
    assert type(caught.value) is ToolError
    assert "httpx" not in str(caught.value) and "Error" not in str(caught.value)
    assert listener.paths == []


@pytest.mark.parametrize(
    ("method", "headers", "body", "message"),
    [
        ("GET", {"\u00e9": "x"}, None, "header name '\u00e9' is not valid"),
        ("GET", {"": "x"}, None, "header name '' is not valid"),
        ("GET", {"X A": "x"}, None, "header name 'X A' is not valid"),
        ("GET", {"X-A:": "x"}, None, "header name 'X-A:' is not valid"),
        ("GET", {"X-A": "a\r\nInjected: 1"}, None, "header 'X-A' must be printable ASCII"),
        ("GET", {"X-A": "a\nb"}, None, "header 'X-A' must be printable ASCII"),
        ("GET", {"X-A": "caf\u00e9"}, None, "header 'X-A' must be printable ASCII"),
        ("GET", {"X-A": "\x00"}, None, "header 'X-A' must be printable ASCII"),
        ("GET", {"X-A": 5}, None, "header 'X-A' must be printable ASCII"),
        ("GET", {5: "x"}, None, "header name int is not valid"),
        ("GET", ["X-A"], None, "headers must be a mapping"),
        ("BREW", None, None, "method must be one of .*got 'BREW'"),
        ("GET\r\n", None, None, "method must be one of"),
        ("", None, None, "method must be one of"),
        (None, None, None, "method must be one of .*got NoneType"),
        ("POST", None, "\ud800", "unpaired surrogates"),
        ("POST", None, b"bytes", "body must be text, got bytes"),
    ],
)
def test_malformed_arguments_are_refused_before_sending(
    listener: Serving, method: object, headers: object, body: object, message: str
) -> None:
    url = f"http://127.0.0.1:{listener.port}/hello"
    with pytest.raises(ToolError, match=message):
        asyncio.run(http_request(ANY_WITH_LOOPBACK, method, url, headers, body))  # type: ignore[arg-type]
    assert listener.paths == []


def test_the_allowlist_is_enforced_before_resolving(listener: Serving) -> None:
    policy = HttpPolicy(allowed_domains=("example.com",), allow_loopback=True)
    with pytest.raises(ToolError, match="not on the HTTP allowlist"):
        asyncio.run(http_request(policy, "GET", f"http://127.0.0.1:{listener.port}/"))
    with pytest.raises(ToolError, match="not on the HTTP allowlist"):
        asyncio.run(http_request(policy, "GET", "http://example.com.evil.net/"))
    with pytest.raises(ToolError, match=r"'xn--bcher-kva\.example' is not on the HTTP allowlist"):
        asyncio.run(http_request(policy, "GET", "http://b\u00fccher.example/"))
    assert listener.paths == []


def test_allowed_loopback_works_and_every_redirect_is_checked(listener: Serving) -> None:
    policy = HttpPolicy(allowed_domains=("127.0.0.1",), allow_loopback=True, max_bytes=1000)
    result = asyncio.run(http_request(policy, "GET", f"http://127.0.0.1:{listener.port}/hello"))
    assert (result.status, result.body) == (200, "hello from the listener")
    big = asyncio.run(http_request(policy, "GET", f"http://127.0.0.1:{listener.port}/big"))
    assert (len(big.body), big.truncated) == (1000, True)
    targets = (
        "http://169.254.169.254/",
        "http://[::ffff:10.0.0.1]/",
        "http://evil.example/",
        "http://[::7f00:1]/",
        "http://[64:ff9b:1::a00:1]/",
        "http://0.0.0.0/",
        "http://[::1/",
    )
    for target in targets:
        with pytest.raises(ToolError, match=r"refused|allowlist|not a valid URL"):
            asyncio.run(http_request(policy, "GET", f"http://127.0.0.1:{listener.port}/redirect?to={target}"))
    assert listener.paths == ["/hello", "/big", *[f"/redirect?to={t}" for t in targets]]
    with pytest.raises(ToolError, match="more than 5 redirects"):
        asyncio.run(http_request(policy, "GET", f"http://127.0.0.1:{listener.port}/loop"))
    assert listener.paths[-6:] == ["/loop"] * 6
