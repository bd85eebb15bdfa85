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
