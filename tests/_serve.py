"""`masterplanner serve` in a real process, as the browser and schema tests use it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Served(str):
    """The URL of a server `serving` started, with its process."""

    process: subprocess.Popen[bytes]


@contextmanager
def serving(
    log: Path, *flags: str, env: dict[str, str] | None = None, cwd: Path | None = None, port: int = 0
) -> Iterator[Served]:
    """Start the server on a free loopback port (or `port`); yield its URL once it answers; stop it.

    Its output goes to `log` (a file, not a pipe: nobody reads a pipe while tests run, and a full
    one stalls the server). On the way out, a traceback in it fails the test: no request may
    make the server fail.
    """
    if not port:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "masterplanner", "serve", "--port", str(port), *flags],
            env=env,
            cwd=cwd,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    url = Served(f"http://127.0.0.1:{port}")
    url.process = process
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/v1/health", timeout=2):
                break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise AssertionError(f"the server did not start: {log.read_text()}") from None
            time.sleep(0.2)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert "Traceback" not in log.read_text(), log.read_text()
