"""`http_request`: HTTP(S) to allowlisted domains, never to the machine's own or private networks.

Every hop (the first request and each redirect, followed by hand, at most 5) is checked the same
way: http or https only, no user:password in the URL, the host on the allowlist, and every
address the host resolves to global. The host string is never trusted (`127.1`, `0x7f.1` and
`2130706433` all reach loopback through `getaddrinfo`): the resolved addresses are checked, and
the connection goes to the checked address itself (TLS still verifies the host name), so a DNS
answer cannot change between the check and the connection.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from ..errors import ToolError

__all__ = ["HttpPolicy", "HttpResult", "http_request"]

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_DROPPED_HEADERS = frozenset({"host", "connection", "transfer-encoding", "content-length", "upgrade", "te"})


@dataclass(frozen=True)
class HttpPolicy:
    """Where `http_request` may go, and how much it may take."""

    allowed_domains: tuple[str, ...] = ()
    """Domains (and subdomains) requests may reach; `*` allows any (addresses are still checked)."""
    allow_loopback: bool = False
    """Let requests reach 127.0.0.0/8 and ::1 — for tests only."""
    max_bytes: int = 1_000_000
    timeout_s: float = 20.0
    max_redirects: int = 5


@dataclass(frozen=True)
class HttpResult:
    """A response as the agent sees it."""

    status: int
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    truncated: bool = False

    def describe(self) -> str:
        """Status line, a few headers and the body, with truncation marked."""
        shown = {
            k: v
            for k, v in self.headers.items()
            if k.lower() in ("content-type", "content-length", "location")
        }
        head = f"HTTP {self.status} from {self.url}" + "".join(f"\n{k}: {v}" for k, v in shown.items())
        return f"{head}\n\n{self.body}" + ("\n[… truncated]" if self.truncated else "")


def _allowed(host: str, domains: tuple[str, ...]) -> bool:
    host = host.rstrip(".").lower()
    for domain in domains:
        domain = domain.strip().lstrip("*.").rstrip(".").lower() if domain != "*" else "*"
        if domain == "*" or host == domain or host.endswith("." + domain):
            return True
    return False


def _refusal(address: ipaddress.IPv4Address | ipaddress.IPv6Address, policy: HttpPolicy) -> str | None:
    """Why connecting to `address` is refused, or None."""
    if address.is_loopback:
        return None if policy.allow_loopback else "a loopback address"
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour or (address.teredo[1] if address.teredo else None)
        if address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return f"an IPv6 address carrying {embedded} (IPv4-mapped, 6to4, Teredo or NAT64)"
    if address.is_multicast:
        return "a multicast address"
    if not address.is_global:
        return "not a public address"
    return None


async def _checked_address(url: str, policy: HttpPolicy) -> tuple[str, str, int, str]:
    """(scheme, host, port, address) for a URL that passes every check, else `ToolError`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ToolError(f"{url!r}: only http and https URLs are allowed")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ToolError(f"{url!r}: URLs with a user name or password are refused")
    host = parts.hostname
    if not host:
        raise ToolError(f"{url!r} has no host")
    if not _allowed(host, policy.allowed_domains):
        allowed = ", ".join(policy.allowed_domains) or "none configured"
        raise ToolError(
            f"{host!r} is not on the HTTP allowlist (allowed: {allowed}; setting http_allowed_domains)"
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ToolError(f"{url!r} has an invalid port") from None
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ToolError(f"{host!r} does not resolve: {exc.strerror}") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not addresses:
        raise ToolError(f"{host!r} does not resolve")
    for address in addresses:
        reason = _refusal(address, policy)
        if reason:
            raise ToolError(f"{host!r} resolves to {address}, {reason}; refused")
    return parts.scheme, host, port, str(addresses[0])


async def http_request(
    policy: HttpPolicy,
    method: str,
    url: str,
    headers: dict[str, str] | None = None,
    body: str | None = None,
) -> HttpResult:
    """Make one request, following up to `max_redirects` redirects (each checked); `ToolError` if refused."""
    method = method.upper()
    if method not in _METHODS:
        raise ToolError(f"method must be one of {', '.join(sorted(_METHODS))}, got {method!r}")
    sent = {k: v for k, v in (headers or {}).items() if k.lower() not in _DROPPED_HEADERS}
    timeout = httpx.Timeout(policy.timeout_s)
    async with httpx.AsyncClient(follow_redirects=False, timeout=timeout, trust_env=False) as client:
        for _ in range(policy.max_redirects + 1):
            scheme, host, port, address = await _checked_address(url, policy)
            parts = urlsplit(url)
            literal = f"[{address}]" if ":" in address else address
            target = urlunsplit((scheme, f"{literal}:{port}", parts.path or "/", parts.query, ""))
            request = client.build_request(
                method,
                target,
                headers={**sent, "Host": parts.netloc.rsplit("@", 1)[-1]},
                content=body.encode() if body is not None else None,
                extensions={"sni_hostname": host},
            )
            try:
                response = await client.send(request, stream=True)
            except httpx.HTTPError as exc:
                raise ToolError(f"{method} {url}: {type(exc).__name__}: {exc}") from None
            try:
                if response.is_redirect and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    if response.status_code in (301, 302, 303) and method not in ("GET", "HEAD"):
                        method, body = "GET", None
                    continue
                data, truncated = bytearray(), False
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > policy.max_bytes:
                        del data[policy.max_bytes :]
                        truncated = True
                        break
                text = bytes(data).decode(response.encoding or "utf-8", errors="replace")
                return HttpResult(response.status_code, url, dict(response.headers), text, truncated)
            finally:
                await response.aclose()
    raise ToolError(f"more than {policy.max_redirects} redirects, last to {url}")
