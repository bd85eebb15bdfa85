"""Files that make the host act: a step may never create, change or delete them in a workspace.

A workspace is a folder the person may later work in. Some files there are read by programs the
person runs in that folder, and turn their content into actions: masterplanner's own settings
(MCP server commands, tool policies), git's config and hooks (`core.fsmonitor` runs a command on
`git status`), direnv's `.envrc`, editors' task and agent settings, shell start-up files. Tool
output must never become such configuration, so:

- the file tools refuse a path with any component named here (`write_file`, `delete_file`,
  `generate_image`);
- `code_execution` sees the existing ones read-only, and any such entry the program creates is
  removed after it exits (the tool result says so);
- masterplanner's settings file may hold secrets, so steps may not read it either: `read_file`
  refuses it and `code_execution` sees it empty.

Names are compared case-insensitively, and NFKC-normalised and case-folded as well: a
case-insensitive file system folds more than `str.lower` does (a long s, U+017F, matches an s;
a fullwidth dot matches a dot), so no such spelling of a protected name slips past.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

__all__ = [
    "PROTECTED_NAMES",
    "UNREADABLE_NAMES",
    "protected_component",
    "protection_notice",
    "unreadable_component",
    "unreadable_notice",
]

PROTECTED_NAMES: frozenset[str] = frozenset(
    {
        # masterplanner's own settings: MCP server commands, tool policies, allowlists
        "masterplanner.toml",
        # version control: config and hooks run commands (core.fsmonitor, core.hooksPath, hooks/)
        ".git",
        ".gitmodules",
        ".hg",
        ".svn",
        # environment loaders that run code or set variables when the person enters the folder
        ".envrc",
        # editors and coding agents: tasks, hooks and MCP servers they start in this folder
        ".vscode",
        ".idea",
        ".claude",
        ".cursor",
        ".mcp.json",
        # package managers: npm reads `script-shell` and registries from the project folder
        ".npmrc",
        # shell start-up files (a workspace inside a home directory)
        ".bashrc",
        ".bash_profile",
        ".bash_login",
        ".bash_logout",
        ".profile",
        ".zshrc",
        ".zshenv",
        ".zprofile",
        ".zlogin",
    }
)
"""Entry names (files or folders, at any depth) that steps may not create, change or delete."""


UNREADABLE_NAMES: frozenset[str] = frozenset({"masterplanner.toml"})
"""Protected names steps may not read either: masterplanner's settings may hold secrets (an MCP
server's `env`), and a workspace given as `--workspace .` holds the folder's settings file."""


def _named(parts: Iterable[str], names: frozenset[str]) -> str | None:
    for part in parts:
        if part.lower() in names or unicodedata.normalize("NFKC", part).casefold() in names:
            return part
    return None


def protected_component(parts: Iterable[str]) -> str | None:
    """The first component of a workspace path that is (or a file system may take for) a protected name."""
    return _named(parts, PROTECTED_NAMES)


_BACKUP = re.compile(r"^[.#]?(?P<name>.+?)(?:~|#|\.(?:bak|orig|old|save|tmp|sw[a-p]|un~))*$", re.IGNORECASE)
"""An editor's or a person's copy of a file: `name~`, `name.bak`, `.name.swp`, `.name.un~`, `#name#`, …"""


def unreadable_component(parts: Iterable[str]) -> str | None:
    """The first component of a workspace path that names a file steps may not read, or its backup.

    An editor's or a person's copy (`masterplanner.toml~`, `.masterplanner.toml.swp`) holds the
    same secrets.
    """
    for part in parts:
        for spelling in (part, unicodedata.normalize("NFKC", part)):  # a fullwidth dot before `bak`
            found = _BACKUP.match(spelling)
            if _named([spelling, found["name"] if found else spelling], UNREADABLE_NAMES) is not None:
                return part
    return None


def unreadable_notice(name: str) -> str:
    """Why a step may not read `name`."""
    return f"{name!r} holds masterplanner's settings, which may hold secrets; steps may not read it"


def protection_notice(name: str) -> str:
    """Why a step may not touch `name`, in words the agent (and the person) can act on."""
    return (
        f"{name!r} is a file or folder that makes the host act (settings, hooks or start-up code read by "
        "programs the person runs in this folder); steps may not create, change or delete it"
    )
