"""Run inside the jail before the program: is every read-only entry where the scan saw it?

The jail binds each read-only entry over itself by path, and code of another step running in the
same workspace at the same time can rename or replace folders between the scan and bwrap's set-up
(a folder swapped for a symlink `..` makes bwrap bind a file from outside the workspace; a folder
moved aside leaves the entry it held writable). So this runs first, under the system Python
(`-I -S`), with the seccomp filter already applied and nothing of the program started yet: it
walks each entry's path from `/workspace` without following symlinks, checks every folder on the
way and the entry itself against the (device, inode) the scan saw, and that the entry sits on a
read-only mount (a settings file shown empty: an empty regular file). Once each mount is on its
entry, renaming a folder above it moves the mount along. Anything else: exit `FAILED` with a
message, the program never runs; all right: the program replaces this process (`execv`).

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


def _refuse(path: str, why: str) -> None:
    sys.stderr.write(
        f"sandbox: the read-only entry {path!r} {why}: the workspace changed while the sandbox was "
        "being set up (code running at the same time in this workspace?); the program was not run\n"
    )
    sys.stderr.flush()
    os._exit(FAILED)


def _check(spec: str) -> None:
    parts = spec.split("/")
    shown_empty, identities, names = parts[0], parts[1::2], parts[2::2]
    path = "/".join(names)
    fd = os.open("/workspace", _PATH_FLAGS | os.O_DIRECTORY)
    try:
        for depth, identity in enumerate(identities):
            info = os.fstat(fd)
            if depth == len(names) and shown_empty == "1":
                if not (stat.S_ISREG(info.st_mode) and info.st_size == 0):
                    _refuse(path, "is not shown empty")
            elif f"{info.st_dev}:{info.st_ino}" != identity:
                where = "/".join(names[:depth]) or "the workspace"
                _refuse(path, f"is not where it was ({where} was replaced)")
            if depth == len(names):
                break
            child = os.open(names[depth], _PATH_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        if not os.fstatvfs(fd).f_flag & os.ST_RDONLY:
            _refuse(path, "is not read-only")
    except OSError as exc:
        _refuse(path, f"cannot be checked ({exc.strerror})")
    finally:
        os.close(fd)


def main(argv: list[str]) -> None:
    """Check every entry before `--`, then replace this process with the program after it."""
    split = argv.index("--")
    for spec in argv[:split]:
        _check(spec)
    program = argv[split + 1 :]
    os.execv(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
