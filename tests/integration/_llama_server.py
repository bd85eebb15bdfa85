"""Start llama-cpp-python's OpenAI-compatible server on 127.0.0.1 with the embedded model."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from masterplanner.models.local import embedded_model_path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def llama_server(folder: Path, *extra: str) -> Iterator[str]:
    """The server's base URL (`…/v1`) while it runs; `extra` are more server arguments."""
    port = free_port()
    log = folder / "server.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                str(embedded_model_path()),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--model_alias",
                "smollm2",
                *extra,
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama.cpp server exited early:\n{log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{base_url}/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("llama.cpp server did not start within 60 s")
            time.sleep(0.2)
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=10)
