"""The file tools against traversal: payload lists and fuzzed paths never touch anything outside."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masterplanner import ToolError
from masterplanner.tools.workspace import Workspace

pytestmark = pytest.mark.security

PAYLOADS = [
    "../outside.txt",
    "../../outside.txt",
    "a/../../outside.txt",
    "./../outside.txt",
    "/etc/passwd",
    "//etc/passwd",
    "/" + "a/" * 50 + "../" * 60 + "etc/passwd",
    "a/" * 200 + "../" * 201 + "outside.txt",
    "..",
    ".",
    "%2e%2e%2foutside.txt",  # taken literally: a file of that name inside the workspace
    "..%2foutside.txt",
    "chain1/x.txt",  # chain1 -> chain2 -> .. (a symlink chain out of the workspace)
    "up/outside.txt",  # up -> ..
    "abs/passwd",  # abs -> /etc
    "inner/../up/outside.txt",
]


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            info = path.lstat()
            found[str(path)] = (info.st_size, info.st_mtime_ns)
    return found


@pytest.fixture
def arena(tmp_path: Path) -> tuple[Workspace, Path]:
    outside = tmp_path / "outside.txt"
    outside.write_text("outside")
    workspace = Workspace(tmp_path / "ws").create()
    (workspace.root / "inner").mkdir()
    (workspace.root / "up").symlink_to("..")
    (workspace.root / "abs").symlink_to("/etc")
    (workspace.root / "chain2").symlink_to("..")
    (workspace.root / "chain1").symlink_to("chain2")
    return workspace, tmp_path


@pytest.mark.parametrize("payload", PAYLOADS)
def test_payloads_never_reach_outside(arena: tuple[Workspace, Path], payload: str) -> None:
    workspace, root = arena
    before = {k: v for k, v in _snapshot(root).items() if not k.startswith(str(workspace.root))}
    for name, action in (
        ("read", lambda: workspace.read_file(payload)),
        ("write", lambda: workspace.write_file(payload, "pwned")),
        ("delete", lambda: workspace.delete_file(payload)),
        ("list", lambda: workspace.list_files(payload)),
    ):
        try:
            result = action()
        except ToolError:
            continue
        # only a literal in-workspace name, or listing the workspace itself, may succeed
        assert "%2" in payload or (name, payload) == ("list", "."), (name, payload, result)
    after = {k: v for k, v in _snapshot(root).items() if not k.startswith(str(workspace.root))}
    assert after == before
    assert (root / "outside.txt").read_text() == "outside"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.sampled_from(["..", ".", "up", "abs", "chain1", "inner", "x.txt", "", "/", "%2e"]), max_size=8
    )
)
def test_fuzzed_paths_never_reach_outside(arena: tuple[Workspace, Path], parts: list[str]) -> None:
    workspace, root = arena
    path = "/".join(parts)
    try:
        workspace.write_file(path, "fuzz")
    except ToolError:
        pass
    try:
        workspace.read_file(path)
    except ToolError:
        pass
    outside = [p for p in root.rglob("*") if not str(p).startswith(str(workspace.root)) and p.is_file()]
    assert outside == [root / "outside.txt"]
    assert (root / "outside.txt").read_text() == "outside"


PROTECTED = [
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
    ".GIT/config",
    "./.git/config",
    ".git/",
    ".gitmodules",
    ".npmrc",
    ".bashrc",
    ".cursor/mcp.json",
    ".idea/workspace.xml",
    "ma\u017fterplanner.toml",  # long s: a case-insensitive file system may fold it to "s"
]


@pytest.fixture
def planted(tmp_path: Path) -> Workspace:
    """A workspace holding real host-acting files (a git repository's config and hook, settings)."""
    workspace = Workspace(tmp_path / "ws").create()
    for path in (
        ".git/config",
        ".git/hooks/pre-commit",
        "masterplanner.toml",
        ".envrc",
        ".vscode/tasks.json",
    ):
        (workspace.root / path).parent.mkdir(parents=True, exist_ok=True)
        (workspace.root / path).write_text("original")
    return workspace


@pytest.mark.parametrize("path", PROTECTED)
def test_host_acting_files_are_never_written_or_deleted(planted: Workspace, path: str) -> None:
    before = _snapshot(planted.root)
    for action in (
        lambda: planted.write_file(path, '[core]\n\tfsmonitor = "touch /tmp/pwned"\n'),
        lambda: planted.write_bytes(path, b"#!/bin/sh\ntouch /tmp/pwned\n"),
        lambda: planted.delete_file(path),
    ):
        with pytest.raises(
            ToolError, match=r"makes the host act .* steps may not create, change or delete it"
        ):
            action()
    assert _snapshot(planted.root) == before


def test_host_acting_files_can_still_be_read_and_listed(planted: Workspace) -> None:
    assert planted.read_file(".git/config") == "original"
    # but not masterplanner's settings, which may hold secrets (test_workspace.py)
    assert planted.is_file("masterplanner.toml")
    assert [entry.name for entry in planted.list_files(".git/hooks")] == ["pre-commit"]
    assert planted.is_file(".envrc")


def test_generate_image_refuses_host_acting_paths_before_calling_out(
    planted: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from masterplanner.tools.images import ImageConfig, generate_image

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    # Nothing listens on port 9 of 127.0.0.1: a call that got this far would fail differently.
    config = ImageConfig(base_url="http://127.0.0.1:9/v1", timeout_s=2)
    before = _snapshot(planted.root)
    for path in (".git/hooks/pre-commit.png", ".vscode/icon.png", "a/.claude/x.png", ".Git/x.png"):
        with pytest.raises(ToolError, match="steps may not create, change or delete it"):
            asyncio.run(generate_image(config, planted, "a hook", path))
    assert _snapshot(planted.root) == before
