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
from dataclasses import dataclass
from typing import ClassVar, Literal

__all__ = [
    "CountedFile",
    "FolderFiles",
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
    tool: ClassVar[str] = "read_file"

    @property
    def arguments(self) -> dict[str, str]:
        """The `read_file` call's arguments."""
        return {"path": self.path}

    def answer(self, text: str) -> str:
        """How many items (non-blank lines, or words) `text` holds."""
        if self.unit == "words":
            return str(len(text.split()))
        return str(sum(1 for line in text.splitlines() if line.strip()))

    def heading(self) -> str:
        """What the answer is ("The number of names in names.txt")."""
        return f"The number of {self.unit} in {self.path}"


def counted_file(instruction: str, existing: tuple[str, ...] | list[str]) -> CountedFile | None:
    """The count a step asks of one existing text file ("Count the names in names.txt"), else None."""
    found = _COUNTED.match(instruction)
    if found is None or found["path"] not in existing:
        return None
    return CountedFile(found["path"], found["unit"].lower())


@dataclass(frozen=True)
class FolderFiles:
    """The files of a folder a step works on ("summarise the three files in ./notes"): listed, then read.

    Found by the new-user review with the embedded model: "summarise the three files in ./notes
    into summary.md" was planned with `read_file` and `write_file`; the step read nothing and
    wrote a summary of nothing into summary.md, and the run succeeded. Now the engine lists the
    folder, reads each file it holds (through the normal tool path) and drafts the text from
    what they hold; a folder that cannot be listed, holds no file or has a file that cannot be
    read fails the step, in those words.
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
