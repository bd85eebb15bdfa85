"""A step aid for small models: questions about files that the engine answers from a tool's result.

Measured with the embedded 135M model (SmolLM2) on the everyday suite: given the workspace's
listing and asked "Count the files in the workspace", it copied the listing into count.txt;
asked "Find the largest file in the workspace", it answered with the text of a `list_files`
call; asked "List the CSV files in the workspace", it listed every file; given names.txt and
asked "Count the names in names.txt", it answered with the names. Counting, comparing sizes and
picking by type are not what a model of that size can do, and they need no model: the engine
makes the step's one call (`list_files`, or `read_file` of the file it names) through the normal
tool path, and the step's answer is worked out from what the call returned.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from ..tools.results import FILE_CUT
from ..tools.workspace import MAX_READ_BYTES
from ..working_memory import input_shares

__all__ = [
    "CountedFile",
    "FolderFiles",
    "FolderReading",
    "FolderTexts",
    "ListingQuestion",
    "counted_file",
    "listing_question",
]

_ABOUT_FILES = re.compile(
    r"\b(?:files?\s+(?:are\s+)?(?:in|of)\s+(?:the|this)\s+workspace|workspace(?:'s)?\s+files)\b",
    re.IGNORECASE,
)
_KINDS: tuple[tuple[Literal["count", "largest", "smallest"], re.Pattern[str]], ...] = (
    ("count", re.compile(r"\b(?:count|how\s+many|number\s+of)\b", re.IGNORECASE)),
    ("largest", re.compile(r"\b(?:largest|biggest|longest)\s+(?:[\w.]+\s+)?files?\b", re.IGNORECASE)),
    ("smallest", re.compile(r"\b(?:smallest|shortest)\s+(?:[\w.]+\s+)?files?\b", re.IGNORECASE)),
)
_LIST = re.compile(r"^\s*(?:list|show|find|name)\b", re.IGNORECASE)
_TYPES = {
    "csv": ".csv",
    "text": ".txt",
    "txt": ".txt",
    "markdown": ".md",
    "md": ".md",
    "python": ".py",
    "py": ".py",
    "json": ".json",
    "bash": ".sh",
    "shell": ".sh",
    "sh": ".sh",
}
_TYPED = re.compile(r"(?<![\w.])\.?(" + "|".join(_TYPES) + r")\s+files?\b", re.IGNORECASE)


@dataclass(frozen=True)
class ListingQuestion:
    """A question about the workspace's files, answered from its `list_files` listing.

    `kind` is what is asked: how many files there are, the largest or smallest one, or the
    names of those of one type ("List the CSV files in the workspace"). `suffix` narrows the
    files to one type (".csv"); directories and other entries are never counted.
    """

    kind: Literal["count", "largest", "smallest", "names"]
    suffix: str = ""
    tool: ClassVar[str] = "list_files"

    @property
    def arguments(self) -> dict[str, str]:
        """The `list_files` call's arguments: the workspace itself."""
        return {}

    def answer(self, listing: str) -> str:
        """The answer the listing gives (as `list_files` returns it: name, kind, size a line)."""
        entries = (line.split("\t") for line in listing.splitlines() if line.count("\t") == 2)
        files = [
            (name, int(size))
            for name, kind, size in entries
            if kind == "file" and size.isdigit() and name.lower().endswith(self.suffix)
        ]
        if self.kind == "count":
            return str(len(files))
        if not files:
            kind = f"{self.suffix} files" if self.suffix else "files"
            return f"There are no {kind} in the workspace."
        if self.kind == "names":
            return "\n".join(name for name, _ in files)
        pick = max if self.kind == "largest" else min
        size = pick(size for _, size in files)
        return ", ".join(name for name, each in files if each == size)

    def heading(self) -> str:
        """What the answer is, for a text drafted from it ("The number of files in the workspace")."""
        files = f"{self.suffix} files" if self.suffix else "files"
        return {
            "count": f"The number of {files} in the workspace",
            "largest": f"The largest of the {files} in the workspace",
            "smallest": f"The smallest of the {files} in the workspace",
            "names": f"The {files} in the workspace",
        }[self.kind]


def listing_question(instruction: str) -> ListingQuestion | None:
    """The question a step's instruction asks about the workspace's files, if it is one the listing answers.

    The instruction must be about the files in the workspace and ask how many there are, which
    is largest or smallest, or (naming a type: "CSV files", ".txt files") list them.
    """
    if not _ABOUT_FILES.search(instruction):
        return None
    typed = _TYPED.search(instruction)
    suffix = _TYPES[typed[1].lower()] if typed else ""
    for kind, words in _KINDS:
        if words.search(instruction):
            return ListingQuestion(kind, suffix)
    if suffix and _LIST.match(instruction):
        return ListingQuestion("names", suffix)
    return None


_UNITS = r"(?P<unit>lines|words|names|items|entries|rows|tasks|people|things|\w+s)"
_COUNTED = re.compile(
    rf"^\s*(?:count|how\s+many)\s+(?:the\s+)?(?:number\s+of\s+)?{_UNITS}\s+(?:are\s+)?(?:in|of)\s+"
    r"['\"`]?(?P<path>[\w./-]*\w\.(?:txt|md|text))['\"`]?\s*[.?!]?\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class CountedFile:
    """A count asked of a text file ("Count the names in names.txt"): its lines, or its words.

    A text file holds one item a line unless words are counted; blank lines are not items.
    """

    path: str
    unit: str = "lines"
    """What is counted, as the instruction says it ("names"); "words" counts words."""
    size: int = 0
    """The file's size in bytes when the step began."""
    tool: ClassVar[str] = "read_file"

    @property
    def arguments(self) -> dict[str, str]:
        """The `read_file` call's arguments."""
        return {"path": self.path}

    @property
    def uncountable(self) -> str | None:
        """Why the file cannot be counted, in our words; None when it can.

        A file over `read_file`'s limit: the call returns only its start. Before, its first
        1,000,000 bytes were counted, with the line saying so, and the number given as fact.
        """
        if self.size <= MAX_READ_BYTES:
            return None
        return (
            f"{self.path} is {self.size:,} bytes; only its first {MAX_READ_BYTES:,} can be read, "
            f"so its {self.unit} cannot be counted"
        )

    def answer(self, text: str) -> str:
        """How many items (non-blank lines, or words) `text` holds."""
        if self.unit == "words":
            return str(len(text.split()))
        return str(sum(1 for line in text.splitlines() if line.strip()))

    def heading(self) -> str:
        """What the answer is ("The number of names in names.txt")."""
        return f"The number of {self.unit} in {self.path}"


def counted_file(
    instruction: str, existing: tuple[str, ...] | list[str], sizes: Mapping[str, int] | None = None
) -> CountedFile | None:
    """The count a step asks of one existing text file ("Count the names in names.txt"), else None.

    `sizes`: the existing files' sizes in bytes, by path (`CountedFile.size`).
    """
    found = _COUNTED.match(instruction)
    if found is None or found["path"] not in existing:
        return None
    return CountedFile(found["path"], found["unit"].lower(), (sizes or {}).get(found["path"], 0))


@dataclass(frozen=True)
class FolderFiles:
    """The files of a folder a step works on ("summarise the three files in ./notes"): listed, then read.

    Found by the new-user review with the embedded model: "summarise the three files in ./notes
    into summary.md" was planned with `read_file` and `write_file`; the step read nothing and
    wrote a summary of nothing into summary.md, and the run succeeded. Now the engine lists the
    folder, reads each file it holds (through the normal tool path) and drafts the text from
    what they hold; a folder that cannot be listed, holds no file or has a file that cannot be
    read fails the step, in those words. Which files are read is `reading`'s choice.
    """

    path: str
    """The folder, relative to the workspace; "." is the workspace itself."""
    tool: ClassVar[str] = "list_files"

    @property
    def arguments(self) -> dict[str, str]:
        """The `list_files` call's arguments: the folder (none for the workspace itself)."""
        return {} if self.path == "." else {"path": self.path}

    @property
    def shown(self) -> str:
        """The folder as a message names it ("notes/", "the workspace")."""
        return "the workspace" if self.path == "." else f"{self.path}/"

    def files(self, listing: str) -> list[str]:
        """The workspace paths of the files a `list_files` listing of the folder shows (not its folders)."""
        names = [
            fields[0]
            for fields in (line.split("\t") for line in listing.splitlines())
            if len(fields) == 3 and fields[1] == "file"
        ]
        return names if self.path == "." else [f"{self.path}/{name}" for name in names]

    def reading(self, listing: str, limit: int) -> FolderReading:
        """Which of the files a `list_files` listing of the folder shows are read: at most `limit`.

        Hidden files (a name starting with a dot: `.DS_Store`, `.gitignore`) are left out unless
        the folder holds no other; past `limit` files (by name, as listed) the rest are left out.
        Each leaving-out is said (`FolderReading.left_out`): before, they were dropped silently.
        """
        files = self.files(listing)
        sizes = self._sizes(listing)
        hidden = [path for path in files if path.rsplit("/", 1)[-1].startswith(".")]
        shown = [path for path in files if path not in hidden]
        if not shown:  # a folder of hidden files only: those are its files
            shown, hidden = hidden, []
        left_out: list[str] = []
        if hidden:
            left_out.append(f"{_files(len(hidden), 'hidden file')} left out: {_some(hidden)}")
        if len(shown) > limit:
            past = shown[limit:]
            left_out.append(f"{_files(len(past), 'file')} past the first {limit} left out: {_some(past)}")
        unlisted = _UNLISTED.search(listing)
        if unlisted:
            more = int(unlisted["total"].replace(",", "")) - int(unlisted["shown"].replace(",", ""))
            left_out.append(
                f"{more:,} more entries of {self.shown} not looked at (the listing shows at most 500)"
            )
        read = tuple(shown[:limit])
        over_limit = tuple(path for path in read if sizes[path] > MAX_READ_BYTES)
        return FolderReading(read, tuple(left_out), over_limit)

    def _sizes(self, listing: str) -> dict[str, int]:
        """The sizes in bytes of the files a `list_files` listing of the folder shows, by workspace path."""
        rows = (line.split("\t") for line in listing.splitlines())
        sizes = {
            fields[0]: int(fields[2]) if fields[2].isascii() and fields[2].isdigit() else 0
            for fields in rows
            if len(fields) == 3 and fields[1] == "file"
        }
        return sizes if self.path == "." else {f"{self.path}/{name}": size for name, size in sizes.items()}


_UNLISTED = re.compile(
    r"^\[listing cut: the first (?P<shown>[\d,]+) of (?P<total>[\d,]+) entries", re.MULTILINE
)
"""The line `list_files` ends a listing cut at its most entries with."""


def _files(count: int, kind: str) -> str:
    return f"1 {kind}" if count == 1 else f"{count:,} {kind}s"


def _some(names: list[str], most: int = 8) -> str:
    """`names` joined, at most `most` of them and how many more."""
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most:,} more"


@dataclass(frozen=True)
class FolderReading:
    """The files of a folder a step reads (`FolderFiles.reading`), and what it left out."""

    read: tuple[str, ...]
    """The workspace paths of the files read, in the listing's order."""
    left_out: tuple[str, ...] = ()
    """What was not read, a line each in our words ("1 hidden file left out: notes/.DS_Store")."""
    over_limit: tuple[str, ...] = ()
    """Those of `read` the listing shows over `read_file`'s limit: it returns only their start."""

    def texts(self, contents: Mapping[str, str]) -> FolderTexts:
        """The text of each file read (`contents`: what each `read_file` call returned, by path).

        A binary file (`is_binary`: an image, an archive) is left out, as is said. A file the
        listing shows over the read limit was read from its start, under the line `read_file`
        says so in (`FILE_CUT`): that line is taken off and said. Only then: a file's own first
        line is never taken for ours (before, a file beginning "[file cut: " had that line shown
        to the model as our note, and said in the step's output). A text with a few bytes that
        are not UTF-8 is read with them replaced, as is said (before, one "é" of a Latin-1 CSV
        left the whole file out). `contents` are what the calls returned, not the conversation's
        copy `trim_history` may have cut (`working_memory.untrimmed`).
        """
        texts: dict[str, str] = {}
        notes: list[str] = list(self.left_out)
        binary: list[str] = []
        for path in self.read:
            text = contents[path]
            if path in self.over_limit and text.startswith(FILE_CUT):
                said, _, text = text.partition("\n")
                notes.append(f"{path}: {said.removeprefix(FILE_CUT).removesuffix(']')}")
            if is_binary(text):
                binary.append(path)
                continue
            if replaced := text.count("\ufffd"):
                were = "that is not UTF-8 was" if replaced == 1 else "that are not UTF-8 were"
                notes.append(f"{path}: {_files(replaced, 'character')} {were} replaced with \ufffd")
            texts[path] = text
        if binary:
            notes.append(f"{_files(len(binary), 'file')} left out, not UTF-8 text: {_some(binary)}")
        return FolderTexts(texts, tuple(notes))


BINARY_SHARE = 20
"""A text is binary when more than one character in this many was not UTF-8 (replaced)."""


def is_binary(text: str) -> bool:
    """Whether a file's text (as `read_file` decodes it) is what a person calls binary, not text.

    A NUL byte, or more than one character in `BINARY_SHARE` replaced as not UTF-8 (an image,
    an archive). A text with a few such bytes (a Latin-1 "é") is text.
    """
    return "\x00" in text or text.count("\ufffd") * BINARY_SHARE > len(text)


@dataclass(frozen=True)
class FolderTexts:
    """The texts of the files of a folder a step read (`FolderReading.texts`), and what was left out."""

    texts: Mapping[str, str]
    """Each text file's text as read, by path."""
    notes: tuple[str, ...] = ()
    """What was not read, or read only in part, a line each in our words."""

    def shown(self, room: int) -> tuple[str, tuple[str, ...]]:
        """The files' texts as a model is shown them in `room` characters, and all that was not shown.

        Each file is shown under its path ("notes/a.txt holds:"); short ones whole, the room left
        split evenly among the long ones (`working_memory.input_shares`), each cut one saying so in
        its heading. Files for which there is no room even for a start are left out from the
        last; the first file is always shown. Before, each file's first 1,500 characters were
        shown, however many files there were and whatever the model's window.
        """
        paths = list(self.texts)
        notes = list(self.notes)
        while True:
            spare = room - sum(len(path) + _HEADING_CHARS for path in paths)
            shares = input_shares({path: len(self.texts[path].strip()) for path in paths}, max(spare, 0))
            if len(paths) == 1 or sum(shares.values()) <= spare:
                break
            notes.append(f"{paths.pop()}: not shown, the model's context had no room for it")
        blocks: list[str] = []
        for path in paths:
            text = self.texts[path]
            shown = text.strip()[: max(shares[path], _LEAST_SHOWN)].strip()
            if len(shown) < len(text.strip()):
                part = f"its first {len(shown):,} of {len(text):,} characters"
                notes.append(f"{path}: the model was shown {part}, to fit its context")
                blocks.append(f"{path} holds (only {part}):\n{shown}")
            else:
                blocks.append(f"{path} holds:\n{shown}")
        return "\n\n".join(blocks), tuple(notes)


_HEADING_CHARS = 64
"""What a file's heading takes beside its path ("holds (only its first … characters):"), at most."""
_LEAST_SHOWN = 200
"""The start of a file shown however little room there is (the first file is always shown)."""
