"""The run workspace and the file tools that work inside it: `read_file`, `write_file`, `list_files`.

The workspace is treated as hostile: code run in it (and earlier tool calls) may have planted
symlinks. So a path is never resolved with `realpath` and a prefix check (that races); instead
each component is opened relative to the directory before it with `O_NOFOLLOW`, starting from a
descriptor of the workspace root. A symlink anywhere on the path is refused, `..` is refused,
only regular files are read or replaced, and writes are atomic (temporary file, then rename).

Files that make the host act (`protected.PROTECTED_NAMES`: masterplanner.toml, .git, .envrc, …)
may be read and listed but never created, replaced or deleted. Writes go at most
`MAX_WRITE_DEPTH` folders deep.

Every method raises only `ToolError` for any argument and any file-system state (a full disk, a
name too long, a directory removed while it is listed, a lone surrogate in a path): the message
names the path and the problem in words the agent can act on, never a bare `OSError`.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import ToolError
from ..private import private_folder
from .protected import (
    UNREADABLE_NAMES,
    protected_component,
    protection_notice,
    unreadable_component,
    unreadable_notice,
)

__all__ = [
    "MAX_LIST_ENTRIES",
    "MAX_NAME_BYTES",
    "MAX_PATH_BYTES",
    "MAX_READ_BYTES",
    "MAX_WRITE_BYTES",
    "MAX_WRITE_DEPTH",
    "FileEntry",
    "FileListing",
    "Workspace",
    "invalid_text",
    "walk_files",
]

MAX_READ_BYTES = 1_000_000
"""Largest file `read_file` returns (a step's context cannot hold more anyway)."""
MAX_WRITE_BYTES = 10_000_000
"""Largest content `write_file` accepts."""
_MEASURE_ENTRIES = 1_000_000
"""Most entries a size measurement walks (a larger workspace is measured by its first million)."""
MAX_LIST_ENTRIES = 500
"""Most entries `list_files` returns."""
MAX_NAME_BYTES = 255
"""Longest name of one path component, in UTF-8 bytes (NAME_MAX of Linux file systems)."""
MAX_PATH_BYTES = 4095
"""Longest workspace-relative path, in UTF-8 bytes (PATH_MAX, 4096, less its terminating NUL)."""
MAX_WRITE_DEPTH = 64
"""Most components of a path `write_file` creates or replaces a file at.

Deeper trees serve no step, and break recursive tools (Python 3.11's `os.walk`, `shutil.rmtree`
raise `RecursionError` at about 1,000 levels); reading, listing and deleting go deeper."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")

_PROBLEMS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "the operation is not permitted",
    errno.ENAMETOOLONG: "a name in the path is too long for this file system",
    errno.ENOTDIR: "a component of the path is not a directory",
    errno.EISDIR: "it is a directory",
    errno.ELOOP: "it is a symlink (symlinks are not followed)",
    errno.ENOENT: "it does not exist (any more)",
    errno.EEXIST: "it already exists",
    errno.EMLINK: "the directory holds too many entries",
    errno.EFBIG: "the file is larger than the file system allows",
    errno.EMFILE: "too many files are open",
    errno.ENFILE: "too many files are open",
    errno.EIO: "the disk reported an input/output error",
    errno.EBUSY: "it is in use",
    errno.ETXTBSY: "it is in use",
}


def _entries(folder: str) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as found:
            entries = sorted(found, key=lambda entry: entry.name)
    except OSError:  # gone, or not readable: passed over
        entries = []
    return iter(entries)


def walk_files(root: Path, *, enters: Callable[[str], bool] = lambda _: True) -> Iterator[os.DirEntry[str]]:
    """Every entry under `root` that is not a folder, depth first in name order, links not followed.

    Folders whose name `enters` refuses are not walked. The walk keeps its own stack of open
    listings instead of recursing: a step's program can nest folders deeper than Python
    recurses (`os.walk` raised `RecursionError` at about 1,000 levels).
    """
    stack = [_entries(str(root))]
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
            continue
        try:
            folder = entry.is_dir(follow_symlinks=False)
        except OSError:
            continue
        if not folder:
            yield entry
        elif enters(entry.name):
            stack.append(_entries(entry.path))


def _problem(exc: OSError) -> str:
    """What an `OSError` means, in our words (the errno's name for the rare ones)."""
    if exc.errno in _PROBLEMS:
        return _PROBLEMS[exc.errno]
    code = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror or 'the operating system refused'}" + (f" ({code})" if code else "")


def _shown(text: str, limit: int = 80) -> str:
    """`text` quoted for a message: escaped (repr) and cut to `limit` characters."""
    return repr(text if len(text) <= limit else f"{text[:limit]}…")


def _printable(name: str) -> str:
    """A directory entry's name for a listing: control characters and undecodable bytes escaped.

    `os.listdir` gives bytes that are not UTF-8 as surrogates (U+DC80-U+DCFF), which no model
    API or terminal accepts; a newline or tab in a name could forge rows of the listing.
    """

    def escape(match: re.Match[str]) -> str:
        code = ord(match.group())
        if 0xDC80 <= code <= 0xDCFF:
            return f"\\x{code - 0xDC00:02x}"
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _UNPRINTABLE.sub(escape, name)


def invalid_text(text: str) -> str | None:
    r"""What makes `text` impossible to encode as UTF-8 (a lone surrogate, and where), or None.

    JSON allows `"\udcff"`, so a model's tool arguments can hold a half of a surrogate pair;
    such text cannot be written, sent to an API or shown.
    """
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return f"a lone surrogate (U+{ord(found.group()):04X}) at character {found.start():,}"


@contextmanager
def _failures(action: str, path: str) -> Iterator[None]:
    """Turns an operating-system failure while `action`-ing `path` into a `ToolError`."""
    try:
        yield
    except OSError as exc:
        raise ToolError(f"cannot {action} {_shown(path)}: {_problem(exc)}") from None
    except (ValueError, OverflowError) as exc:  # arguments `_parts` did not foresee
        raise ToolError(f"cannot {action} {_shown(path)}: {type(exc).__name__}") from None


@dataclass(frozen=True)
class FileEntry:
    """One entry of a workspace directory listing."""

    name: str
    kind: str
    size: int


class FileListing(list[FileEntry]):
    """A workspace directory's entries, sorted by name; `total`: how many it holds in all.

    More than the entries when the listing was cut at `MAX_LIST_ENTRIES`.
    """

    def __init__(self, entries: list[FileEntry], total: int) -> None:
        super().__init__(entries)
        self.total = total


def _parts(path: object, *, allow_root: bool = False) -> list[str]:
    """The components of a workspace-relative path; refuses what could leave the workspace.

    Also refuses what no file system or model API takes: names over `MAX_NAME_BYTES`, paths
    over `MAX_PATH_BYTES`, control characters and lone surrogates.
    """
    if not isinstance(path, str):
        raise ToolError(f"the path must be text, got {type(path).__name__}")
    text = path.strip()
    if not text and not allow_root:
        raise ToolError("the path is empty; give a path relative to the workspace, e.g. notes/summary.md")
    if "\x00" in path:
        raise ToolError("the path contains a NUL character")
    invalid = invalid_text(path)
    if invalid is not None:
        raise ToolError(f"the path {_shown(path)} contains {invalid}, which is not valid text")
    control = _CONTROL.search(text)
    if control is not None:
        raise ToolError(
            f"the path {_shown(path)} contains a control character (U+{ord(control.group()):04X})"
        )
    size = len(text.encode("utf-8"))
    if size > MAX_PATH_BYTES:
        raise ToolError(f"path {_shown(path)} is {size:,} bytes; a path may have at most {MAX_PATH_BYTES:,}")
    pure = PurePosixPath(text)
    if pure.is_absolute():
        raise ToolError(f"{_shown(path)} is absolute; give a path relative to the workspace")
    parts = [part for part in pure.parts if part != "."]
    if ".." in parts:
        raise ToolError(f"{_shown(path)} contains '..'; paths must stay inside the workspace")
    if not parts and not allow_root:
        raise ToolError(
            f"{_shown(path)} names the workspace itself; give a file's path, e.g. notes/summary.md"
        )
    for part in parts:
        size = len(part.encode("utf-8"))
        if size > MAX_NAME_BYTES:
            raise ToolError(
                f"name {_shown(part, 40)} is {size:,} bytes; a file name may have at most {MAX_NAME_BYTES}"
            )
    return parts


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


_MAX_ROOT_DEPTH = 256
"""Most folders in a workspace's own path."""


class Workspace:
    """A directory that a run's step agents read and write, and nothing outside it."""

    def __init__(
        self, root: str | Path, *, max_bytes: int | None = None, settings_files: Iterable[Path] = ()
    ) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        """Most bytes the workspace may hold (allocated, the run's start plus its growth allowance)."""
        self.settings_files = tuple(settings_files)
        """Settings files besides the workspace's and the current folder's (the home's) that steps
        may not read under any name (a hard link in the workspace is the same file)."""

    def allocated_bytes(self) -> int:
        """Bytes the workspace's files and folders take on disk (hard links counted once)."""
        from ..sandbox.ownership import measure

        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ToolError(f"workspace {self.root}: cannot open: {_problem(exc)}") from exc
        try:
            return measure(fd, set(), _MEASURE_ENTRIES)[0]
        except OSError as exc:
            raise ToolError(f"workspace {self.root}: cannot measure: {_problem(exc)}") from exc
        finally:
            os.close(fd)

    def room(self) -> int | None:
        """How many more bytes the workspace may take in this run (None: no cap)."""
        if self.max_bytes is None:
            return None
        return max(0, self.max_bytes - self.allocated_bytes())

    def create(self, *, parents: bool = True) -> Workspace:
        """Create the workspace directory if it does not exist (it must not be a symlink).

        Without `parents`, only the folder itself may be made: the folder it goes in must exist
        (a person's path with a typo would otherwise become new empty folders the steps then
        work in, finding none of the files meant). A folder made here is its owner's only (0700,
        as each made on the way to it); one there already keeps its mode.
        """
        depth = len(self.root.parts)
        if depth > _MAX_ROOT_DEPTH:
            # pathlib creates missing folders recursively, so a path of thousands hit Python's limit
            raise ToolError(f"workspace path is {depth:,} folders deep; at most {_MAX_ROOT_DEPTH} are taken")
        if self.root.exists() and not self.root.is_dir():  # mkdir says only "it already exists"
            raise ToolError(f"workspace {self.root} is a file, not a folder")
        if not parents and not self.root.exists() and not self.root.parent.is_dir():
            raise ToolError(
                f"workspace {self.root}: no such folder, nor {self.root.parent} to make it in; check the path"
            )
        try:
            private_folder(self.root)
        except (FileExistsError, NotADirectoryError):  # a folder above it is a file
            raise ToolError(f"workspace {self.root}: cannot create it: a folder above it is a file") from None
        except OSError as exc:
            raise ToolError(f"workspace {self.root}: cannot create: {_problem(exc)}") from exc
        if self.root.is_symlink():
            raise ToolError(f"workspace {self.root} is a symbolic link: give the folder it points to")
        if not self.root.is_dir():
            raise ToolError(f"workspace {self.root} is not a directory")
        return self

    @contextmanager
    def _directory(self, parts: list[str], *, create: bool = False) -> Iterator[int]:
        """A descriptor of the directory `parts` below the root, opened without following links."""
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise ToolError(f"workspace {self.root}: cannot open: {_problem(exc)}") from None
        try:
            for index, part in enumerate(parts):
                where = "/".join(parts[: index + 1])
                if create:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                    except OSError as exc:
                        raise ToolError(f"cannot create directory {_shown(where)}: {_problem(exc)}") from None
                try:
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    raise ToolError(f"directory {_shown(where)} does not exist in the workspace") from None
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise ToolError(self._not_a_directory(fd, part, where)) from None
                    raise ToolError(f"cannot open directory {_shown(where)}: {_problem(exc)}") from None
                previous, fd = fd, next_fd
                os.close(previous)
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def _not_a_directory(directory: int, name: str, where: str) -> str:
        try:
            mode = os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
        except OSError:
            mode = 0
        if stat.S_ISREG(mode):
            return f"{_shown(where)} is a file, not a directory"
        return f"{_shown(where)} is not a directory (symlinks are not followed)"

    def check_write_path(self, path: str) -> str:
        """Refuse a path that `write_file` would refuse before touching the disk; the path, normalized.

        Lets a tool that pays for its content (`generate_image`) refuse before it calls out.
        """
        return "/".join(self._writable(path, creating=True))

    def check_delete_path(self, path: str) -> None:
        """Refuse a path that `delete_file` would refuse whatever the disk holds (`..`, a protected name).

        Before a `delete_file` call is put to a person: nobody is asked about one refused anyway.
        """
        self._writable(path, creating=False)

    @staticmethod
    def _writable(path: object, *, creating: bool) -> list[str]:
        """The path's components, if a step may change what it names (and create it, if `creating`)."""
        parts = _parts(path)
        protected = protected_component(parts)
        if protected is not None:
            raise ToolError(protection_notice(protected))
        if creating and len(parts) > MAX_WRITE_DEPTH:
            raise ToolError(
                f"path {_shown(str(path))} is {len(parts):,} levels deep; "
                f"write_file creates files at most {MAX_WRITE_DEPTH} levels deep"
            )
        return parts

    def read_file(self, path: str) -> str:
        """The text of a regular file in the workspace (UTF-8; invalid bytes are replaced).

        A file over `MAX_READ_BYTES` is refused (`read_start` reads its start).
        """
        data, _ = self._read(path, whole=True)
        return data.decode("utf-8", errors="replace")

    def read_start(self, path: str) -> tuple[str, int]:
        """The text of a file's first `MAX_READ_BYTES` (all of a smaller one), and the file's size in bytes.

        A character the cut falls inside is left out (not replaced: it is not invalid).
        """
        data, size = self._read(path, whole=False)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        return decoder.decode(data, final=len(data) >= size), size

    def _read(self, path: str, *, whole: bool) -> tuple[bytes, int]:
        """A file's bytes (at most `MAX_READ_BYTES`; `whole`: a larger file is refused) and its size."""
        parts = _parts(path)
        unreadable = unreadable_component(parts)
        if unreadable is not None:
            raise ToolError(unreadable_notice(unreadable))
        with _failures("read", path), self._directory(parts[:-1]) as directory:
            try:
                fd = os.open(
                    parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=directory
                )
            except FileNotFoundError:
                raise ToolError(f"file {_shown(path)} does not exist in the workspace") from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise ToolError(f"{_shown(path)} is a symlink; symlinks are not followed") from None
                raise
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise ToolError(f"{_shown(path)} is not a regular file")
                if info.st_nlink > 1 and (info.st_dev, info.st_ino) in self.settings_identities():
                    raise ToolError(unreadable_notice(parts[-1]) + " (this name is a hard link to it)")
                if whole and info.st_size > MAX_READ_BYTES:
                    size = f"{info.st_size:,} bytes"
                    raise ToolError(f"{_shown(path)} is {size}; read_file returns at most {MAX_READ_BYTES:,}")
                data = _read_at_most(fd, MAX_READ_BYTES)
            finally:
                os.close(fd)
        return data, info.st_size

    def settings_identities(self) -> frozenset[tuple[int, int]]:
        """(device, inode) of the settings files a run reads: the workspace's, the current folder's, home's.

        A hard link is the same file under another name, which the name check cannot see:
        `read_file` refuses such a file, and `code_execution` shows it empty.
        """
        files = {folder / name for folder in (self.root, Path.cwd()) for name in UNREADABLE_NAMES}
        identities: set[tuple[int, int]] = set()
        for file in files | set(self.settings_files):
            try:
                settings = os.stat(file)  # a settings file that is a symlink is read through it
            except (OSError, ValueError):
                continue
            if stat.S_ISREG(settings.st_mode):
                identities.add((settings.st_dev, settings.st_ino))
        return frozenset(identities)

    def write_file(self, path: str, content: str) -> str:
        r"""Create or replace a regular file atomically; creates missing directories. Returns a summary.

        The content is written as UTF-8. Text that cannot be (a lone surrogate, which JSON lets a
        model send as `"\udcff"`) is refused with a `ToolError` saying where, rather than
        silently altered: the agent decides what the character should have been.
        """
        self._writable(path, creating=True)
        if not isinstance(content, str):
            raise ToolError(f"the content must be text, got {type(content).__name__}")
        if len(content) > MAX_WRITE_BYTES:
            raise ToolError(f"content is over {MAX_WRITE_BYTES:,} bytes; write_file takes at most that")
        invalid = invalid_text(content)
        if invalid is not None:
            raise ToolError(f"the content has {invalid}, which cannot be written as UTF-8 text")
        return self.write_bytes(path, content.encode("utf-8"))

    def write_bytes(self, path: str, data: bytes) -> str:
        """Like `write_file`, for bytes (an image, say)."""
        parts = self._writable(path, creating=True)
        if not isinstance(data, bytes):
            raise ToolError(f"the content must be bytes, got {type(data).__name__}")
        if len(data) > MAX_WRITE_BYTES:
            raise ToolError(f"content is {len(data):,} bytes; write_file takes at most {MAX_WRITE_BYTES:,}")
        room = self.room()
        if room is not None and len(data) > room:
            raise ToolError(
                f"content is {len(data):,} bytes, but the workspace may grow by only {room:,} more bytes "
                "in this run (setting workspace_max_growth_bytes)"
            )
        name = parts[-1]
        with _failures("write", path), self._directory(parts[:-1], create=True) as directory:
            self._refuse_non_regular(directory, name, path)
            # A short name of our own: `.{name}.tmp` would pass NAME_MAX for a name near the limit.
            temporary = f".masterplanner-{os.urandom(6).hex()}.tmp"
            fd = os.open(
                temporary,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=directory,
            )
            try:
                try:
                    _write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
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
            raise ToolError(f"{_shown(path)} is {kind}; write_file only creates or replaces regular files")

    def delete_file(self, path: str) -> str:
        """Remove a file (or a symlink itself, never its target) from the workspace; not folders."""
        parts = self._writable(path, creating=False)
        with _failures("delete", path), self._directory(parts[:-1]) as directory:
            try:
                info = os.stat(parts[-1], dir_fd=directory, follow_symlinks=False)
            except FileNotFoundError:
                raise ToolError(f"file {_shown(path)} does not exist in the workspace") from None
            if stat.S_ISDIR(info.st_mode):
                raise ToolError(f"{_shown(path)} is a directory; delete_file removes files only")
            os.unlink(parts[-1], dir_fd=directory)
        return f"deleted {'/'.join(parts)}"

    def is_file(self, path: str) -> bool:
        """Whether `path` is a regular file in the workspace (reached without following symlinks)."""
        mode = self._mode(path)
        return mode is not None and stat.S_ISREG(mode)

    def is_dir(self, path: str) -> bool:
        """Whether `path` is a folder in the workspace (reached without following symlinks)."""
        mode = self._mode(path)
        return mode is not None and stat.S_ISDIR(mode)

    def file_size(self, path: str) -> int | None:
        """The size in bytes of a regular file in the workspace; None when `path` is none."""
        info = self._stat(path)
        return info.st_size if info is not None and stat.S_ISREG(info.st_mode) else None

    def _mode(self, path: str) -> int | None:
        """`path`'s file mode in the workspace, not following symlinks; None when it cannot be reached."""
        info = self._stat(path)
        return None if info is None else info.st_mode

    def _stat(self, path: str) -> os.stat_result | None:
        """`path`'s status in the workspace, not following symlinks; None when it cannot be reached."""
        try:
            parts = _parts(path)
            with self._directory(parts[:-1]) as directory:
                return os.stat(parts[-1], dir_fd=directory, follow_symlinks=False)
        except (ToolError, OSError, ValueError):
            return None

    def list_files(self, path: str = ".") -> FileListing:
        r"""The entries of a workspace directory, sorted by name (at most `MAX_LIST_ENTRIES`), and how many.

        Names that hold control characters or bytes that are not UTF-8 (code run in the
        workspace can create them) are shown escaped (`\x0a`, `\xff`).
        """
        parts = _parts(path, allow_root=True)
        entries: list[FileEntry] = []
        with _failures("list", path), self._directory(parts) as directory:
            names = sorted(os.listdir(directory))
            for name in names[:MAX_LIST_ENTRIES]:
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
                entries.append(FileEntry(_printable(name), kind, info.st_size if kind == "file" else 0))
        return FileListing(entries, len(names))
