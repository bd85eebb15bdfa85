r"""Text the CLI did not write, made safe to print: control characters shown, never obeyed.

Model replies, tool results, step outputs, event data, plan fields, stored agents, memories and
lessons, file names and error messages may hold terminal escape sequences (OSC 52 writes the
clipboard, OSC 0 the window title, CSI clears the screen or moves the cursor), 8-bit C1
controls, BEL, backspace and carriage-return overwrites, or bidi overrides that reorder what the
person reads. `visible` writes each such character as an escape (`\x1b`, `\x9b`, `\u202e`), so
the terminal receives plain printable text; `shown` also escapes rich markup, for text that goes
into a markup string (between tags, never inside a tag's brackets). JSON output goes through
`json_text`, which escapes every non-ASCII character, so it cannot carry raw control or bidi
characters either.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

__all__ = ["json_text", "shown", "visible"]

_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
_KEPT_IN_LINES = frozenset("\n\t")
# Zero-width joiners shape emoji and scripts; every other format character is shown.
_KEPT_FORMAT = frozenset("\u200c\u200d")
# control, surrogate, line and paragraph separator, format (bidi overrides and isolates, tags, …)
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp", "Cf"})


def _escaped(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: str, *, lines: bool = False) -> str:
    r"""`text` with every control, format and bidi character written as a visible escape.

    With `lines` (multi-line text: outputs, prompts, instructions) newlines and tabs are kept
    and a CRLF line end counts as a newline; otherwise they are shown too (`\n`, `\t`), so one
    field stays one line.
    """
    if lines:
        text = text.replace("\r\n", "\n")

    def replace(match: re.Match[str]) -> str:
        char = match.group()
        if lines and char in _KEPT_IN_LINES:
            return char
        hidden = unicodedata.category(char) in _HIDDEN_CATEGORIES and char not in _KEPT_FORMAT
        return _escaped(char) if hidden else char

    return _NOT_PRINTABLE_ASCII.sub(replace, text)


# a tag as rich's markup parser finds one, with the backslashes before it (rich.markup.RE_TAGS)
_MARKUP_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")
_BACKSLASHES_BEFORE_BRACKET = re.compile(r"(\\+)\[")
_TRAILING_BACKSLASHES = re.compile(r"(\\+)\Z")
_BARRIER = "[dim][/dim]"
"""An empty tag: it prints nothing, and no tag can begin before it and end after it."""


def _escape_markup(text: str) -> str:
    """`text` as markup rich prints as exactly `text`, whatever markup comes before or after it."""
    escaped: list[str] = []
    position = 0
    for tag in _MARKUP_TAG.finditer(text):
        escaped.append(_escape_brackets(text[position : tag.start()]))
        escaped.append(f"{tag[1]}{tag[1]}\\{tag[2]}")  # 2n+1 backslashes: n printed, the tag escaped
        position = tag.end()
    rest = _escape_brackets(text[position:])
    if "[" in rest or rest.endswith("\\"):
        # an unclosed `[x` could be closed by a `]` of the markup after it, and a trailing backslash
        # would escape the markup's next tag: double the backslashes, then end with the barrier
        rest = _TRAILING_BACKSLASHES.sub(lambda run: run[1] * 2, rest) + _BARRIER
    escaped.append(rest)
    return "".join(escaped)


def _escape_brackets(plain: str) -> str:
    # rich turns `\[` into `[` in plain text: one more backslash keeps the run whole
    return _BACKSLASHES_BEFORE_BRACKET.sub(lambda run: f"{run[1]}\\[", plain)


def shown(value: object, *, lines: bool = False) -> str:
    """`value` as rich markup that prints exactly `visible(str(value))`: `[tags]` stay literal text.

    Unlike `rich.markup.escape`, the result prints the same wherever it is put in other markup
    (a trailing backslash or an unclosed `[` cannot combine with the tags around it).
    """
    return _escape_markup(visible(str(value), lines=lines))


def json_text(payload: Any, *, indent: int = 2) -> str:
    r"""`payload` as indented JSON in pure ASCII: control, C1 and bidi characters are `\u` escapes."""
    return json.dumps(payload, indent=indent, ensure_ascii=True)
