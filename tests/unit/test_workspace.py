"""The workspace file tools treat the workspace as hostile: no escape by path, symlink or special file."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from masterplanner import ToolError
from masterplanner.tools.protected import PROTECTED_NAMES as _NAMES
from masterplanner.tools.workspace import MAX_READ_BYTES, Workspace, walk_files


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
    # its start can be read (a folder's files are read so), with the file's size
    assert workspace.read_start("big.txt") == ("x" * MAX_READ_BYTES, MAX_READ_BYTES + 1)
    # a character the cut falls inside is left out, not replaced: it is not invalid
    (workspace.root / "wide.txt").write_bytes(b"x" * (MAX_READ_BYTES - 1) + "é".encode())
    assert workspace.read_start("wide.txt") == ("x" * (MAX_READ_BYTES - 1), MAX_READ_BYTES + 1)
    workspace.write_file("fits.txt", "é")
    assert workspace.read_start("fits.txt") == ("é", 2)
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


PROTECTED_PATHS = [
    "masterplanner.toml",
    "MasterPlanner.TOML",
    "sub/masterplanner.toml",
    ".git/config",
    ".git/hooks/pre-commit",
    "a/.git/config",
    ".envrc",
    ".vscode/tasks.json",
    ".claude/settings.json",
    ".mcp.json",
]


@pytest.mark.parametrize("path", PROTECTED_PATHS)
def test_protected_files_are_never_created_changed_or_deleted(workspace: Workspace, path: str) -> None:
    component = next(part for part in path.split("/") if part.lower() in {n.lower() for n in _NAMES})
    notice = f"{component!r} is a file or folder that makes the host act"
    for action in (
        lambda: workspace.write_file(path, "[hooks]"),
        lambda: workspace.write_bytes(path, b"[hooks]"),
        lambda: workspace.delete_file(path),
    ):
        with pytest.raises(ToolError, match=re.escape(notice)):
            action()
    assert list(workspace.root.iterdir()) == []  # not even the missing folders were created

    # An existing one stays as it is, and can still be read and listed.
    target = workspace.root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("original")
    with pytest.raises(ToolError, match="steps may not create, change or delete it"):
        workspace.write_file(path, "changed")
    with pytest.raises(ToolError, match="steps may not create, change or delete it"):
        workspace.delete_file(path)
    assert target.read_text() == "original"
    if "masterplanner.toml" not in path.lower():  # settings are not read (the test below)
        assert workspace.read_file(path) == "original"
    assert workspace.is_file(path)
    assert [entry.name for entry in workspace.list_files(str(PurePosixPath(path).parent))] == [target.name]


def test_protected_names_cannot_be_spelled_otherwise(workspace: Workspace) -> None:
    for path in (".GIT/config", "./.git/config", "x/./.Envrc", "ma\u017fterplanner.toml", "\uff0egit/config"):
        with pytest.raises(ToolError, match="steps may not create, change or delete it"):
            workspace.write_file(path, "x")
    # A protected name as a folder cannot be deleted either (delete_file never removes folders).
    (workspace.root / ".git").mkdir()
    with pytest.raises(ToolError, match="steps may not create, change or delete it"):
        workspace.delete_file(".git")
    # Names that merely resemble a protected one are ordinary files.
    assert workspace.write_file("git/config", "x") == "wrote 1 bytes to git/config"
    assert workspace.write_file("masterplanner.toml.bak", "x") == "wrote 1 bytes to masterplanner.toml.bak"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("a" * 256, f"name '{'a' * 40}…' is 256 bytes; a file name may have at most 255"),
        ("d/" + "é" * 128, "is 256 bytes; a file name may have at most 255"),
        ("ab/" * 1400 + "x", "is 4,201 bytes; a path may have at most 4,095"),
        ("bad\udcff.txt", r"contains a lone surrogate \(U\+DCFF\) at character 3, which is not valid text"),
        ("\ud800", r"lone surrogate \(U\+D800\)"),
        ("a\nb.txt", r"control character \(U\+000A\)"),
        ("a\tb.txt", r"control character \(U\+0009\)"),
    ],
)
def test_names_no_file_system_or_model_api_takes_are_refused(
    workspace: Workspace, path: str, message: str
) -> None:
    for action in (
        lambda: workspace.write_file(path, "x"),
        lambda: workspace.read_file(path),
        lambda: workspace.delete_file(path),
        lambda: workspace.list_files(path),
    ):
        with pytest.raises(ToolError, match=message):
            action()
    assert not workspace.is_file(path)
    assert list(workspace.root.iterdir()) == []


def test_names_at_the_limit_work_and_leave_no_temporary_file(workspace: Workspace) -> None:
    name = "n" * 255  # the temporary file's name must not be longer than the file's
    assert workspace.write_file(name, "x") == f"wrote 1 bytes to {name}"
    assert workspace.write_file(name, "y") == f"wrote 1 bytes to {name}"
    assert workspace.read_file(name) == "y"
    assert os.listdir(workspace.root) == [name]
    assert workspace.delete_file(name) == f"deleted {name}"


def test_a_deep_tree_is_walked_without_recursion_or_path_limits(workspace: Workspace) -> None:
    # Code run in the workspace can make a tree 1,100 levels deep; the file tools still work in it.
    folder = os.open(workspace.root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1100):
        os.mkdir("d", dir_fd=folder)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=folder)
        os.close(folder)
        folder = inner
    with os.fdopen(os.open("leaf.txt", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=folder), "w") as leaf:
        leaf.write("deep")
    os.close(folder)
    deep = "d/" * 1100 + "leaf.txt"
    try:
        assert workspace.read_file(deep) == "deep"
        assert workspace.is_file(deep)
        assert [(e.name, e.kind) for e in workspace.list_files("d/" * 1100)] == [("leaf.txt", "file")]
        with pytest.raises(
            ToolError, match="is 1,101 levels deep; write_file creates files at most 64 levels"
        ):
            workspace.write_file(deep, "x")
        assert workspace.delete_file(deep) == f"deleted {deep}"
        assert workspace.write_file("e/" * 63 + "leaf.txt", "x") == f"wrote 1 bytes to {'e/' * 63}leaf.txt"
    finally:
        (workspace.root / deep).unlink(missing_ok=True)
        for depth in range(1100, 0, -1):  # shutil.rmtree (pytest's clean-up) recurses once per level
            (workspace.root / ("d/" * depth)).rmdir()


def test_wrong_types_and_bad_content_are_tool_errors(workspace: Workspace) -> None:
    bad: Any = 42
    nothing: Any = None
    with pytest.raises(ToolError, match="the path must be text, got int"):
        workspace.read_file(bad)
    with pytest.raises(ToolError, match="the path must be text, got NoneType"):
        workspace.list_files(nothing)
    with pytest.raises(ToolError, match="the content must be text, got int"):
        workspace.write_file("a.txt", bad)
    with pytest.raises(ToolError, match="the content must be bytes, got str"):
        workspace.write_bytes("a.txt", str(bad))
    with pytest.raises(
        ToolError,
        match=r"the content has a lone surrogate \(U\+DCFF\) at character 2, which cannot be written",
    ):
        workspace.write_file("a.txt", "ok\udcff")
    assert not workspace.is_file(bad)
    assert list(workspace.root.iterdir()) == []


def test_a_file_where_a_folder_is_expected(workspace: Workspace) -> None:
    workspace.write_file("notes.txt", "x")
    with pytest.raises(ToolError, match=r"'notes\.txt' is a file, not a directory"):
        workspace.write_file("notes.txt/a.txt", "x")
    with pytest.raises(ToolError, match=r"'notes\.txt' is a file, not a directory"):
        workspace.read_file("notes.txt/a.txt")
    with pytest.raises(ToolError, match=r"'notes\.txt' is a file, not a directory"):
        workspace.list_files("notes.txt")
    with pytest.raises(ToolError, match=r"'notes\.txt' is a file, not a directory"):
        workspace.delete_file("notes.txt/a.txt")
    assert not workspace.is_file("notes.txt/a.txt")


def test_listing_a_directory_removed_meanwhile(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    workspace.write_file("gone/a.txt", "x")
    real_listdir = os.listdir

    def remove_then_list(target: Any) -> list[str]:
        (workspace.root / "gone" / "a.txt").unlink()
        (workspace.root / "gone").rmdir()
        return real_listdir(target)  # glibc reads a removed directory as empty

    monkeypatch.setattr(os, "listdir", remove_then_list)
    assert workspace.list_files("gone") == []

    def vanished(target: Any) -> list[str]:  # what the kernel's getdents itself says (ENOENT)
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")

    monkeypatch.setattr(os, "listdir", vanished)
    with pytest.raises(ToolError, match=r"cannot list '\.': it does not exist \(any more\)"):
        workspace.list_files(".")


def test_odd_names_made_by_code_are_listed_escaped(workspace: Workspace) -> None:
    os.close(os.open(os.path.join(os.fsencode(workspace.root), b"bad\xff.txt"), os.O_CREAT | os.O_WRONLY))
    (workspace.root / "two\nlines\tfile").write_text("x")
    assert [e.name for e in workspace.list_files()] == ["bad\\xff.txt", "two\\x0alines\\x09file"]


@pytest.mark.parametrize(
    ("failing", "code", "message"),
    [
        ("write", errno.ENOSPC, "cannot write 'out/a.txt': the disk is full"),
        ("fsync", errno.EDQUOT, "cannot write 'out/a.txt': the disk quota is used up"),
        ("write", errno.EFBIG, "cannot write 'out/a.txt': the file is larger than the file system allows"),
        ("fsync", errno.EIO, "cannot write 'out/a.txt': the disk reported an input/output error"),
        ("rename", errno.EROFS, "cannot write 'out/a.txt': the file system is read-only"),
        ("mkdir", errno.EROFS, "cannot create directory 'out': the file system is read-only"),
        ("mkdir", errno.EACCES, "cannot create directory 'out': permission denied"),
        ("open", errno.EACCES, "cannot write 'out/a.txt': permission denied"),
        ("open", errno.ENAMETOOLONG, "a name in the path is too long for this file system"),
        ("open", errno.EOVERFLOW, r"cannot write 'out/a.txt': .* \(EOVERFLOW\)"),
    ],
)
def test_disk_errors_while_writing_are_tool_errors_and_leave_nothing_behind(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch, failing: str, code: int, message: str
) -> None:
    (workspace.root / "out").mkdir()
    real = getattr(os, failing)

    def fail(*args: Any, **kwargs: Any) -> Any:
        if failing == "open" and args[1] & os.O_DIRECTORY:
            return real(*args, **kwargs)  # the folders open; the file does not
        raise OSError(code, os.strerror(code))

    with monkeypatch.context() as patched:  # undone here (not the fixtures' patches too)
        patched.setattr(os, failing, fail)
        if failing == "mkdir":
            (workspace.root / "out").rmdir()
        with pytest.raises(ToolError, match=message):
            workspace.write_file("out/a.txt", "content")
    assert [p.name for p in workspace.root.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize(
    ("action", "failing", "code", "message"),
    [
        ("read", "read", errno.EIO, "cannot read 'a.txt': the disk reported an input/output error"),
        ("read", "open", errno.EACCES, "cannot read 'a.txt': permission denied"),
        ("delete", "unlink", errno.EROFS, "cannot delete 'a.txt': the file system is read-only"),
        ("delete", "unlink", errno.EPERM, "cannot delete 'a.txt': the operation is not permitted"),
        ("list", "listdir", errno.EACCES, "cannot list '.': permission denied"),
    ],
)
def test_disk_errors_while_reading_listing_and_deleting_are_tool_errors(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch, action: str, failing: str, code: int, message: str
) -> None:
    workspace.write_file("a.txt", "x")
    real = getattr(os, failing)

    def fail(*args: Any, **kwargs: Any) -> Any:
        if failing == "open" and args[1] & os.O_DIRECTORY:
            return real(*args, **kwargs)
        raise OSError(code, os.strerror(code))

    with monkeypatch.context() as patched:  # undone here (not the fixtures' patches too)
        patched.setattr(os, failing, fail)
        calls = {
            "read": lambda: workspace.read_file("a.txt"),
            "delete": lambda: workspace.delete_file("a.txt"),
            "list": lambda: workspace.list_files("."),
        }
        with pytest.raises(ToolError, match=message):
            calls[action]()
    assert workspace.read_file("a.txt") == "x"


def test_a_vanished_or_unusable_workspace_is_a_tool_error(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path / "never-created")
    with pytest.raises(ToolError, match="cannot open: it does not exist"):
        workspace.read_file("a.txt")
    with pytest.raises(ToolError, match="cannot open: it does not exist"):
        workspace.write_file("a.txt", "x")
    assert not workspace.is_file("a.txt")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ToolError) as a_file:
        Workspace(tmp_path / "file").create()
    assert str(a_file.value) == f"workspace {tmp_path / 'file'} is a file, not a folder"
    with pytest.raises(ToolError) as below_a_file:
        Workspace(tmp_path / "file" / "sub").create()
    assert str(below_a_file.value) == (
        f"workspace {tmp_path / 'file' / 'sub'}: cannot create it: a folder above it is a file"
    )


def test_walk_files_lists_depth_first_in_name_order_without_following_links(tmp_path: Path) -> None:
    for name in ("b/z.txt", "b/a/y.txt", "a.txt", ".hidden/x.txt", "c.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "d").symlink_to(tmp_path / "b")  # a link: listed, never walked into
    walked = [
        Path(entry.path).relative_to(tmp_path).as_posix()
        for entry in walk_files(tmp_path, enters=lambda name: not name.startswith("."))
    ]
    assert walked == ["a.txt", "b/a/y.txt", "b/z.txt", "c.txt", "d"]


@pytest.mark.parametrize(
    "name",
    [
        "masterplanner.toml~",
        "masterplanner.toml.bak",
        ".masterplanner.toml.swp",
        "#masterplanner.toml#",
        ".masterplanner.toml.un~",
        "masterplanner.toml\uff0ebak",  # a fullwidth dot
    ],
)
def test_a_backup_of_masterplanner_s_settings_cannot_be_read(tmp_path: Path, name: str) -> None:
    workspace = Workspace(tmp_path).create()
    (tmp_path / name).write_text('[mcp_servers.x]\nenv = { TOKEN = "sk-secret" }\n')
    with pytest.raises(ToolError) as refused:
        workspace.read_file(name)
    assert str(refused.value) == (
        f"{name!r} holds masterplanner's settings, which may hold secrets; steps may not read it"
    )


def test_a_hard_link_to_masterplanner_s_settings_cannot_be_read(tmp_path: Path) -> None:
    """The same file under another name: before, `read_file` returned the settings' secrets."""
    workspace = Workspace(tmp_path).create()
    (tmp_path / "masterplanner.toml").write_text('[mcp_servers.x]\nenv = { TOKEN = "sk-secret" }\n')
    (tmp_path / "sub").mkdir()
    os.link(tmp_path / "masterplanner.toml", tmp_path / "sub" / "notes.txt")
    (tmp_path / "other.txt").write_text("fine")
    os.link(tmp_path / "other.txt", tmp_path / "other-link.txt")  # a hard link to anything else reads
    with pytest.raises(ToolError) as refused:
        workspace.read_file("sub/notes.txt")
    assert str(refused.value) == (
        "'notes.txt' holds masterplanner's settings, which may hold secrets; steps may not read it "
        "(this name is a hard link to it)"
    )
    assert workspace.read_file("other-link.txt") == "fine"


def test_masterplanner_s_settings_in_a_workspace_cannot_be_read(tmp_path: Path) -> None:
    # `--workspace .` in a project folder: its settings may hold an MCP server's secrets
    workspace = Workspace(tmp_path).create()
    (tmp_path / "masterplanner.toml").write_text('[mcp_servers.x]\nenv = { TOKEN = "sk-secret" }\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "MasterPlanner.TOML").write_text("x")
    refusals = []
    for path in ("masterplanner.toml", "sub/MasterPlanner.TOML"):
        with pytest.raises(ToolError) as refused:
            workspace.read_file(path)
        refusals.append(str(refused.value))
    assert refusals == [
        "'masterplanner.toml' holds masterplanner's settings, which may hold secrets; steps may not read it",
        "'MasterPlanner.TOML' holds masterplanner's settings, which may hold secrets; steps may not read it",
    ]
