"""As root: the pool of unprivileged uids code runs as, and the private folder holding its locks.

One pool uid per workspace in use (runs in the same workspace at the same time share it, and its
per-uid `RLIMIT_NPROC`), taken in turn and locked across processes with `flock` on a file in
`PRIVATE_DIR`. That folder is created 0711 by root and
checked on every use: a real folder (not a symlink), owned by us, writable by nobody else, under
parents only root can write; the lock files are opened with `O_NOFOLLOW | O_CLOEXEC | O_NOCTTY`
relative to its descriptor. Nothing lives in world-writable `/tmp` under a predictable name.
`stage` in it is the mount point the workspace is bound on in the run's private mount namespace.

A lease lends the workspace to its uid (`ownership.scan`) when the first run takes it and hands it
back (`ownership.settle`) when the last one ends; the lock is released on every path, a failure
of the hand-back included.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import stat
import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..errors import SandboxError
from .ownership import Settled, Snapshot, scan, settle

__all__ = ["PRIVATE_DIR", "UID_POOL", "Lease", "leased_uids", "private_dir", "stage_dir"]

UID_POOL = range(61000, 61064)
"""Unprivileged uids (and gids) the sandbox runs as when masterplanner runs as root."""
PRIVATE_DIR = Path("/run/masterplanner")
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
_FILE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
_turn = itertools.count()


def private_dir() -> int:
    """A descriptor of `PRIVATE_DIR`, created if missing; `SandboxError` if anyone else could write it."""
    for parent in reversed(PRIVATE_DIR.parents):
        try:
            info = os.stat(parent, follow_symlinks=False)
        except OSError as exc:
            raise SandboxError(
                f"cannot use {parent} for the sandbox's private folder: {exc.strerror}"
            ) from exc
        _check(str(parent), info, owners=(0, os.geteuid()))
    return _folder(None, str(PRIVATE_DIR), 0o711)


def stage_dir() -> Path:
    """The (checked) mount point the workspace is bound on inside the run's own mount namespace."""
    fd = private_dir()
    try:
        os.close(_folder(fd, "stage", 0o700))
    finally:
        os.close(fd)
    return PRIVATE_DIR / "stage"


def _folder(parent: int | None, name: str, mode: int) -> int:
    """Open (creating it with `mode` if missing) a folder only we can write; refuse anything else."""
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SandboxError(f"cannot create the sandbox's private folder {name}: {exc.strerror}") from exc
    try:
        fd = os.open(name, _FOLDER_FLAGS, dir_fd=parent)
    except OSError as exc:
        raise SandboxError(
            f"the sandbox's private folder {name} is not a folder or is a symlink ({exc.strerror}); "
            "remove it and try again"
        ) from exc
    try:
        _check(name, os.fstat(fd), owners=(os.geteuid(),))
        os.fchmod(fd, mode)  # the umask may have narrowed it
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check(name: str, info: os.stat_result, *, owners: tuple[int, ...]) -> None:
    if not stat.S_ISDIR(info.st_mode):
        raise SandboxError(f"{name} is not a folder; the sandbox's private folder cannot live there")
    if info.st_uid not in owners or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SandboxError(
            f"{name} is owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):o}: someone "
            "else could replace the sandbox's lock files; it must be ours and writable only by us"
        )


@dataclass
class _Held:
    uid: int
    lock_fd: int
    users: int
    snapshot: Snapshot


class Lease:
    """Per workspace, one pool uid that may write the workspace while code runs in it."""

    _lock: ClassVar[threading.Lock] = threading.Lock()  # held while lending and handing back too
    _held: ClassVar[dict[tuple[int, int], _Held]] = {}

    def __init__(self, key: tuple[int, int], uid: int, run: Snapshot) -> None:
        self.key = key
        self.uid = uid
        self.run = run
        """The workspace just before this run (protected entries, bytes allocated)."""
        self._released = False

    @classmethod
    def acquire(cls, workspace_fd: int, unreadable: Collection[tuple[int, int]] = frozenset()) -> Lease:
        """Lend the workspace to its pool uid (taking one if no run in it holds one).

        `unreadable`: files never lent, whatever their name (see `ownership.scan`).
        """
        info = os.fstat(workspace_fd)
        key = (info.st_dev, info.st_ino)
        with cls._lock:
            held = cls._held.get(key)
            if held is None:
                uid, lock_fd = _lock_uid()
                try:
                    snapshot = _lend(workspace_fd, uid, unreadable)
                except BaseException:
                    os.close(lock_fd)
                    raise
                cls._held[key] = _Held(uid, lock_fd, 1, snapshot)
                return cls(key, uid, snapshot)
            held.users += 1
            uid = held.uid
        try:
            run = scan(workspace_fd, lend_to=None, pool=UID_POOL, unreadable=unreadable)
        except BaseException:
            with cls._lock:
                cls._leave(key)
            raise
        return cls(key, uid, run)

    def release(self, workspace_fd: int) -> Settled:
        """Remove what the run must not leave; the last run hands the workspace back. Idempotent."""
        if self._released:
            return Settled()
        self._released = True
        with self._lock:
            held = self._held[self.key]
            last = held.users == 1
            try:
                return settle(workspace_fd, self.run, held.snapshot if last else None, strict=last)
            finally:
                self._leave(self.key)

    @classmethod
    def _leave(cls, key: tuple[int, int]) -> None:
        """Drop one user of the lease (`_lock` held); the last one unlocks the uid."""
        held = cls._held[key]
        held.users -= 1
        if held.users == 0:
            del cls._held[key]
            os.close(held.lock_fd)


def _lend(workspace_fd: int, uid: int, unreadable: Collection[tuple[int, int]]) -> Snapshot:
    try:
        return scan(workspace_fd, lend_to=uid, pool=UID_POOL, unreadable=unreadable)
    except BaseException:
        # give back what was lent before the failure (pool-owned entries count as the owner's)
        with contextlib.suppress(Exception):
            partial = scan(workspace_fd, lend_to=None, pool=UID_POOL)
            settle(workspace_fd, partial, partial, adopt_created=False, strict=False)
        raise


def leased_uids() -> list[int]:
    """The pool uids this process holds now (one per workspace with code running in it)."""
    with Lease._lock:
        return sorted(held.uid for held in Lease._held.values())


def _lock_uid() -> tuple[int, int]:
    """Lock the next free pool uid, in turn (`Lease._lock` held).

    In turn, not the first free one: bwrap leaves its pid-1 init as a zombie for the host's init
    to reap, and until then it counts against that uid's `RLIMIT_NPROC`.
    """
    folder = private_dir()
    try:
        locks = _folder(folder, "locks", 0o700)
    finally:
        os.close(folder)
    start = next(_turn) % len(UID_POOL)
    try:
        for uid in (*UID_POOL[start:], *UID_POOL[:start]):
            fd = os.open(f"{uid}.lock", _FILE_FLAGS, 0o600, dir_fd=locks)
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                    raise SandboxError(f"{PRIVATE_DIR}/locks/{uid}.lock is not our regular file")
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            return uid, fd
    finally:
        os.close(locks)
    raise SandboxError(f"all {len(UID_POOL)} sandbox uids are in use; wait for other executions to finish")
