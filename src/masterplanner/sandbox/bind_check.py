"""Run inside the jail before the program: is every read-only entry where the scan saw it?

The jail binds each read-only entry over itself by path, and code of another step running in the
same workspace at the same time can rename or replace folders between the scan and bwrap's set-up
(a folder swapped for a symlink `..` makes bwrap bind a file from outside the workspace; a folder
moved aside leaves the entry it held writable; an entry swapped for `.` and put back before this
runs leaves the whole workspace read-only and the entry on no bind of its own). So this runs first,
under the system Python (`-I -S`), with the seccomp filter already applied and nothing of the
program started yet. From `/proc/self/mountinfo` it checks that the jail holds exactly the mounts
it asked for, each once: `/workspace` (read-write), one per entry, at the entry's own path, and the
fixed ones outside the workspace (host mounts inside `/usr` come along with it). Then it walks each
entry's path from `/workspace` without following symlinks: the workspace and every folder on the
way must be on the `/workspace` mount with the (device, inode) the scan saw; the entry must be the
root of the read-only mount made at its path, with that (device, inode) and that source (the
mount's root is the workspace's, followed by the entry's path; a settings file shown empty: an
empty regular file bound from bwrap's own file system). Once each mount is on its entry, renaming
a folder above it moves the mount along. Anything else: exit `FAILED` with a message, the program
never runs; all right: the program replaces this process (`execv`).

Arguments: one per entry, `/`-separated: `1` (shown empty) or `0`, the `device:inode` of the
workspace, then each name on the path followed by the `device:inode` of that folder or entry
(names hold no `/`); then `--` and the program's argv. This file is the program's text
(`python3 -I -S -c TEXT ...`); it imports only `os`, `stat` and `sys`.
"""

import os
import stat
import sys

FAILED = 125
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_FIXED = {
    b"/",
    b"/usr",
    b"/etc/alternatives",
    b"/etc/ld.so.cache",
    b"/proc",
    b"/dev",
    b"/dev/shm",
    b"/tmp",
}
"""Mount points the jail makes outside the workspace (bwrap's `--dev` and `--proc` add `_BWRAP`)."""
_BWRAP = {
    *(b"/dev/" + name for name in (b"null", b"zero", b"full", b"random", b"urandom", b"tty", b"pts")),
    b"/dev/console",
    *(b"/proc/" + name for name in (b"sys", b"sysrq-trigger", b"irq", b"bus")),
}
_WORKSPACE = b"/workspace"


class Refused(Exception):
    """What is wrong with the jail's mounts: the program is not run."""


def _refuse(path: str, why: str) -> Refused:
    return Refused(f"the read-only entry {path!r} {why}")


def _unescape(field: bytes) -> bytes:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    pieces = field.split(b"\\")
    out = [pieces[0]]
    for piece in pieces[1:]:
        out += [bytes([int(piece[:3], 8)]), piece[3:]]
    return b"".join(out)


def _mounts() -> dict[int, tuple[bytes, bytes, bytes, bool]]:
    """Each mount in the jail: its id -> (device, root, mount point, read-only)."""
    with open("/proc/self/mountinfo", "rb") as file:
        lines = file.read().splitlines()
    mounts = {}
    for line in lines:
        fields = line.split(b" ")
        read_only = b"ro" in fields[5].split(b",")
        mounts[int(fields[0])] = (fields[2], _unescape(fields[3]), _unescape(fields[4]), read_only)
    return mounts


def _mount_of(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}", "rb") as file:
        for line in file.read().splitlines():
            if line.startswith(b"mnt_id:"):
                return int(line.split(b":", 1)[1])
    raise OSError(0, "no mount id")


def _check_mount_list(mounts: dict[int, tuple[bytes, bytes, bytes, bool]], entries: set[bytes]) -> None:
    """Exactly the mounts the jail asked for, each once: nothing bound where it did not ask."""
    seen: set[bytes] = set()
    for _, _, point, _ in mounts.values():
        host = point.startswith(b"/usr/")  # the host's own mounts inside /usr, as they are
        if not (host or point in _FIXED or point in _BWRAP or point == _WORKSPACE or point in entries):
            raise Refused(f"something is mounted at {os.fsdecode(point)!r}, where the sandbox mounts nothing")
        if point in seen and not host:
            raise Refused(f"two mounts are at {os.fsdecode(point)!r}, where the sandbox made one")
        seen.add(point)


def _check(spec: str, mounts: dict[int, tuple[bytes, bytes, bytes, bool]], workspace: int) -> None:
    parts = spec.split("/")
    shown_empty, identities, names = parts[0], parts[1::2], parts[2::2]
    path = "/".join(names)
    target = _WORKSPACE + b"/" + os.fsencode(path)
    fd = os.open("/workspace", _PATH_FLAGS | os.O_DIRECTORY)
    try:
        for depth, identity in enumerate(identities):
            info = os.fstat(fd)
            if depth == len(names) and shown_empty == "1":
                if not (stat.S_ISREG(info.st_mode) and info.st_size == 0):
                    raise _refuse(path, "is not shown empty")
            elif f"{info.st_dev}:{info.st_ino}" != identity:
                where = "/".join(names[:depth]) or "the workspace"
                raise _refuse(path, f"is not where it was ({where} was replaced)")
            if depth == len(names):
                break
            if _mount_of(fd) != workspace:
                where = "/".join(names[:depth]) or "the workspace"
                raise _refuse(path, f"is not where it was ({where} is not the workspace's)")
            child = os.open(names[depth], _PATH_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        device, root, point, read_only = mounts.get(_mount_of(fd), (b"", b"", b"", False))
        if point != target:
            raise _refuse(path, "is not on a read-only bind of its own (it was replaced while being bound)")
        if shown_empty == "1":
            source = any(device == mount[0] and mount[2] == b"/" for mount in mounts.values())  # bwrap's
        else:
            ws_device, ws_root = mounts[workspace][:2]
            source = device == ws_device and root == ws_root.rstrip(b"/") + b"/" + os.fsencode(path)
        if not source:
            raise _refuse(path, "is bound from somewhere else (it was replaced while being bound)")
        if not read_only or not os.fstatvfs(fd).f_flag & os.ST_RDONLY:
            raise _refuse(path, "is not read-only")
    except OSError as exc:
        raise _refuse(path, f"cannot be checked ({exc.strerror})") from exc
    finally:
        os.close(fd)


def _workspace_mount(mounts: dict[int, tuple[bytes, bytes, bytes, bool]]) -> int:
    """The mount `/workspace` is: the one made at that path, read-write."""
    try:
        fd = os.open("/workspace", _PATH_FLAGS | os.O_DIRECTORY)
        try:
            mount = _mount_of(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise Refused(f"the workspace cannot be checked ({exc.strerror})") from exc
    if mount not in mounts or mounts[mount][2] != _WORKSPACE:
        raise Refused("the workspace is not bound at /workspace")
    if mounts[mount][3]:
        raise Refused("the workspace is read-only (a read-only bind landed on it)")
    return mount


def main(argv: list[str]) -> None:
    """Check the jail's mounts and every entry before `--`, then replace this process with the program."""
    split = argv.index("--")
    specs = argv[:split]
    try:
        try:
            mounts = _mounts()
        except (OSError, ValueError, IndexError) as exc:
            raise Refused("the sandbox's mount list cannot be read") from exc
        workspace = _workspace_mount(mounts)
        entries = {_WORKSPACE + b"/" + os.fsencode("/".join(spec.split("/")[2::2])) for spec in specs}
        _check_mount_list(mounts, entries)
        for spec in specs:
            _check(spec, mounts, workspace)
    except Refused as refused:
        sys.stderr.write(
            f"sandbox: {refused}: the workspace changed while the sandbox was being set up (code running "
            "at the same time in this workspace?); the program was not run\n"
        )
        sys.stderr.flush()
        os._exit(FAILED)
    program = argv[split + 1 :]
    os.execv(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
