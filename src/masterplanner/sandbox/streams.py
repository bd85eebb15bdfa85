"""Talking to the jailed process without ever blocking on it: its pipes and its exit.

Each works from the event loop's readiness callbacks on non-blocking descriptors, so a program
that floods its output, never reads its input or never closes its pipes cannot stall the loop,
and nothing waits for a pipe to close to know that the process ended (`ExitWatch`, a pidfd).
"""

from __future__ import annotations

import asyncio
import os
from typing import IO

__all__ = ["Capture", "ExitWatch", "Feeder"]


class ExitWatch:
    """`exited` resolves when the process ends (it is not reaped: the caller does that)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pid: int) -> None:
        self.exited: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self._fd = os.pidfd_open(pid)
        loop.add_reader(self._fd, _resolve, self.exited)

    def close(self) -> None:
        """Stop watching (idempotent)."""
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Capture:
    """Read a pipe without blocking, keeping its first `cap` bytes and draining the rest."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pipe: IO[bytes], cap: int) -> None:
        self.kept = bytearray()
        self.truncated = False
        self.closed: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self._pipe = pipe
        self._fd = pipe.fileno()
        self._cap = cap
        os.set_blocking(self._fd, False)
        loop.add_reader(self._fd, self._read)

    def _read(self) -> None:
        try:
            chunk = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._stop()
            return
        room = self._cap - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]
        if len(chunk) > room:
            self.truncated = True  # keep draining, so the program never blocks on a full pipe

    def _stop(self) -> None:
        if not self._pipe.closed:
            self._loop.remove_reader(self._fd)
        _resolve(self.closed)

    def close(self) -> None:
        """Stop reading and close the pipe (idempotent); what was kept stays."""
        self._stop()
        self._pipe.close()


class Feeder:
    """Write `data` to the program's stdin without blocking, then close it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pipe: IO[bytes], data: bytes) -> None:
        self._loop = loop
        self._pipe = pipe
        self._fd = pipe.fileno()
        self._left = memoryview(data)
        if not data:
            self.close()
            return
        os.set_blocking(self._fd, False)
        loop.add_writer(self._fd, self._write)

    def _write(self) -> None:
        try:
            written = os.write(self._fd, self._left[:65536])
        except BlockingIOError:
            return
        except OSError:  # the program closed its stdin
            written = len(self._left)
        self._left = self._left[written:]
        if not self._left:
            self.close()

    def close(self) -> None:
        """Stop writing and close the pipe (idempotent): the program reads end of file."""
        if not self._pipe.closed:
            self._loop.remove_writer(self._fd)
            self._pipe.close()
