"""Walking a workspace that sandboxed code may have made hostile, and handing it back afterwards.

Every walk works from directory descriptors (`O_DIRECTORY | O_NOFOLLOW`, names relative to the
directory's descriptor, `lstat` semantics throughout), never from path strings, and keeps an
explicit stack of names instead of recursing: neither the depth of a tree nor the length of its
paths matters, symlinks are never followed, and at most two directory descriptors are open at a
time (the way back up is `..`, checked against the device and inode seen on the way down).

Before a run, `scan` records the owner and mode of every entry (by inode) and lends the sandbox uid
only what the workspace's owner owns and what carries no setuid/setgid bit (nor file
capabilities). Every other entry, and every protected entry (`tools/protected.py`), is listed to
be bound read-only over itself in the jail: readable if its mode allows, never writable, and it
cannot be renamed or deleted either (a mount point), so its inode cannot be freed and reused.
After the run, `settle` gives every entry that existed before its recorded owner and mode,
gives what the program created to the workspace's owner with setuid, setgid and sticky bits
cleared, and removes every protected entry (`tools/protected.py`) the program created.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from ..tools.protected import PROTECTED_NAMES, unreadable_component

__all__ = ["Recorded", "Settled", "Snapshot", "WalkError", "measure", "scan", "settle", "walk"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
_PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID
_SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX
_EXEC_BITS = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)

Visit = Callable[[int, str, os.stat_result, list[str]], bool]
"""Called with (directory fd, name, lstat, names of the directories above); True: descend into it."""
Leave = Callable[[int, str], None]
"""Called with (parent directory fd, name) after everything below a directory was visited."""


class WalkError(Exception):
    """A directory moved while it was being walked (only a running program can do that)."""


@dataclass(frozen=True)
class Recorded:
    """An entry's owner and mode before the run, and whether the sandbox uid was lent it."""

    uid: int
    gid: int
    mode: int
    lent: bool


@dataclass
class Snapshot:
    """The workspace before a run."""

    owner: tuple[int, int]
    """(uid, gid) that created entries are given: the workspace directory's owner."""
    entries: dict[int, Recorded] = field(default_factory=dict)
    """Every entry by inode, except what is inside a read-only entry."""
    read_only: list[tuple[str, ...]] = field(default_factory=list)
    """Paths of the entries not lent and of protected entries (symlinks excepted: a bind would
    follow them), each bound read-only over itself in the jail; nothing inside them is walked."""
    read_only_inodes: set[int] = field(default_factory=set)
    """Inodes of those entries, symlinks included."""
    read_only_path_ids: dict[tuple[str, ...], tuple[tuple[int, int], ...]] = field(default_factory=dict)
    """For each path in `read_only`: the (device, inode) of the workspace, of each folder on the
    way and of the entry, which the jail checks before the program runs (`bind_check.py`)."""
    protected_inodes: set[int] = field(default_factory=set)
    """Inodes of the existing protected entries, symlinks included."""
    hidden: list[tuple[str, ...]] = field(default_factory=list)
    """Paths of the read-only regular files code may not read, shown to it empty: settings files
    and their backups by name, and any file given as `unreadable` (a hard link to one) by inode."""
    blocks: int = 0
    """Bytes allocated to the entries walked (st_blocks * 512, each inode once)."""
    count: int = 0


@dataclass
class Settled:
    """What `settle` did after a run."""

    removed: list[str] = field(default_factory=list)
    """Protected entries the program created, removed (folders end with '/')."""
    blocks: int = 0
    """Bytes allocated in the workspace after the run (as `Snapshot.blocks`)."""
    failures: list[str] = field(default_factory=list)
    """Entries whose owner or mode could not be restored, with the reason."""


def is_protected(name: str) -> bool:
    """Whether an entry of this name makes the host act (compared case-insensitively)."""
    return name.lower() in PROTECTED_NAMES


def walk(root_fd: int, visit: Visit, *, leave: Leave | None = None, limit: int | None = None) -> int:
    """Visit every entry below `root_fd` depth first, holding at most two descriptors; the count.

    Folders on another file system (mount points) are visited but not entered. `WalkError` if a
    folder moved meanwhile, `OverflowError` once more than `limit` entries were visited.
    """
    root = os.fstat(root_fd)
    fd = os.open(".", _DIR_FLAGS, dir_fd=root_fd)
    names: list[str] = []
    identities = [(root.st_dev, root.st_ino)]
    counter = [0]
    try:
        pending = [_visit_folder(fd, names, visit, root.st_dev, counter, limit)]
        while True:
            if pending[-1]:
                name = pending[-1].pop()
                child = _enter(fd, name, root.st_dev)
                if child is None:
                    continue
                os.close(fd)
                fd, info = child
                names.append(name)
                identities.append((info.st_dev, info.st_ino))
                pending.append(_visit_folder(fd, names, visit, root.st_dev, counter, limit))
                continue
            pending.pop()
            identities.pop()
            if not pending:
                return counter[0]
            left = names.pop()
            current, fd = fd, -1
            fd = _up(current, root_fd, names, identities)
            if leave is not None:
                leave(fd, left)
    finally:
        if fd >= 0:
            os.close(fd)


def _enter(fd: int, name: str, device: int) -> tuple[int, os.stat_result] | None:
    """The descriptor and stat of folder `name` in `fd`, or None if it is gone or on another device."""
    try:
        child = os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno in _GONE:
            return None  # replaced or removed since it was listed
        raise
    info = os.fstat(child)
    if info.st_dev != device:
        os.close(child)
        return None
    return child, info


def _visit_folder(
    fd: int, names: list[str], visit: Visit, device: int, counter: list[int], limit: int | None
) -> list[str]:
    """Visit the entries of one folder; the names of the folders to enter."""
    entries = []
    with os.scandir(fd) as listing:
        for entry in listing:
            try:
                entries.append((entry.name, entry.stat(follow_symlinks=False)))
            except FileNotFoundError:
                continue
    descend = []
    for name, info in entries:
        counter[0] += 1
        if limit is not None and counter[0] > limit:
            raise OverflowError(f"more than {limit:,} entries")
        if visit(fd, name, info, names) and stat.S_ISDIR(info.st_mode) and info.st_dev == device:
            descend.append(name)
    return descend


def _up(fd: int, root_fd: int, names: list[str], identities: list[tuple[int, int]]) -> int:
    """The descriptor of the folder above `fd` (closing `fd`), checked to be the one we came from."""
    try:
        parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        info = os.fstat(parent)
    except BaseException:
        os.close(parent)
        raise
    if (info.st_dev, info.st_ino) == identities[-1]:
        return parent
    os.close(parent)
    return _reopen(root_fd, names, identities)


def _reopen(root_fd: int, names: list[str], identities: list[tuple[int, int]]) -> int:
    """Come back down to `names` from the root by name (a folder moved), checking every step."""
    fd = os.open(".", _DIR_FLAGS, dir_fd=root_fd)
    try:
        for name, identity in zip(names, identities[1:], strict=True):
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != identity:
                raise WalkError("/".join(names))
    except BaseException:
        os.close(fd)
        raise
    return fd


def scan(
    root_fd: int,
    *,
    lend_to: int | None,
    pool: range,
    unreadable: Collection[tuple[int, int]] = frozenset(),
) -> Snapshot:
    """Record the workspace below `root_fd`; with `lend_to`, lend that uid what it may write.

    Lent: entries owned by the workspace's owner (or by a pool uid, left by a run that crashed),
    except protected entries, files with a setuid/setgid bit or file capabilities, and entries on
    another file system. A folder keeps its setgid bit when lent (it only sets the group of new
    entries, and `chown` leaves it on folders). Each entry is recorded before it is lent, so a
    failure half-way can be undone (`settle(..., adopt_created=False)`).

    `unreadable`: (device, inode) of files code may not read under any name (the settings files a
    run reads): a hard link to one, whatever it is called, is kept read-only and listed `hidden`.
    """
    root = os.fstat(root_fd)
    owner = (root.st_uid, root.st_gid) if root.st_uid not in pool else (os.geteuid(), os.getegid())
    snapshot = Snapshot(owner=owner)
    linked: set[int] = set()
    folders: dict[tuple[str, ...], tuple[int, int]] = {(): (root.st_dev, root.st_ino)}

    def record(fd: int | None, name: str, info: os.stat_result, *, protected: bool) -> bool:
        orphan = info.st_uid in pool
        mine = info.st_uid == owner[0] or orphan
        folder = stat.S_ISDIR(info.st_mode)
        privileged = not folder and (info.st_mode & _PRIVILEGE_BITS or _has_capabilities(fd, name, info))
        lend = mine and not protected and not privileged and info.st_dev == root.st_dev
        mode = stat.S_IMODE(info.st_mode) & ~(_PRIVILEGE_BITS if orphan else 0)
        uid, gid = owner if orphan else (info.st_uid, info.st_gid)
        snapshot.entries[info.st_ino] = Recorded(uid, gid, mode, lend)
        if lend and lend_to is not None:
            if fd is None:
                os.chown(root_fd, lend_to, lend_to)
            else:
                os.chown(name, lend_to, lend_to, dir_fd=fd, follow_symlinks=False)
        return lend

    def visit(fd: int, name: str, info: os.stat_result, names: list[str]) -> bool:
        snapshot.blocks += _blocks(info, linked)
        protected = is_protected(name)
        if protected:
            snapshot.protected_inodes.add(info.st_ino)
        # settings steps may not read (their backups, hard links to them): bound read-only, shown empty
        regular = stat.S_ISREG(info.st_mode)
        secret = unreadable_component([name]) is not None or (
            regular and (info.st_dev, info.st_ino) in unreadable
        )
        path = (*names, name)
        if record(fd, name, info, protected=protected or secret):
            if stat.S_ISDIR(info.st_mode):
                folders[path] = (info.st_dev, info.st_ino)
            return True
        snapshot.read_only_inodes.add(info.st_ino)
        if not stat.S_ISLNK(info.st_mode):
            snapshot.read_only.append(path)
            above = tuple(folders[path[:depth]] for depth in range(len(path)))
            snapshot.read_only_path_ids[path] = (*above, (info.st_dev, info.st_ino))
        if secret and regular:
            snapshot.hidden.append(path)
        return False  # bound read-only whole: nothing inside can change

    record(None, ".", root, protected=False)
    snapshot.count = walk(root_fd, visit)
    return snapshot


def settle(
    root_fd: int,
    run: Snapshot,
    lease: Snapshot | None,
    *,
    adopt_created: bool = True,
    strict: bool = True,
) -> Settled:
    """After a run: remove protected entries it created; with `lease`, hand ownership back.

    `run` is the snapshot taken before this run; `lease` the one taken when the sandbox uid was
    lent the workspace (given only when the last run using that uid ended). An entry counts as
    existing before only if its inode was recorded and, for an entry that was not lent, it still
    has its recorded owner (the program cannot `chown`, so a different owner means the program
    created a new entry that was given a freed inode number). Read-only entries are not entered.
    """
    settled = Settled()
    linked: set[int] = set()

    def restore(fd: int | None, name: str, info: os.stat_result) -> None:
        assert lease is not None
        target = _owner_after(lease, info, adopt_created=adopt_created)
        if target is None:
            return
        try:
            _restore(root_fd if fd is None else fd, None if fd is None else name, info, *target)
        except OSError as exc:
            if exc.errno not in _GONE:
                settled.failures.append(f"{name}: {exc.strerror}")

    def visit(fd: int, name: str, info: os.stat_result, names: list[str]) -> bool:
        if is_protected(name):
            if info.st_ino not in run.protected_inodes:
                _remove_created(fd, name, info, names, settled)
            return False
        settled.blocks += _blocks(info, linked)
        if info.st_ino in run.read_only_inodes:
            return False
        if lease is None:
            return True
        recorded = lease.entries.get(info.st_ino)
        if recorded is not None and not recorded.lent and info.st_uid == recorded.uid:
            return False  # never lent (a run sharing the lease bound it read-only): leave it whole
        restore(fd, name, info)
        return True

    if lease is not None:
        restore(None, ".", os.fstat(root_fd))
    try:
        walk(root_fd, visit)
    except WalkError:
        if strict:
            raise
    settled.removed.sort()
    return settled


def _remove_created(fd: int, name: str, info: os.stat_result, names: list[str], settled: Settled) -> None:
    """Remove a protected entry the program created, and say so in `settled`."""
    folder = stat.S_ISDIR(info.st_mode)
    try:
        _remove(fd, name, folder)
    except OSError as exc:
        if exc.errno not in _GONE:
            settled.failures.append(f"{name}: not removed: {exc.strerror}")
            return
    settled.removed.append("/".join((*names, name)) + ("/" if folder else ""))


def _owner_after(
    lease: Snapshot, info: os.stat_result, *, adopt_created: bool
) -> tuple[int, int, int] | None:
    """(uid, gid, mode) an entry gets back after the run, or None to leave it as it is."""
    recorded = lease.entries.get(info.st_ino)
    if recorded is not None and not recorded.lent:
        if info.st_uid == recorded.uid:
            return None  # never lent: the program could not change its owner or mode
        recorded = None  # a new entry given a freed inode number
    if recorded is not None:
        return recorded.uid, recorded.gid, recorded.mode
    if not adopt_created:
        return None
    return *lease.owner, stat.S_IMODE(info.st_mode) & ~_SPECIAL_BITS


def measure(root_fd: int, skip: set[int], limit: int) -> tuple[int, int]:
    """(bytes allocated, entries) below `root_fd`, not entering `skip` inodes; at most `limit` entries."""
    linked: set[int] = set()
    total = [0]

    def visit(fd: int, name: str, info: os.stat_result, names: list[str]) -> bool:
        total[0] += _blocks(info, linked)
        return info.st_ino not in skip

    count = walk(root_fd, visit, limit=limit)
    return total[0], count


def _blocks(info: os.stat_result, linked: set[int]) -> int:
    if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
        if info.st_ino in linked:
            return 0
        linked.add(info.st_ino)
    return info.st_blocks * 512


def _has_capabilities(fd: int | None, name: str, info: os.stat_result) -> bool:
    """Whether a regular executable file carries file capabilities (lending it would strip them)."""
    if fd is None or not stat.S_ISREG(info.st_mode) or not info.st_mode & _EXEC_BITS:
        return False
    try:
        os.getxattr(f"/proc/self/fd/{fd}/{name}", "security.capability", follow_symlinks=False)
    except OSError:
        return False
    return True


def _restore(fd: int, name: str | None, info: os.stat_result, uid: int, gid: int, mode: int) -> None:
    """Give the entry `name` of folder `fd` (or `fd` itself) this owner and mode, never following links."""
    if (info.st_uid, info.st_gid) != (uid, gid):
        if name is None:
            os.chown(fd, uid, gid)
        else:
            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        return  # a symlink's own mode means nothing on Linux and cannot be changed
    current = stat.S_IMODE(info.st_mode)
    if current == mode and not (current & _PRIVILEGE_BITS and (info.st_uid, info.st_gid) != (uid, gid)):
        return  # unchanged (chown may have cleared a setuid/setgid bit: then it is set again below)
    if name is None:
        os.chmod(fd, mode)
        return
    target = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    try:
        if stat.S_ISLNK(os.fstat(target).st_mode):
            return  # replaced by a symlink since it was listed: leave it
        os.chmod(f"/proc/self/fd/{target}", mode)  # exactly this inode, whatever its name is now
    finally:
        os.close(target)


def _remove(fd: int, name: str, folder: bool) -> None:
    """Remove the entry `name` of folder `fd` and, for a folder, everything below it (no links followed)."""
    if not folder:
        os.unlink(name, dir_fd=fd)
        return
    top = os.open(name, _DIR_FLAGS, dir_fd=fd)
    try:

        def unlink(dir_fd: int, entry: str, info: os.stat_result, names: list[str]) -> bool:
            if stat.S_ISDIR(info.st_mode):
                return True
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry, dir_fd=dir_fd)
            return False

        def rmdir(dir_fd: int, entry: str) -> None:
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(entry, dir_fd=dir_fd)

        walk(top, unlink, leave=rmdir)
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=fd)
