"""The process jail that model-written code runs in.

Layers, outermost first (each one verified on Debian 12 with bubblewrap 0.8):

1. when running as root: a private mount namespace in which the workspace is bound on a folder the
   sandbox uid can pass through (`pool.stage_dir()`), then `setpriv --reuid U --regid U
   --clear-groups --no-new-privs` (U from a pool, one per workspace in use, locked across
   processes), since bwrap started as root keeps every capability and could remount `/`
   read-write; the workspace is lent to U only where the person owns it (`ownership.py`);
2. `prlimit`: CPU seconds, address space, file size, processes (per uid: as root, per workspace),
   open files, no core dumps — all per process;
3. `bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session
   --cap-drop ALL --clearenv`: no network, its own pid/ipc/uts namespaces, only `/usr` (read-only,
   with the `/bin`, `/lib`, `/lib64` links, `/etc/alternatives`, `/etc/ld.so.cache`), `/proc`, a
   read-only `/dev` with a sized `/dev/shm`, a sized `/tmp` and the workspace (read-write, but its
   protected entries and whatever was not lent are bound read-only over themselves); the
   sandbox's own root is read-only (those binds are made by path, so `bind_check.py` runs first
   and checks each is on its entry, or the program is not run); the environment is PATH, HOME
   and LANG only, plus
   PWD=/workspace that bwrap sets after `--chdir` (bash adds SHLVL and `_` itself), and it is
   started from `/`, so nothing of the host's environment or working directory gets in;
4. a seccomp filter (`seccomp_filter.py`);
5. a watchdog (`budget.py`) holding the whole sandbox to its totals: memory (processes + tmpfs),
   CPU time, processes, workspace growth.

A wall-clock timeout kills the whole sandbox; output is capped while it streams, and the call
returns within its timeout plus a short grace whatever the program does with its pipes (the exit
is seen through a pidfd, never through the pipes closing). If any layer is unavailable the
sandbox refuses to start and says why (it never runs code unconfined).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from pathlib import Path

from ..errors import SandboxError
from .budget import Budget, Watchdog
from .ownership import Settled, Snapshot, WalkError, scan, settle
from .pool import UID_POOL, Lease, stage_dir
from .streams import Capture, ExitWatch, Feeder

__all__ = ["UID_POOL", "SandboxLimits", "SandboxResult", "run_in_sandbox", "sandbox_problems"]

_GRACE_S = 1.0
"""How long, after the sandbox ended, its pipes may take to close before they are closed anyway."""
_HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
_MAX_BIND_PATH = 3800
_MAX_READ_ONLY = 256
_CHECK_PYTHON = "/usr/bin/python3"
"""The system Python, as `code_execution` runs Python (the jail shows the host's `/usr`)."""
_CHECK_BINDS = ["-I", "-S", "-c", files(__package__).joinpath("bind_check.py").read_text()]
"""Runs first in the jail when entries are bound read-only (`bind_check.py`), then `execv`s the program."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed execution.

    `memory_bytes`, `cpu_s` and `processes` hold per process (rlimits) and for the whole execution
    (the watchdog); the tmpfs sizes count against `memory_bytes`. `max_growth_bytes` is how much
    the workspace may grow during this execution: pass what remains of a larger allowance.
    """

    cpu_s: int = 10
    memory_bytes: int = 1 << 30
    file_bytes: int = 50 << 20
    processes: int = 64
    open_files: int = 256
    wall_s: float = 30.0
    output_bytes: int = 1 << 20
    tmp_bytes: int = 64 << 20
    shm_bytes: int = 64 << 20
    max_growth_bytes: int = 512 << 20
    max_new_entries: int = 100_000


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
    killed: str | None = None
    """Why the sandbox was killed (wall clock or a total over its budget), or None."""
    removed: tuple[str, ...] = ()
    """Protected entries the program created, removed after it ended (folders end with '/')."""
    workspace_growth_bytes: int = 0
    """Bytes the workspace grew by (negative if it shrank): subtract it from the allowance left."""


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
    for tool in ("prlimit", "setpriv", "unshare"):
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
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not start: {exc}"
    if result.returncode != 0:
        return (
            f"bubblewrap cannot create namespaces here ({result.stderr.strip()}); "
            "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)"
        )
    return None


_STAGE_SCRIPT = 'mount --bind "$2" "$1" && shift 2 && exec "$@"'


def _staged(workspace: Path) -> tuple[list[str], str]:
    """As root: a private mount namespace where the workspace is bound on the stage folder.

    The sandbox uid must be able to pass through every folder above the workspace, and a root
    user's home (`/root`, mode 700) is not passable. Rather than opening it up, a mount namespace
    of our own (invisible to the host) binds the workspace on `/run/masterplanner/stage`, whose
    parents the sandbox uid may pass (and nobody but root may write).
    """
    stage = str(stage_dir())
    prefix = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _STAGE_SCRIPT, "sh"]
    return [*prefix, stage, str(workspace)], stage


def _command(
    argv: list[str],
    limits: SandboxLimits,
    uid: int | None,
    fds: tuple[int, int],
    workspace: Path,
    before: Snapshot,
    hidden: dict[tuple[str, ...], int],
) -> list[str]:
    """The jail's command line; `hidden`: read-only entries shown empty, each with an empty pipe's fd."""
    seccomp_fd, info_fd = fds
    read_only = before.read_only
    command, source = _staged(workspace) if uid is not None else ([], str(workspace))
    command += [
        "prlimit",
        f"--cpu={limits.cpu_s}",
        f"--as={limits.memory_bytes}",
        f"--fsize={max(0, min(limits.file_bytes, limits.max_growth_bytes))}",
        f"--nproc={limits.processes}",
        f"--nofile={limits.open_files}",
        "--core=0",
        "--",
    ]
    if uid is not None:
        command += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]
    command += [
        *("bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"),
        *("--new-session", "--cap-drop", "ALL", "--seccomp", str(seccomp_fd), "--info-fd", str(info_fd)),
        *("--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin"),
        *("--setenv", "HOME", "/workspace", "--setenv", "LANG", "C.UTF-8"),
        *("--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin"),
        *("--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64"),
        *("--ro-bind", "/etc/alternatives", "/etc/alternatives"),
        *("--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"),
        *("--proc", "/proc", "--dev", "/dev", "--size", str(limits.shm_bytes), "--tmpfs", "/dev/shm"),
        *("--remount-ro", "/dev", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"),
        *("--bind", source, "/workspace"),
    ]
    if len(read_only) > _MAX_READ_ONLY:
        raise SandboxError(
            f"the workspace holds {len(read_only):,} entries code may not change (protected names, "
            f"other users' files, setuid files); at most {_MAX_READ_ONLY} can be kept read-only"
        )
    for parts in read_only:
        relative = "/".join(parts)
        if len(source) + len(relative) > _MAX_BIND_PATH:
            message = f"the entry {relative[:200]}… is nested too deep to be kept read-only"
            raise SandboxError(message)
        if parts in hidden:  # a settings file (secrets): an empty read-only file in its place
            command += ["--ro-bind-data", str(hidden[parts]), f"/workspace/{relative}"]
        else:
            command += ["--ro-bind", f"{source}/{relative}", f"/workspace/{relative}"]
    command += ["--remount-ro", "/", "--chdir", "/workspace", "--", *_checked_first(argv, before, hidden)]
    return command


def _checked_first(argv: list[str], before: Snapshot, hidden: Collection[tuple[str, ...]]) -> list[str]:
    """`argv`, preceded (when anything is bound read-only) by the check that each bind is in place.

    The binds are made by path: code running in the same workspace at the same time could have
    swapped a folder on the way for a symlink (bwrap would then bind a file from outside the
    workspace) or moved it aside (the entry would stay writable). `bind_check.py` walks each path
    inside the jail, without following symlinks, before the program starts.
    """
    if not before.read_only:
        return argv
    if not os.access(_CHECK_PYTHON, os.X_OK):
        raise SandboxError(
            f"the workspace has entries code may not change, and the check that they stay read-only in "
            f"the sandbox needs the system Python ({_CHECK_PYTHON}), which is not installed here "
            "(apt-get install -y python3)"
        )
    specs = []
    for parts in before.read_only:
        ids = [f"{device}:{inode}" for device, inode in before.read_only_path_ids[parts]]
        fields = ["1" if parts in hidden else "0", ids[0]]
        for name, identity in zip(parts, ids[1:], strict=True):
            fields += [name, identity]
        specs.append("/".join(fields))
    return [_CHECK_PYTHON, *_CHECK_BINDS, *specs, "--", *argv]


async def run_in_sandbox(
    argv: list[str],
    workspace: Path,
    *,
    stdin: str = "",
    limits: SandboxLimits | None = None,
    unreadable: Collection[tuple[int, int]] = frozenset(),
) -> SandboxResult:
    """Run `argv` in the jail, `workspace` as its read-write `/workspace`; refuse if the jail can't start.

    Settings files in the workspace (and their backups) are shown empty by name; `unreadable`,
    (device, inode) pairs, names files shown empty under any name (a hard link to a settings file).
    """
    limits = limits or SandboxLimits()
    problems = await asyncio.to_thread(sandbox_problems)
    if problems:
        raise SandboxError("the code sandbox cannot start: " + "; ".join(problems))
    workspace_fd = _open_workspace(workspace)
    loop = asyncio.get_running_loop()
    prepared = loop.run_in_executor(None, _prepare, workspace_fd, os.geteuid() == 0, frozenset(unreadable))
    try:
        lease, before = await asyncio.shield(prepared)
    except BaseException:
        prepared.add_done_callback(functools.partial(_abandon, workspace_fd))
        raise
    try:
        run = await _run(argv, workspace, workspace_fd, lease, before, stdin, limits)
    finally:
        # in a thread that owns the descriptor: a cancellation cannot stop it half-way
        settled = await asyncio.shield(loop.run_in_executor(None, _settle, workspace_fd, lease, before))
    if settled.failures:
        raise SandboxError(
            "the workspace could not be handed back entirely: " + "; ".join(settled.failures[:5])
        )
    return run.result(settled, before)


def _open_workspace(workspace: Path) -> int:
    try:
        fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(f"workspace {workspace} is not a directory ({exc.strerror})") from exc
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise SandboxError(f"workspace {workspace} is not a directory")
    return fd


def _prepare(
    workspace_fd: int, as_root: bool, unreadable: frozenset[tuple[int, int]]
) -> tuple[Lease | None, Snapshot]:
    """Before the run: as root, lend the workspace to a pool uid; else only look at it."""
    if as_root:
        lease = Lease.acquire(workspace_fd, unreadable)
        return lease, lease.run
    return None, scan(workspace_fd, lend_to=None, pool=UID_POOL, unreadable=unreadable)


def _settle(workspace_fd: int, lease: Lease | None, before: Snapshot) -> Settled:
    """After the run: remove protected entries it created, hand the workspace back; close the fd."""
    try:
        if lease is not None:
            return lease.release(workspace_fd)
        return settle(workspace_fd, before, None, strict=False)
    except (OSError, WalkError) as exc:
        raise SandboxError(f"the workspace could not be handed back after the run: {exc}") from exc
    finally:
        os.close(workspace_fd)


def _abandon(workspace_fd: int, prepared: asyncio.Future[tuple[Lease | None, Snapshot]]) -> None:
    """The caller went away while the workspace was being lent: hand it back once that finished."""
    if prepared.cancelled() or prepared.exception() is not None:
        os.close(workspace_fd)
        return
    lease, before = prepared.result()
    with contextlib.suppress(SandboxError):  # nobody is left to tell; the next run repairs ownership
        _settle(workspace_fd, lease, before)


@dataclass(frozen=True)
class _Run:
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    exit_code: int
    timed_out: bool
    killed: str | None
    seconds: float

    def result(self, settled: Settled, before: Snapshot) -> SandboxResult:
        stderr = self.stderr.decode("utf-8", errors="replace")
        if self.killed:
            stderr = (stderr.rstrip("\n") + "\n" if stderr else "") + f"killed: {self.killed}"
        return SandboxResult(
            stdout=self.stdout.decode("utf-8", errors="replace"),
            stderr=stderr,
            exit_code=self.exit_code,
            timed_out=self.timed_out,
            stdout_truncated=self.stdout_truncated,
            stderr_truncated=self.stderr_truncated,
            seconds=self.seconds,
            killed=self.killed,
            removed=tuple(settled.removed),
            workspace_growth_bytes=settled.blocks - before.blocks,
        )


async def _run(
    argv: list[str],
    workspace: Path,
    workspace_fd: int,
    lease: Lease | None,
    before: Snapshot,
    stdin: str,
    limits: SandboxLimits,
) -> _Run:
    process, info_read, started = _spawn(argv, workspace, lease, before, limits)
    watchdog = Watchdog(
        info_fd=info_read,
        kill=functools.partial(_kill_group, process),
        budget=Budget(
            memory_bytes=limits.memory_bytes,
            cpu_s=limits.cpu_s,
            processes=limits.processes,
            growth_bytes=limits.max_growth_bytes,
            new_entries=limits.max_new_entries,
        ),
        workspace_fd=workspace_fd,
        before=before,
    )
    watchdog.start()
    return await _collect(process, watchdog, stdin, limits, started)


def _spawn(
    argv: list[str], workspace: Path, lease: Lease | None, before: Snapshot, limits: SandboxLimits
) -> tuple[subprocess.Popen[bytes], int, float]:
    """Start the jail: (the process, the read end of bwrap's `--info-fd`, when it started).

    `Popen` forks with vfork and returns once the child has exec'd, as asyncio's own subprocess
    support does inside the event loop; the pipes are then read without blocking.
    """
    from .seccomp_filter import compiled_filter

    with compiled_filter() as program:
        info_read, info_write = os.pipe()
        hidden: dict[tuple[str, ...], int] = {}
        try:
            hidden = _hidden_files(workspace, before.hidden)
            command = _command(
                argv,
                limits,
                None if lease is None else lease.uid,
                (program.fileno(), info_write),
                workspace.resolve(),
                before,
                hidden,
            )
            started = time.perf_counter()
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(program.fileno(), info_write, *hidden.values()),
                start_new_session=True,
                cwd="/",  # nothing of the host's working directory reaches the sandbox
                env=_HOST_ENV,
            )
        except BaseException:
            os.close(info_read)
            raise
        finally:
            for fd in (info_write, *hidden.values()):
                os.close(fd)
    return process, info_read, started


def _hidden_files(workspace: Path, hidden: list[tuple[str, ...]]) -> dict[tuple[str, ...], int]:
    """The files steps may not read (`Snapshot.hidden`), each with an empty pipe to show in its place.

    Only entries the scan lists are seen: a settings file inside a folder bound read-only whole
    (another user's, a protected one) stays readable there; `read_file` refuses it at any depth.
    """
    shown_empty: dict[tuple[str, ...], int] = {}
    try:
        for parts in hidden:
            try:
                regular = stat.S_ISREG(os.lstat(workspace.joinpath(*parts)).st_mode)
            except OSError:
                continue
            if regular:
                read, write = os.pipe()
                os.close(write)  # read at once to its end: the file bwrap puts in its place is empty
                shown_empty[parts] = read
    except BaseException:
        for fd in shown_empty.values():
            os.close(fd)
        raise
    return shown_empty


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL bwrap's process group (bwrap and its pid-namespace init); only before it is reaped."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


async def _collect(
    process: subprocess.Popen[bytes], watchdog: Watchdog, stdin: str, limits: SandboxLimits, started: float
) -> _Run:
    """Feed stdin, capture the output and wait for the exit (or the wall clock), then clean up.

    The exit is seen through a pidfd, never through the pipes closing: a program that closes
    them, or leaves a child holding them, cannot keep this waiting past its timeout.
    """
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    loop = asyncio.get_running_loop()
    opened: list[Capture | Feeder | ExitWatch] = []
    timed_out = False
    try:
        exit_watch = ExitWatch(loop, process.pid)
        opened.append(exit_watch)
        out = Capture(loop, process.stdout, limits.output_bytes)
        opened.append(out)
        err = Capture(loop, process.stderr, limits.output_bytes)
        opened.append(err)
        opened.append(Feeder(loop, process.stdin, stdin.encode()))
        try:
            await asyncio.wait_for(asyncio.shield(exit_watch.exited), limits.wall_s)
        except TimeoutError:
            timed_out = True
            watchdog.kill()
            with contextlib.suppress(TimeoutError):  # SIGKILLed, bwrap is gone at once; if not, wait below
                await asyncio.wait_for(asyncio.shield(exit_watch.exited), _GRACE_S)
        watchdog.kill()  # whatever is left in its namespace dies with it (usually nothing)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(out.closed, err.closed), _GRACE_S)
    except BaseException:
        watchdog.kill()
        raise
    finally:
        reason = watchdog.stop()  # before reaping: the group's id must not be reused while it may kill
        for resource in opened:
            resource.close()
        for pipe in (process.stdin, process.stdout, process.stderr):
            pipe.close()
        process.wait()
    if timed_out and reason is None:
        reason = f"the program ran longer than {limits.wall_s:g} s"
    return _Run(
        stdout=bytes(out.kept),
        stderr=bytes(err.kept),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        exit_code=process.returncode,
        timed_out=timed_out,
        killed=reason,
        seconds=round(time.perf_counter() - started, 3),
    )
