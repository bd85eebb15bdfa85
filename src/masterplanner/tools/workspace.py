"""The run workspace and the file tools that work inside it: `read_file`, `write_file`, `list_files`.

The workspace is treated as hostile: code run in it (and earlier tool calls) may have planted
symlinks. So a path is never resolved with `realpath` and a prefix check (that races); instead
each component is opened relative to the directory before it with `O_NOFOLLOW`, starting from a
descriptor of the workspace root. A symlink anywhere on the path is refused, `..` is refused,
only regular files are read or replaced, and writes are atomic (temporary file, then rename).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import ToolError

__all__ = ["MAX_LIST_ENTRIES", "MAX_READ_BYTES", "MAX_WRITE_BYTES", "FileEntry", "Workspace"]

MAX_READ_BYTES = 1_000_000
"""Largest file `read_file` returns (a step's context cannot hold more anyway)."""
MAX_WRITE_BYTES = 10_000_000
"""Largest content `write_file` accepts."""
MAX_LIST_ENTRIES = 500
"""Most entries `list_files` returns; the listing says when it left some out."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class FileEntry:
    """One entry of a workspace directory listing."""

    name: str
    kind: str
    size: int


def _parts(path: str) -> list[str]:
    """The components of a workspace-relative path; refuses what could leave the workspace."""
    if not isinstance(path, str) or not path.strip():
        raise ToolError("the path is empty; give a path relative to the workspace, e.g. notes/summary.md")
    if "\x00" in path:
        raise ToolError("the path contains a NUL character")
    pure = PurePosixPath(path.strip())
    if pure.is_absolute():
        raise ToolError(f"{path!r} is absolute; give a path relative to the workspace")
    parts = [part for part in pure.parts if part != "."]
    if ".." in parts:
        raise ToolError(f"{path!r} contains '..'; paths must stay inside the workspace")
    if not parts:
        raise ToolError(f"{path!r} names the workspace itself; give a file's path, e.g. notes/summary.md")
    return parts


class Workspace:
    """A directory that a run's step agents read and write, and nothing outside it."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def create(self) -> Workspace:
        """Create the workspace directory if it does not exist (it must not be a symlink)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ToolError(f"workspace {self.root}: cannot create: {exc.strerror}") from exc
        if self.root.is_symlink() or not self.root.is_dir():
            raise ToolError(f"workspace {self.root} is not a directory")
        return self

    @contextmanager
    def _directory(self, parts: list[str], *, create: bool = False) -> Iterator[int]:
        """A descriptor of the directory `parts` below the root, opened without following links."""
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise ToolError(f"workspace {self.root}: cannot open: {exc.strerror}") from exc
        try:
            for index, part in enumerate(parts):
                where = "/".join(parts[: index + 1])
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                try:
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    raise ToolError(f"directory {where!r} does not exist in the workspace") from None
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise ToolError(f"{where!r} is not a directory (symlinks are not followed)") from None
                    raise ToolError(f"{where!r}: {exc.strerror}") from None
                os.close(fd)
                fd = next_fd
            yield fd
        finally:
            os.close(fd)

    def read_file(self, path: str) -> str:
        """The text of a regular file in the workspace (UTF-8; invalid bytes are replaced)."""
        parts = _parts(path)
        with self._directory(parts[:-1]) as directory:
            try:
                fd = os.open(
                    parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=directory
                )
            except FileNotFoundError:
                raise ToolError(f"file {path!r} does not exist in the workspace") from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise ToolError(f"{path!r} is a symlink; symlinks are not followed") from None
                raise ToolError(f"{path!r}: {exc.strerror}") from None
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                os.close(fd)
                raise ToolError(f"{path!r} is not a regular file")
            with os.fdopen(fd, "rb") as handle:
                if info.st_size > MAX_READ_BYTES:
                    raise ToolError(
                        f"{path!r} is {info.st_size:,} bytes; read_file returns at most {MAX_READ_BYTES:,}"
                    )
                data = handle.read(MAX_READ_BYTES + 1)
        return data[:MAX_READ_BYTES].decode("utf-8", errors="replace")

    def write_file(self, path: str, content: str) -> str:
        """Create or replace a regular file atomically; creates missing directories. Returns a summary."""
        return self.write_bytes(path, content.encode("utf-8"))

    def write_bytes(self, path: str, data: bytes) -> str:
        """Like `write_file`, for bytes (an image, say)."""
        parts = _parts(path)
        if len(data) > MAX_WRITE_BYTES:
            raise ToolError(f"content is {len(data):,} bytes; write_file takes at most {MAX_WRITE_BYTES:,}")
        name = parts[-1]
        with self._directory(parts[:-1], create=True) as directory:
            self._refuse_non_regular(directory, name, path)
            temporary = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
            fd = os.open(
                temporary,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=directory,
            )
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=directory)
                raise
        return f"wrote {len(data):,} bytes to {'/'.join(parts)}"

    @staticmethod
    def _refuse_non_regular(directory: int, name: str, path: str) -> None:
        try:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISREG(info.st_mode):
            kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a regular file"
            raise ToolError(f"{path!r} is {kind}; write_file only creates or replaces regular files")

    def delete_file(self, path: str) -> str:
        """Remove a file (or a symlink itself, never its target) from the workspace; not folders."""
        parts = _parts(path)
        with self._directory(parts[:-1]) as directory:
            try:
                info = os.stat(parts[-1], dir_fd=directory, follow_symlinks=False)
            except FileNotFoundError:
                raise ToolError(f"file {path!r} does not exist in the workspace") from None
            if stat.S_ISDIR(info.st_mode):
                raise ToolError(f"{path!r} is a directory; delete_file removes files only")
            os.unlink(parts[-1], dir_fd=directory)
        return f"deleted {'/'.join(parts)}"

    def is_file(self, path: str) -> bool:
        """Whether `path` is a regular file in the workspace (reached without following symlinks)."""
        try:
            parts = _parts(path)
            with self._directory(parts[:-1]) as directory:
                info = os.stat(parts[-1], dir_fd=directory, follow_symlinks=False)
        except (ToolError, OSError):
            return False
        return stat.S_ISREG(info.st_mode)

    def list_files(self, path: str = ".") -> list[FileEntry]:
        """The entries of a workspace directory, sorted by name (at most `MAX_LIST_ENTRIES`)."""
        parts = [] if path.strip() in ("", ".") else _parts(path)
        entries: list[FileEntry] = []
        with self._directory(parts) as directory:
            for name in sorted(os.listdir(directory))[:MAX_LIST_ENTRIES]:
                try:
                    info = os.stat(name, dir_fd=directory, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    kind = "directory"
                elif stat.S_ISREG(info.st_mode):
                    kind = "file"
                elif stat.S_ISLNK(info.st_mode):
                    kind = "symlink"
                else:
                    kind = "other"
                entries.append(FileEntry(name, kind, info.st_size if kind == "file" else 0))
        return entries
