"""Text files a person hands us (settings, a model script, a task suite, an agents export, benchmark data).

One reader, so that each refuses a file the same way and in our words: missing, a folder,
unreadable, or not UTF-8 (with the byte that is not), never Python's codec message; and one
wording of where and why such text is not JSON (`json_problem`).
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import ConfigError

__all__ = ["json_problem", "read_text"]


def read_text(path: Path, what: str = "", *, error: type[ConfigError] = ConfigError, after: str = "") -> str:
    """The file's text as UTF-8.

    `error` (a `ConfigError`) when it cannot be read, naming `what` the file is ("scripted model
    file") and the file; `after` ends the message ("; nothing was imported").
    """
    named = f"{what} {path}" if what else str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{named} does not exist{after}") from None
    except IsADirectoryError:
        raise error(f"{named} is a folder, not a file{after}") from None
    except OSError as exc:
        raise error(f"cannot read {named}: {exc.strerror or exc}{after}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{named}: not UTF-8 text (byte {exc.start + 1} is not): save it as UTF-8{after}"
        ) from None


_JSON_PROBLEMS = (
    ("Expecting value", "a value was expected"),
    ("Expecting property name enclosed in double quotes", "a key in double quotes was expected"),
    ("Expecting ',' delimiter", "a comma was expected"),
    ("Expecting ':' delimiter", "a colon was expected"),
    ("Extra data", "more text follows the JSON value"),
    ("Unterminated string", "a string is not closed"),
    ("Invalid control character", "a string holds a control character (write it as an escape)"),
    ("Invalid \\escape", "a string holds an escape JSON does not have"),
    ("Invalid \\uXXXX escape", "a string holds a \\u escape without four hex digits"),
)


def json_problem(error: json.JSONDecodeError) -> str:
    """Where text is not JSON and why, in our words: `line 3, column 5: a comma was expected`."""
    known = (ours for theirs, ours in _JSON_PROBLEMS if error.msg.startswith(theirs))
    why = next(known, "not valid JSON here")
    return f"line {error.lineno}, column {error.colno}: {why}"
