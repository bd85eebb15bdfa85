"""The workspace file tools treat the workspace as hostile: no escape by path, symlink or special file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from masterplanner import ToolError
from masterplanner.tools.workspace import MAX_READ_BYTES, Workspace


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "ws").create()


def test_write_read_list_round_trip(workspace: Workspace) -> None:
    assert workspace.write_file("notes/a.md", "héllo") == "wrote 6 bytes to notes/a.md"
    assert workspace.read_file("notes/a.md") == "héllo"
    assert workspace.read_file("./notes/a.md") == "héllo"
    assert [(e.name, e.kind, e.size) for e in workspace.list_files()] == [("notes", "directory", 0)]
    assert [(e.name, e.kind, e.size) for e in workspace.list_files("notes")] == [("a.md", "file", 6)]
    workspace.write_file("notes/a.md", "replaced")
    assert workspace.read_file("notes/a.md") == "replaced"
    assert sorted(os.listdir(workspace.root / "notes")) == ["a.md"]  # no temporary file left behind


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../escape.txt", "contains '..'"),
        ("a/../../escape.txt", "contains '..'"),
        ("/etc/passwd", "is absolute"),
        ("", "the path is empty"),
        ("a\x00b", "NUL"),
    ],
)
def test_paths_that_leave_the_workspace_are_refused(workspace: Workspace, path: str, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        workspace.write_file(path, "x")
    with pytest.raises(ToolError, match=message):
        workspace.read_file(path)


def test_planted_symlinks_are_never_followed(workspace: Workspace, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace.root / "link.txt").symlink_to(secret)
    (workspace.root / "dir").symlink_to(outside)
    with pytest.raises(ToolError, match="symlink"):
        workspace.read_file("link.txt")
    with pytest.raises(ToolError, match="is a symlink; write_file only"):
        workspace.write_file("link.txt", "overwrite")
    with pytest.raises(ToolError, match="not a directory"):
        workspace.write_file("dir/planted.txt", "x")
    with pytest.raises(ToolError, match="not a directory"):
        workspace.list_files("dir")
    assert secret.read_text() == "secret"
    assert list(outside.iterdir()) == []
    assert {(e.name, e.kind) for e in workspace.list_files()} == {("link.txt", "symlink"), ("dir", "symlink")}
    assert not workspace.is_file("link.txt")


def test_special_and_oversized_files(workspace: Workspace) -> None:
    os.mkfifo(workspace.root / "fifo")
    with pytest.raises(ToolError, match="not a regular file"):
        workspace.read_file("fifo")
    (workspace.root / "big.txt").write_bytes(b"x" * (MAX_READ_BYTES + 1))
    with pytest.raises(ToolError, match="read_file returns at most"):
        workspace.read_file("big.txt")
    with pytest.raises(ToolError, match="does not exist"):
        workspace.read_file("missing.txt")


def test_delete_file_removes_files_and_links_but_never_targets_or_folders(
    workspace: Workspace, tmp_path: Path
) -> None:
    target = tmp_path / "keep.txt"
    target.write_text("keep")
    (workspace.root / "link.txt").symlink_to(target)
    workspace.write_file("sub/a.txt", "a")
    assert workspace.delete_file("link.txt") == "deleted link.txt"
    assert target.read_text() == "keep"
    assert workspace.delete_file("sub/a.txt") == "deleted sub/a.txt"
    with pytest.raises(ToolError, match="is a directory"):
        workspace.delete_file("sub")
    with pytest.raises(ToolError, match="does not exist"):
        workspace.delete_file("sub/a.txt")
    with pytest.raises(ToolError, match=r"contains '\.\.'"):
        workspace.delete_file("../keep.txt")
    assert target.exists()
