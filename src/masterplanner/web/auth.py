"""Who may use the web app: loopback by default; elsewhere only with the token (`serve --auth`).

The token is generated once into `<home>/web-token` (mode 0600, readable by its owner only) and
sent as `Authorization: Bearer <token>`, or by a browser as the login cookie `/login` sets.
Binding to an address other machines can reach without `--auth` is refused before the server
starts.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import stat
from pathlib import Path

from ..errors import ConfigError

__all__ = [
    "COOKIE",
    "TOKEN_FILE_NAME",
    "check_bind",
    "is_loopback",
    "same_token",
    "token_matches",
    "web_token",
]

TOKEN_FILE_NAME = "web-token"
COOKIE = "masterplanner_token"
"""The login cookie a browser sends instead of the bearer header (HttpOnly, SameSite=Strict)."""


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (127.0.0.0/8, ::1, `localhost`)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, auth: bool) -> None:
    """Refuse (`ConfigError`) to serve on an address other machines reach without `--auth`."""
    if not auth and not is_loopback(host):
        raise ConfigError(
            f"--host {host} can be reached from other machines, and without --auth anyone there could "
            "start runs and answer their requests: add --auth (a token is then required), or serve on "
            "127.0.0.1"
        )


def web_token(home: Path) -> tuple[str, Path]:
    """The token and its file, created on first use; `ConfigError` if others can read the file."""
    path = home.expanduser() / TOKEN_FILE_NAME
    home.expanduser().mkdir(mode=0o700, parents=True, exist_ok=True)  # its owner's only, as ensure_home
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_token(path), path
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_urlsafe(32) + "\n")
    return _read_token(path), path


def _read_token(path: Path) -> str:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(f"cannot read the web token file {path}: {exc.strerror}") from None
    with os.fdopen(descriptor) as file:
        mode = os.fstat(file.fileno()).st_mode
        if not stat.S_ISREG(mode) or mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"the web token file {path} can be read by other users: run `chmod 600 {path}` "
                "(or delete it to have a new token made)"
            )
        token = file.read().strip()
    if len(token) < 32:
        raise ConfigError(f"the web token file {path} holds no usable token: delete it to have one made")
    return token


def same_token(given: str | None, token: str) -> bool:
    """Whether `given` is `token` (compared in constant time)."""
    return given is not None and hmac.compare_digest(given.strip().encode(), token.encode())


def token_matches(authorization: str | None, token: str) -> bool:
    """Whether an `Authorization` header carries `token` (compared in constant time)."""
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and same_token(given, token)
