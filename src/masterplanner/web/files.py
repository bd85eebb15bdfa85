"""A run's workspace files on its page: listed (`workspace_files`), and served one at a time.

A file is served only from inside the run's workspace, checked on the opened file itself (the
run's code may swap a folder for a link meanwhile).
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, Response
from starlette.background import BackgroundTask

from ..tools.workspace import walk_files
from .api import existing_run

__all__ = ["router", "workspace_files"]

router = APIRouter(include_in_schema=False)

_MAX_FILES = 200


@router.get("/runs/{run_id}/file")
async def workspace_file(request: Request, run_id: str, path: str) -> Response:
    """One file of the run's workspace (images and text shown by the browser, others downloaded)."""
    record = await existing_run(request, run_id)
    opened = await asyncio.to_thread(_open_inside, record.workspace, path)
    if opened is None:
        raise HTTPException(404, f"the workspace of run {record.id} has no file {path!r}")
    file, name = opened
    inline = Path(name).suffix.lower() in (".png", ".jpg", ".jpeg", ".gif", ".webp", ".txt", ".md")
    # served from the file that was checked: its descriptor's own path reopens that very file,
    # whatever the step's code renames or links meanwhile (closed once sent, or when dropped)
    return FileResponse(
        f"/proc/self/fd/{file.fileno()}",
        filename=name,
        stat_result=os.fstat(file.fileno()),
        content_disposition_type="inline" if inline else "attachment",
        background=BackgroundTask(file.close),
    )


def _open_inside(workspace: str, path: str) -> tuple[BinaryIO, str] | None:
    """The regular file `path` names inside `workspace`, and its name, or None.

    Links are resolved and must stay inside. The check is made on the opened file, not on the
    path: the run's code may swap a folder on the way for a link out between a check of the path
    and its opening, and the file served would then be from outside the workspace.
    """
    if "\x00" in path:  # no file has it in its name (the path functions refuse it with an error)
        return None
    root = os.path.realpath(workspace)
    target = os.path.realpath(os.path.join(root, path))
    if os.path.commonpath([root, target]) != root:
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(target, flags)
    except OSError:  # gone, a link now, or not readable
        return None
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
        inside = os.path.commonpath([root, opened]) == root and stat.S_ISREG(os.fstat(fd).st_mode)
    except (OSError, ValueError):
        inside = False
    if inside:
        return os.fdopen(fd, "rb"), os.path.basename(target)  # (`opened` ends " (deleted)" once removed)
    os.close(fd)
    return None


def workspace_files(workspace: str) -> list[dict[str, Any]]:
    """The workspace's regular files (not following links), by path, at most `_MAX_FILES`.

    A name that is not UTF-8 is shown with its bytes escaped and not linked (the page failed on it).
    """
    found: list[dict[str, Any]] = []
    root = Path(workspace)
    if not root.is_dir():
        return found
    for entry in walk_files(root, enters=lambda name: not name.startswith(".")):
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:  # gone since it was listed
            continue
        if stat.S_ISREG(info.st_mode):
            path = str(Path(entry.path).relative_to(root))
            try:
                path.encode("utf-8")
            except UnicodeEncodeError:  # a name that is not UTF-8: shown escaped, with no link
                shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                found.append({"path": shown, "bytes": info.st_size, "linked": False})
            else:
                found.append({"path": path, "bytes": info.st_size, "linked": True})
        if len(found) >= _MAX_FILES:
            return found
    return found
