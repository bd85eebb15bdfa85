"""The budget of one whole execution, enforced while it runs: memory, CPU time, processes, disk.

Without cgroup v2 (this is the fallback for hosts that only have cgroup v1 controllers) the kernel
caps each process, not the sandbox: `RLIMIT_AS`, `RLIMIT_CPU` and `RLIMIT_FSIZE` hold per process
and `RLIMIT_NPROC` per uid. A watchdog thread adds the totals. Every `POLL_S` it reads the
sandbox's own `/proc` from the host (`/proc/<pid-namespace init>/root/proc`, checked to belong to
the sandbox's pid namespace, so it lists exactly the sandbox's processes and nothing else) and
adds up:

- memory: the resident set of every process, plus what `/tmp` and `/dev/shm` (both tmpfs, i.e.
  memory) hold, plus deleted-but-open files that live in memory (memfd);
- CPU time: utime + stime + cutime + cstime of every live process (children that exited were
  added to their parent's cutime/cstime, orphans are reaped by the namespace's init);
- tasks: processes and their threads (what `RLIMIT_NPROC` counts);
- workspace growth: bytes allocated in the workspace tree (`st_blocks * 512`, each inode once)
  plus deleted-but-open files on the workspace's file system, minus what was there before.

When a total passes its limit the watchdog kills the whole sandbox (SIGKILL to bwrap's process
group and to the namespace's init, which takes every process of the namespace with it) and
records why. A total can overshoot by what the program does within one poll (50 ms) before the
kill lands. The workspace walk and the descriptor scan cost more for big trees and many
processes, so each runs again only after four times its own last duration (at most a fifth of a
core); their overshoot grows accordingly.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .ownership import Snapshot, measure

__all__ = ["POLL_S", "Budget", "Usage", "Watchdog"]

POLL_S = 0.05
"""Seconds between two looks at the sandbox."""
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")
_INFO_WAIT_S = 10.0


@dataclass(frozen=True)
class Budget:
    """Totals over a whole execution (all its processes together)."""

    memory_bytes: int
    cpu_s: float
    processes: int
    growth_bytes: int
    new_entries: int


@dataclass
class Usage:
    """The largest totals the watchdog saw."""

    memory_bytes: int = 0
    cpu_s: float = 0.0
    tasks: int = 0
    growth_bytes: int = 0
    samples: int = 0


class Watchdog:
    """A thread that watches one running sandbox and kills it when it passes its budget."""

    def __init__(
        self,
        *,
        info_fd: int,
        kill: Callable[[], None],
        budget: Budget,
        workspace_fd: int,
        before: Snapshot,
    ) -> None:
        self.reason: str | None = None
        """Why the watchdog killed the sandbox, or None."""
        self.usage = Usage()
        self.cpu_s = 0.0
        """CPU time the watchdog itself used."""
        self._info_fd = info_fd
        self._kill_group = kill
        self._budget = budget
        self._workspace_fd = workspace_fd
        self._workspace_dev = os.fstat(workspace_fd).st_dev
        self._before = before
        self._stop = threading.Event()
        self._init_fd = -1
        self._init_lock = threading.Lock()
        self._pid = 0
        self._namespace = 0
        self._root = ""
        self._tmpfs_devices: tuple[int, ...] = ()
        self._next_walk = 0.0
        self._next_scan = 0.0
        self._unlinked = (0, 0)  # (in memory, on the workspace's file system), from the last scan
        self._thread = threading.Thread(target=self._run, name="sandbox-watchdog", daemon=True)

    def start(self) -> None:
        """Start watching (after the sandbox was spawned: it adds nothing to start-up)."""
        self._thread.start()

    def kill(self) -> None:
        """SIGKILL the whole sandbox: bwrap's process group and its pid namespace's init."""
        self._kill_group()
        with self._init_lock:
            if self._init_fd >= 0:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._init_fd, signal.SIGKILL)

    def stop(self) -> str | None:
        """Stop watching; why the sandbox was killed, or None."""
        self._stop.set()
        self._thread.join()
        with self._init_lock:
            if self._init_fd >= 0:
                os.close(self._init_fd)
                self._init_fd = -1
        with contextlib.suppress(OSError):
            os.close(self._info_fd)
        return self.reason

    def _run(self) -> None:
        started = time.thread_time()
        try:
            if self._find_sandbox():
                while not self._stop.wait(POLL_S):
                    if self._root or self._ready():
                        reason = self._check()
                        if reason is not None:
                            self.reason = reason
                            self.kill()
                            return
        except OSError:
            return  # the sandbox ended while it was being read
        finally:
            self.cpu_s = time.thread_time() - started

    def _find_sandbox(self) -> bool:
        """Read bwrap's `--info-fd` report: its pid-namespace init, pinned by a pidfd."""
        data = b""
        deadline = time.monotonic() + _INFO_WAIT_S
        while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self._info_fd], [], [], min(left, POLL_S))
            if not readable:
                continue
            chunk = os.read(self._info_fd, 4096)
            if not chunk:
                return False  # bwrap ended before reporting
            data += chunk
            with contextlib.suppress(ValueError):
                info = json.loads(data)
                return self._pin(int(info["child-pid"]), int(info["pid-namespace"]))
        return False

    def _pin(self, pid: int, namespace: int) -> bool:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        try:
            if os.stat(f"/proc/{pid}/ns/pid").st_ino != namespace:
                os.close(fd)
                return False
        except OSError:
            os.close(fd)
            return False
        with self._init_lock:
            self._init_fd = fd
        self._pid = pid
        self._namespace = namespace
        return True

    def _ready(self) -> bool:
        """Whether bwrap finished setting the sandbox up: its `/proc` is mounted and runs the program.

        Before that, `/proc/<init>/root` may still be the host's root, whose `/proc` and `/tmp`
        are not the sandbox's.
        """
        proc = f"/proc/{self._pid}/root/proc"
        try:
            if os.stat(f"{proc}/1/ns/pid").st_ino != self._namespace:
                return False
            if not any(name.isdigit() and name != "1" for name in os.listdir(proc)):
                return False  # the init forks the program only once every mount is in place
            root = f"/proc/{self._pid}/root"
            self._tmpfs_devices = (os.stat(f"{root}/tmp").st_dev, os.stat(f"{root}/dev/shm").st_dev)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return False
        self._root = root
        return True

    def _check(self) -> str | None:
        """Look at the sandbox once; why it must die, or None."""
        budget = self._budget
        now = time.monotonic()
        pids = [name for name in os.listdir(f"{self._root}/proc") if name.isdigit()]
        tasks, ticks, resident = _processes(f"{self._root}/proc", pids)
        if now >= self._next_scan:
            self._unlinked = self._scan_descriptors(pids)
            self._next_scan = now + max(POLL_S, 4 * (time.monotonic() - now))
        memory = resident + self._tmpfs_used() + self._unlinked[0]
        cpu_s = ticks / _TICK
        usage = self.usage
        usage.samples += 1
        usage.memory_bytes = max(usage.memory_bytes, memory)
        usage.cpu_s = max(usage.cpu_s, cpu_s)
        usage.tasks = max(usage.tasks, tasks)
        if memory > budget.memory_bytes:
            return f"the program used more than {_mib(budget.memory_bytes)} of memory in total"
        if cpu_s > budget.cpu_s:
            return f"the program used more than {budget.cpu_s:g} s of CPU time in total"
        if tasks > budget.processes:
            return f"the program ran more than {budget.processes} processes and threads at once"
        return self._check_workspace()

    def _check_workspace(self) -> str | None:
        now = time.monotonic()
        if now < self._next_walk:
            return None
        budget = self._budget
        try:
            blocks, _ = measure(
                self._workspace_fd, self._before.read_only_inodes, self._before.count + budget.new_entries
            )
        except OverflowError:
            return f"the program created more than {budget.new_entries:,} files and folders in the workspace"
        except OSError:
            return None  # a folder moved under the walk: look again next time
        finally:
            self._next_walk = time.monotonic() + max(POLL_S, 4 * (time.monotonic() - now))
        growth = blocks + self._unlinked[1] - self._before.blocks
        self.usage.growth_bytes = max(self.usage.growth_bytes, growth)
        if growth > budget.growth_bytes:
            return f"the workspace grew by more than {_mib(budget.growth_bytes)} while the program ran"
        return None

    def _tmpfs_used(self) -> int:
        used = 0
        for folder in ("tmp", "dev/shm"):
            info = os.statvfs(f"{self._root}/{folder}")
            used += (info.f_blocks - info.f_bfree) * info.f_frsize
        return used

    def _scan_descriptors(self, pids: list[str]) -> tuple[int, int]:
        """Bytes of deleted files kept open: (in memory, on the workspace's file system).

        Files in the sandbox's `/tmp` and `/dev/shm` are left out: `statvfs` counts them already.
        """
        seen: set[tuple[int, int]] = set()
        in_memory = on_disk = 0
        for pid in pids:
            folder = f"{self._root}/proc/{pid}/fd"
            try:
                descriptors = os.listdir(folder)
            except OSError:
                continue
            for descriptor in descriptors:
                try:
                    info = os.stat(f"{folder}/{descriptor}")
                except OSError:
                    continue
                key = (info.st_dev, info.st_ino)
                if not stat.S_ISREG(info.st_mode) or info.st_nlink or key in seen:
                    continue
                seen.add(key)
                if info.st_dev == self._workspace_dev:
                    on_disk += info.st_blocks * 512
                elif info.st_dev not in self._tmpfs_devices:
                    in_memory += info.st_blocks * 512
        return in_memory, on_disk


def _processes(proc: str, pids: list[str]) -> tuple[int, int, int]:
    """(tasks, CPU clock ticks, resident bytes) of the processes `pids` under the `proc` folder."""
    tasks = ticks = pages = 0
    for pid in pids:
        try:
            fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # exited since the listing
        try:
            line = os.read(fd, 4096)
        except OSError:
            continue
        finally:
            os.close(fd)
        fields = line[line.rindex(b")") + 2 :].split()
        # man 5 proc: fields 14-17 utime stime cutime cstime, 20 num_threads, 24 rss (state is 3)
        ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        tasks += int(fields[17])
        pages += int(fields[21])
    return tasks, ticks, pages * _PAGE


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"
