"""The process jail that model-written code runs in.

Layers, outermost first (each one verified on Debian 12 with bubblewrap 0.8):

1. `prlimit`: CPU seconds, address space, file size, processes, open files, no core dumps;
2. when running as root: a private mount namespace that makes the workspace reachable (see
   `_staged`), then `setpriv --reuid U --regid U --clear-groups --no-new-privs` (U from a pool, one
   per workspace in use, locked across processes), since bwrap started as root keeps every
   capability and could remount `/` read-write;
3. `bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session
   --cap-drop ALL --clearenv`: no network, its own pid/ipc/uts namespaces, only `/usr` (read-only,
   with the `/bin`, `/lib`, `/lib64` links, `/etc/alternatives`, `/etc/ld.so.cache`), `/proc`,
   `/dev`, a small `/tmp` and the workspace (read-write); the sandbox's own root is remounted
   read-only, so only `/tmp` and `/workspace` take writes;
4. a seccomp deny-list (`seccomp_filter.py`).

A wall-clock timeout kills the whole process group; output is capped while it streams. If any
layer is unavailable the sandbox refuses to start and says why (it never runs code unconfined).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import ClassVar

from ..errors import SandboxError

__all__ = ["SandboxLimits", "SandboxResult", "run_in_sandbox", "sandbox_problems"]

UID_POOL = range(61000, 61064)
"""Unprivileged uids (and gids) the sandbox runs as when masterplanner runs as root."""
_LOCK_DIR = Path("/tmp")
_SYSTEM_PATHS = ("/usr", "/etc/alternatives", "/etc/ld.so.cache")


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed execution."""

    cpu_s: int = 10
    memory_bytes: int = 1 << 30
    file_bytes: int = 50 << 20
    processes: int = 64
    open_files: int = 256
    wall_s: float = 30.0
    output_bytes: int = 1 << 20
    tmp_bytes: int = 64 << 20


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed process did."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    stdout_truncated: bool
    stderr_truncated: bool
    seconds: float


def sandbox_problems() -> list[str]:
    """Why the sandbox cannot start here, each with its fix; empty when it can (then remembered)."""
    problems = _problems()
    if problems:
        _problems.cache_clear()  # look again next time: the person may have fixed it meanwhile
    return list(problems)


@cache
def _problems() -> tuple[str, ...]:
    problems = []
    if shutil.which("bwrap") is None:
        problems.append("bubblewrap is not installed (apt-get install -y bubblewrap)")
    for tool in ("prlimit", "setpriv"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is not installed (apt-get install -y util-linux)")
    try:
        import pyseccomp  # noqa: F401
    except (ImportError, OSError) as exc:
        problems.append(
            f"seccomp is unavailable ({exc}; pip install pyseccomp, apt-get install -y libseccomp2)"
        )
    if not problems:
        probe = _probe()
        if probe:
            problems.append(probe)
    return tuple(problems)


def _probe() -> str | None:
    import subprocess

    try:
        result = subprocess.run(
            [
                "bwrap",
                "--unshare-all",
                "--unshare-user",
                "--ro-bind",
                "/usr",
                "/usr",
                "--symlink",
                "usr/lib",
                "/lib",
                "--symlink",
                "usr/lib64",
                "/lib64",
                "--",
                "/usr/bin/true",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not start: {exc}"
    if result.returncode != 0:
        return (
            f"bubblewrap cannot create namespaces here ({result.stderr.strip()}); "
            "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)"
        )
    return None


class _UidLease:
    """Per workspace, one pool uid owning the workspace while code runs in it."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _held: ClassVar[dict[str, tuple[int, int, int]]] = {}  # workspace -> (uid, lock fd, users)

    @classmethod
    @contextlib.contextmanager
    def of(cls, workspace: Path) -> Iterator[int]:
        key = str(workspace)
        with cls._lock:
            if key in cls._held:
                uid, fd, users = cls._held[key]
                cls._held[key] = (uid, fd, users + 1)
            else:
                uid, fd = cls._acquire()
                _give(workspace, uid)
                cls._held[key] = (uid, fd, 1)
        try:
            yield uid
        finally:
            with cls._lock:
                uid, fd, users = cls._held[key]
                if users == 1:
                    del cls._held[key]
                    _give(workspace, 0)
                    os.close(fd)
                else:
                    cls._held[key] = (uid, fd, users - 1)

    @staticmethod
    def _acquire() -> tuple[int, int]:
        for uid in UID_POOL:
            fd = os.open(
                _LOCK_DIR / f"masterplanner-sandbox-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return uid, fd
        raise SandboxError(
            f"all {len(UID_POOL)} sandbox uids are in use; wait for other executions to finish"
        )


def _give(workspace: Path, uid: int) -> None:
    """Make `uid` own the workspace and everything in it (symlinks themselves, never their targets)."""
    os.lchown(workspace, uid, uid)
    for folder, directories, files in os.walk(workspace, followlinks=False):
        for name in directories + files:
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(folder, name), uid, uid)


_STAGE = Path("/tmp/masterplanner-sandbox-stage")
_STAGE_SCRIPT = (
    'mount -t tmpfs -o mode=0711,size=64k masterplanner "$1" && mkdir "$1/ws" && '
    'mount --bind "$2" "$1/ws" && shift 2 && exec "$@"'
)


def _staged(workspace: Path) -> list[str]:
    """As root: a private mount namespace where the workspace is reachable at `_STAGE/ws`.

    The sandbox uid must be able to pass through every folder above the workspace, and a root
    user's home (`/root`, mode 700) is not passable. Rather than opening it up, a mount namespace
    of our own (invisible to the host) mounts a passable tmpfs at `_STAGE` and binds the
    workspace under it.
    """
    _STAGE.mkdir(mode=0o711, exist_ok=True)
    return [
        *("unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _STAGE_SCRIPT, "sh"),
        str(_STAGE),
        str(workspace),
    ]


def _command(
    argv: list[str], limits: SandboxLimits, uid: int | None, seccomp_fd: int, workspace: Path
) -> list[str]:
    workspace = workspace.resolve()
    source = str(_STAGE / "ws") if uid is not None else str(workspace)
    command = _staged(workspace) if uid is not None else []
    command += [
        "prlimit",
        f"--cpu={limits.cpu_s}",
        f"--as={limits.memory_bytes}",
        f"--fsize={limits.file_bytes}",
        f"--nproc={limits.processes}",
        f"--nofile={limits.open_files}",
        "--core=0",
        "--",
    ]
    if uid is not None:
        command += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]
    command += [
        "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--seccomp",
        str(seccomp_fd),
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/workspace",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--ro-bind",
        "/etc/alternatives",
        "/etc/alternatives",
        "--ro-bind",
        "/etc/ld.so.cache",
        "/etc/ld.so.cache",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(limits.tmp_bytes),
        "--tmpfs",
        "/tmp",
        "--bind",
        source,
        "/workspace",
        "--remount-ro",
        "/",
        "--chdir",
        "/workspace",
        "--",
        *argv,
    ]
    return command


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, bool]:
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(65536):
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > room:
            truncated = True  # keep draining, so the process never blocks on a full pipe
    return bytes(kept), truncated


async def run_in_sandbox(
    argv: list[str], workspace: Path, *, stdin: str = "", limits: SandboxLimits | None = None
) -> SandboxResult:
    """Run `argv` in the jail, `workspace` as its read-write `/workspace`; refuse if the jail can't start."""
    limits = limits or SandboxLimits()
    problems = await asyncio.to_thread(sandbox_problems)
    if problems:
        raise SandboxError("the code sandbox cannot start: " + "; ".join(problems))
    info = os.lstat(workspace)
    if not stat.S_ISDIR(info.st_mode):
        raise SandboxError(f"workspace {workspace} is not a directory")

    from .seccomp_filter import compiled_filter

    as_root = os.geteuid() == 0
    with (
        compiled_filter() as program,
        _UidLease.of(workspace) if as_root else contextlib.nullcontext(None) as uid,
    ):
        started = time.perf_counter()
        process = await asyncio.create_subprocess_exec(
            *_command(argv, limits, uid, program.fileno(), workspace),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=(program.fileno(),),
            start_new_session=True,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
        return await _collect(process, stdin, limits, started)


async def _collect(
    process: asyncio.subprocess.Process, stdin: str, limits: SandboxLimits, started: float
) -> SandboxResult:
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None

    async def feed() -> None:
        assert process.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            process.stdin.write(stdin.encode())
            await process.stdin.drain()
        process.stdin.close()

    reading = asyncio.gather(
        _read_capped(process.stdout, limits.output_bytes),
        _read_capped(process.stderr, limits.output_bytes),
        feed(),
        process.wait(),
    )
    timed_out = False
    try:
        (out, out_cut), (err, err_cut), _, code = await asyncio.wait_for(reading, limits.wall_s)
    except (TimeoutError, asyncio.CancelledError) as exc:
        timed_out = isinstance(exc, TimeoutError)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        if not timed_out:
            raise
        out, out_cut, err, err_cut, code = b"", False, f"killed after {limits.wall_s:g} s".encode(), False, -9
    return SandboxResult(
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        exit_code=code,
        timed_out=timed_out,
        stdout_truncated=out_cut,
        stderr_truncated=err_cut,
        seconds=round(time.perf_counter() - started, 3),
    )
