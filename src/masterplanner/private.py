"""Folders and files masterplanner makes to hold run data: their owner's only.

The home is made 0700 wherever it is made (`Settings.ensure_home`); what is made in it or for a
run is made the same way: a folder (`logs/`, `workspaces/`, a run's workspace, and every folder
made on the way to one) 0700, a file that holds data (an MCP server's log) 0600. Before, those
took the umask's mode (0755 and 0644 under the usual 022): a home the person made themselves
kept their mode, and the runs' files and the servers' logs inside it could be read by every
user of the machine. A folder or file that is there already keeps the mode it has: the person
may have made it and chosen it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["create_private_file", "private_folder"]


def private_folder(path: Path) -> Path:
    """Make the folder `path` and each missing folder above it, each 0700; one there already is left as it is.

    Raises `FileExistsError` when `path` or a folder above it is a file, and `OSError` for any
    other failure, as `Path.mkdir(parents=True, exist_ok=True)` does.
    """
    missing: list[Path] = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            if not folder.is_dir():  # a file, or a link to nothing; a folder made meanwhile is fine
                raise
    return path


def create_private_file(path: Path) -> None:
    """Create the file `path`, empty and 0600, unless it is there already (then it keeps its mode)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        pass
