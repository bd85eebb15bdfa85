"""The code sandbox under attack: each test runs real code in the real jail (bubblewrap, seccomp, rlimits)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from masterplanner import ToolError
from masterplanner.errors import SandboxError
from masterplanner.sandbox import SandboxLimits, SandboxResult, pool, run_in_sandbox
from masterplanner.sandbox.jail import UID_POOL
from masterplanner.tools.code_execution import execute_code, format_result
from masterplanner.tools.protected import protection_notice
from masterplanner.tools.workspace import Workspace

pytestmark = [pytest.mark.security, pytest.mark.usefixtures("sandbox_available")]
as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the uid pool, its lock folder and the hand-back exist only as root"
)


def python(workspace: Workspace, code: str, **limits: float) -> tuple[int, str, str, bool]:
    result = run(workspace, code, **limits)
    return result.exit_code, result.stdout, result.stderr, result.timed_out


def run(workspace: Workspace, code: str, language: str = "python", **limits: float) -> SandboxResult:
    argv = ["/usr/bin/python3", "-I", "-c", code] if language == "python" else ["/usr/bin/bash", "-c", code]
    return asyncio.run(run_in_sandbox(argv, workspace.root, limits=SandboxLimits(**limits)))  # type: ignore[arg-type]


def test_host_secrets_and_environment_are_out_of_reach(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = Path("/tmp") / f"masterplanner-test-secret-{os.getpid()}"
    secret.write_text("TOP SECRET")
    secret.chmod(0o644)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-never-leak")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", str(tmp_path))
    try:
        code, out, _, _ = python(
            workspace,
            f"import os, pathlib\n"
            f"print(pathlib.Path({str(secret)!r}).exists(), pathlib.Path('/root').exists(),"
            f" pathlib.Path('/etc/passwd').exists(), pathlib.Path('/home').exists())\n"
            f"print(sorted(os.environ))",
        )
    finally:
        secret.unlink()
    assert code == 0
    assert out.splitlines()[0] == "False False False False"
    # PATH, HOME, LANG from --setenv; PWD from bwrap's --chdir (the sandbox's, never the host's)
    assert out.splitlines()[1] == "['HOME', 'LANG', 'PATH', 'PWD']"


def test_the_environment_holds_nothing_of_the_hosts(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", str(tmp_path))
    monkeypatch.setenv("SHLVL", "7")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_should-never-leak")
    result = run(workspace, "env", language="bash")
    assert sorted(result.stdout.splitlines()) == [
        "HOME=/workspace",
        "LANG=C.UTF-8",
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "PWD=/workspace",  # bwrap sets it after --chdir
        "SHLVL=0",  # bash: its nesting level (none inherited, and `bash -c env` execs env directly)
        "_=/usr/bin/env",  # bash: the command it runs
    ]
    result = run(workspace, "import os; print(sorted(os.environ.items()))")
    assert result.stdout.strip() == (
        "[('HOME', '/workspace'), ('LANG', 'C.UTF-8'), ('PATH', '/usr/local/bin:/usr/bin:/bin'), "
        "('PWD', '/workspace')]"
    )


def test_system_folders_are_read_only_and_privileges_are_gone(workspace: Workspace) -> None:
    code, out, _, _ = python(
        workspace,
        "import os\n"
        "for path in ('/usr/evil', '/etc/evil', '/bin/evil', '/evil'):\n"
        "    try:\n"
        "        open(path, 'w').write('x'); print('WROTE', path)\n"
        "    except OSError as e: print('refused', e.errno)\n"
        "print('uid', os.getuid(), 'euid', os.geteuid())\n"
        "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])",
    )
    assert code == 0
    assert "WROTE" not in out
    assert out.count("refused") == 4
    assert "uid 0" not in out
    assert out.splitlines()[-1] == "0000000000000000"


def test_no_network_ipv4_ipv6_or_dns(workspace: Workspace) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept())
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    try:
        code, out, _, _ = python(
            workspace,
            "import socket\n"
            "targets = ((socket.AF_INET, ('127.0.0.1', PORT)), (socket.AF_INET6, ('::1', PORT)))\n"
            "for family, address in targets:\n"
            "    try:\n"
            "        s = socket.socket(family); s.settimeout(1); s.connect(address); print('CONNECTED')\n"
            "    except OSError as e: print('refused', e.errno)\n"
            "try:\n"
            "    socket.getaddrinfo('example.com', 80); print('RESOLVED')\n"
            "except OSError as e: print('no dns')\n".replace("PORT", str(port)),
        )
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert code == 0
    assert out.split() == ["refused", "97", "refused", "97", "no", "dns"]
    assert accepted == []


SOCKET_FAMILIES = {
    "AF_VSOCK": 40,
    "AF_ALG": 38,
    "AF_NETLINK": 16,
    "AF_INET6": 10,
    "AF_KEY": 15,
    "AF_TIPC": 30,
    "AF_INET": 2,
    "AF_PACKET": 17,
    "AF_BLUETOOTH": 31,
    "AF_CAN": 29,
    "AF_RDS": 21,
}


def test_only_unix_sockets_can_be_created(workspace: Workspace) -> None:
    code, out, _, _ = python(
        workspace,
        "import socket\n"
        f"for name, family in {SOCKET_FAMILIES!r}.items():\n"
        "    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW):\n"
        "        try:\n"
        "            socket.socket(family, kind); print(name, 'CREATED')\n"
        "        except OSError as e:\n"
        "            print(name, e.errno)\n"
        "for family in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK):\n"
        "    try:\n"
        "        socket.socketpair(family); print('pair', family, 'CREATED')\n"
        "    except OSError as e: print('pair', family, e.errno)\n"
        "a, b = socket.socketpair(socket.AF_UNIX); a.send(b'ping'); print('unix pair', b.recv(4).decode())\n"
        "server = socket.socket(socket.AF_UNIX); server.bind('/tmp/s'); server.listen()\n"
        "client = socket.socket(socket.AF_UNIX); client.connect('/tmp/s'); print('unix connect ok')",
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[: 4 * len(SOCKET_FAMILIES)] == [f"{name} 97" for name in SOCKET_FAMILIES for _ in range(4)]
    assert lines[4 * len(SOCKET_FAMILIES) :] == [
        "pair 2 97",
        "pair 10 97",
        "pair 16 97",
        "unix pair ping",
        "unix connect ok",
    ]


def test_socket_families_are_checked_on_all_64_bits_and_other_abis_are_killed(workspace: Workspace) -> None:
    code, out, _, _ = python(
        workspace,
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for family in ((1 << 32) | 2, (1 << 32) | 1, -1):\n"  # the kernel would read AF_INET, AF_UNIX
        "    result = libc.syscall(41, ctypes.c_long(family), 1, 0)\n"
        "    print(result, ctypes.get_errno())\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    libc.syscall(0x40000000 | 41, 2, 1, 0)\n"  # socket(AF_INET) through the x32 ABI
        "    os._exit(0)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('x32 child killed by signal', os.WTERMSIG(status) if os.WIFSIGNALED(status) else None)",
    )
    assert code == 0
    assert out.splitlines() == ["-1 97", "-1 97", "-1 97", "x32 child killed by signal 31"]  # SIGSYS


def test_system_v_shared_memory_and_message_queues_are_refused(workspace: Workspace) -> None:
    code, out, _, _ = python(
        workspace,
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.shmget(0, 1 << 20, 0o1600), ctypes.get_errno())\n"
        "print(libc.msgget(0, 0o1600), ctypes.get_errno())",
    )
    assert code == 0
    assert out.splitlines() == ["-1 1", "-1 1"]


def test_dev_is_read_only_and_dev_shm_and_tmp_are_sized(workspace: Workspace) -> None:
    code, out, _, _ = python(
        workspace,
        "import os\n"
        "for path in ('/dev/foo', '/dev/shm/foo', '/tmp/foo', '/dev/pts/foo'):\n"
        "    try:\n"
        "        with open(path, 'wb') as f:\n"
        "            for _ in range(200): f.write(b'x' * (1 << 20))\n"
        "        print(path, 'WROTE 200 MiB')\n"
        "    except OSError as e:\n"
        "        print(path, e.errno, os.path.getsize(path) >> 20 if os.path.exists(path) else '-')\n"
        "for path in ('/dev/shm/foo', '/tmp/foo'): os.unlink(path)\n"
        "try:\n"
        "    os.mkdir('/dev/evil'); print('MKDIR')\n"
        "except OSError as e: print('/dev/evil', e.errno)",
        file_bytes=256 << 20,
        shm_bytes=16 << 20,
        tmp_bytes=24 << 20,
    )
    assert code == 0
    assert out.splitlines() == [
        "/dev/foo 30 -",  # EROFS
        "/dev/shm/foo 28 16",  # ENOSPC at its 16 MiB
        "/tmp/foo 28 24",  # ENOSPC at its 24 MiB
        "/dev/pts/foo 13 -",  # devpts: EACCES
        "/dev/evil 30",
    ]


def test_fork_bomb_is_contained_and_nothing_is_left_running(workspace: Workspace) -> None:
    result = asyncio.run(
        run_in_sandbox(
            ["/usr/bin/bash", "-c", "bomb() { bomb | bomb & }; bomb; sleep 100"],
            workspace.root,
            limits=SandboxLimits(wall_s=3),
        )
    )
    assert result.timed_out
    assert _sandbox_processes() == []


def test_sleepers_are_killed_at_the_wall_clock_timeout(workspace: Workspace) -> None:
    result = asyncio.run(
        run_in_sandbox(
            ["/usr/bin/bash", "-c", "sleep 1000 & sleep 1000"], workspace.root, limits=SandboxLimits(wall_s=1)
        )
    )
    assert result.timed_out
    assert result.seconds < 3
    assert _sandbox_processes() == []


def test_cpu_memory_and_file_size_limits_hold(workspace: Workspace) -> None:
    code, _, _, timed_out = python(workspace, "while True: pass", cpu_s=1, wall_s=20)
    assert not timed_out
    assert code != 0  # killed by the CPU limit (SIGXCPU / SIGKILL), not by the wall clock

    code, out, _, _ = python(
        workspace,
        "try:\n    b = bytearray(2 << 30); print('ALLOCATED')\nexcept MemoryError: print('memory refused')",
    )
    assert out.strip() == "memory refused"

    code, out, _, _ = python(
        workspace,
        "import signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "try:\n    open('big.bin', 'wb').write(b'x' * (4 << 20)); print('WROTE')\n"
        "except OSError as e: print('size refused', e.errno)",
        file_bytes=1 << 20,
    )
    assert out.strip() == "size refused 27"
    assert (workspace.root / "big.bin").stat().st_size <= 1 << 20


def test_symlinks_planted_by_sandboxed_code_are_not_followed(workspace: Workspace) -> None:
    code, _, _, _ = python(
        workspace,
        "import os\nos.symlink('/etc/passwd', 'leak.txt')\nos.symlink('/etc', 'etc')\nos.mkdir('d')\n"
        "os.symlink('../../..', 'd/up')",
    )
    assert code == 0
    with pytest.raises(ToolError, match="symlink"):
        workspace.read_file("leak.txt")
    with pytest.raises(ToolError, match="not a directory"):
        workspace.read_file("etc/passwd")
    with pytest.raises(ToolError, match="not a directory"):
        workspace.write_file("d/up/evil.txt", "x")
    with pytest.raises(ToolError, match="symlink"):
        workspace.write_file("leak.txt", "overwrite")
    assert Path("/etc/passwd").read_text() != "overwrite"


@as_root
def test_other_owners_files_and_setuid_files_keep_their_owner_and_mode(workspace: Workspace) -> None:
    root = workspace.root
    (root / "theirs.txt").write_text("theirs\n")
    os.chown(root / "theirs.txt", 1234, 1234)
    (root / "theirs.txt").chmod(0o644)
    (root / "shared.txt").write_text("shared\n")
    os.chown(root / "shared.txt", 1234, 1234)
    (root / "shared.txt").chmod(0o666)  # its mode lets anyone write: the read-only bind still holds
    (root / "their-folder").mkdir()
    (root / "their-folder" / "inside.txt").write_text("inside\n")
    for path in (root / "their-folder", root / "their-folder" / "inside.txt"):
        os.chown(path, 1234, 1234)
    (root / "their-folder").chmod(0o777)  # even a folder anyone could write stays as it is
    (root / "setuid").write_bytes(b"#!/bin/sh\n")
    (root / "setuid").chmod(0o4755)
    (root / "mine.txt").write_text("mine\n")
    (root / "mine.txt").chmod(0o640)
    before = {path.name: _owner_mode(path) for path in root.rglob("*")}
    code, out, _, _ = python(
        workspace,
        "import os\n"
        "def attempt(label, action):\n"
        "    try:\n"
        "        action(); print(label, 'DONE')\n"
        "    except OSError as e: print(label, e.errno)\n"
        "print(open('theirs.txt').read().strip())\n"
        "attempt('write theirs', lambda: open('theirs.txt', 'a').write('x'))\n"
        "attempt('delete theirs', lambda: os.unlink('theirs.txt'))\n"
        "attempt('write shared', lambda: open('shared.txt', 'a').write('x'))\n"
        "attempt('replace theirs', lambda: (open('t', 'w').close(), os.rename('t', 'theirs.txt')))\n"
        "attempt('write inside their folder', lambda: open('their-folder/new', 'w'))\n"
        "attempt('write setuid', lambda: open('setuid', 'a').write('x'))\n"
        "attempt('chmod setuid', lambda: os.chmod('setuid', 0o777))\n"
        "attempt('delete setuid', lambda: os.unlink('setuid'))\n"
        "attempt('chmod mine', lambda: os.chmod('mine.txt', 0o4777))\n"
        "open('new.bin', 'w').write('x'); os.chmod('new.bin', 0o4755)\n"
        "os.mkdir('new-dir'); os.chmod('new-dir', 0o3777)\n"
        "os.symlink('/etc/passwd', 'link')\n"
        "print(os.stat('new.bin').st_uid != 0)",
    )
    assert code == 0
    assert out.splitlines() == [
        "theirs",
        "write theirs 13",  # EACCES: not lent
        "delete theirs 16",  # EBUSY: bound over itself
        "write shared 30",  # EROFS: read-only in the jail whatever its mode says
        "replace theirs 16",
        "write inside their folder 30",
        "write setuid 13",
        "chmod setuid 30",
        "delete setuid 16",
        "chmod mine DONE",  # the person's own file was lent: the program may change it
        "True",
    ]
    after = {path.name: _owner_mode(path) for path in root.rglob("*") if path.name in before}
    assert after == before  # owner, group and mode, setuid bit included; mine.txt's mode restored
    assert _owner_mode(root / "new.bin") == (0, 0, 0o755)  # the workspace owner's, no setuid
    assert _owner_mode(root / "new-dir") == (0, 0, 0o777)  # no setgid, no sticky bit
    assert os.lstat(root / "link").st_uid == 0 and _owner_mode(Path("/etc/passwd")) == (0, 0, 0o644)


@as_root
def test_created_entries_go_to_the_workspace_owner(workspace: Workspace) -> None:
    os.chown(workspace.root, 1500, 1600)
    (workspace.root / "old.txt").write_text("old\n")
    os.chown(workspace.root / "old.txt", 1500, 1600)
    code, _, _, _ = python(workspace, "import os\nos.makedirs('a/b'); open('a/b/new.txt', 'w').write('x')")
    assert code == 0
    owners = {
        str(path.relative_to(workspace.root)): _owner_mode(path)[:2] for path in workspace.root.rglob("*")
    }
    assert owners == {
        "old.txt": (1500, 1600),
        "a": (1500, 1600),
        "a/b": (1500, 1600),
        "a/b/new.txt": (1500, 1600),
    }
    assert _owner_mode(workspace.root)[:2] == (1500, 1600)


def _owner_mode(path: Path) -> tuple[int, int, int]:
    info = os.lstat(path)
    return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)


def test_protected_entries_the_program_creates_are_removed(workspace: Workspace) -> None:
    (workspace.root / "notes.txt").write_text("notes\n")
    result = asyncio.run(
        execute_code(
            workspace,
            "python",
            "import os\n"
            "open('masterplanner.toml', 'w').write('[tool_policies]\\ncode_execution = \"auto\"\\n')\n"
            "os.makedirs('.git'); open('.git/config', 'w').write('[core]\\nfsmonitor = evil\\n')\n"
            "os.makedirs('sub'); open('sub/.envrc', 'w').write('evil')\n"
            "os.makedirs('.vscode'); open('.vscode/tasks.json', 'w').write('{}')\n"
            "os.makedirs('deep/.ENVRC')\n"  # any case
            "os.symlink('/etc/passwd', '.npmrc')\n"  # a link: removed, its target untouched
            "os.link('notes.txt', '.bashrc')\n"  # a new name for an existing file
            "os.chdir('.claude' if os.mkdir('.claude') is None else '.')\n"
            "for _ in range(1100):\n"
            "    os.mkdir('d'); os.chdir('d')\n"
            "print('written')",
        )
    )
    assert result.exit_code == 0 and result.stdout == "written\n"
    assert result.removed == (
        ".bashrc",
        ".claude/",
        ".git/",
        ".npmrc",
        ".vscode/",
        "deep/.ENVRC/",
        "masterplanner.toml",
        "sub/.envrc",
    )
    assert sorted(path.name for path in workspace.root.iterdir()) == ["deep", "notes.txt", "sub"]
    assert list((workspace.root / "sub").iterdir()) == [] and list((workspace.root / "deep").iterdir()) == []
    assert (workspace.root / "notes.txt").read_text() == "notes\n"
    assert Path("/etc/passwd").exists()
    assert format_result(result).splitlines()[:9] == [
        "exit code 0",
        *(
            f"removed {path}: {protection_notice(name)}"
            for path, name in (
                (".bashrc", ".bashrc"),
                (".claude/", ".claude"),
                (".git/", ".git"),
                (".npmrc", ".npmrc"),
                (".vscode/", ".vscode"),
                ("deep/.ENVRC/", ".ENVRC"),
                ("masterplanner.toml", "masterplanner.toml"),
                ("sub/.envrc", ".envrc"),
            )
        ),
    ]


def test_existing_protected_entries_are_read_only(workspace: Workspace) -> None:
    root = workspace.root
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]\n")
    (root / "masterplanner.toml").write_text("model = 'local'\n")
    (root / "masterplanner.toml").chmod(0o666)  # even if its mode lets anyone write
    (root / "sub").mkdir()
    (root / "sub" / ".envrc").write_text("export A=1\n")
    before = {path: path.read_bytes() for path in root.rglob("*") if path.is_file()}
    code, out, _, _ = python(
        workspace,
        "import os\n"
        "def attempt(label, action):\n"
        "    try:\n"
        "        action(); print(label, 'DONE')\n"
        "    except OSError as e: print(label, e.errno)\n"
        "attempt('write .git/config', lambda: open('.git/config', 'a').write('fsmonitor = evil'))\n"
        "attempt('add a hook', lambda: open('.git/hooks/pre-commit', 'w').write('evil'))\n"
        "attempt('rename .git/config', lambda: os.rename('.git/config', 'config'))\n"
        "attempt('rename .git', lambda: os.rename('.git', 'git'))\n"
        "attempt('replace .git/config', lambda: os.rename('masterplanner.toml', '.git/config'))\n"
        "attempt('truncate masterplanner.toml', lambda: open('masterplanner.toml', 'w'))\n"
        "attempt('delete masterplanner.toml', lambda: os.unlink('masterplanner.toml'))\n"
        "attempt('write sub/.envrc', lambda: open('sub/.envrc', 'a').write('evil'))\n"
        "attempt('rename sub', lambda: os.rename('sub', 'other'))\n"
        "attempt('chmod .git', lambda: os.chmod('.git', 0o777))\n"
        "print('settings read:', repr(open('masterplanner.toml').read()))",
    )
    assert code == 0
    assert out.splitlines() == [
        "write .git/config 13",  # EACCES: not lent (and read-only, as below)
        "add a hook 30",  # EROFS
        "rename .git/config 18",  # EXDEV (a different mount)
        "rename .git 16",  # EBUSY (a mount point)
        "replace .git/config 18",
        "truncate masterplanner.toml 30",
        "delete masterplanner.toml 16",
        "write sub/.envrc 13",
        "rename sub DONE",  # a folder holding a protected entry may move, the entry stays intact
        "chmod .git 30",
        "settings read: ''",  # they may hold secrets: shown empty
    ]
    (root / "other").rename(root / "sub")
    assert {path: path.read_bytes() for path in root.rglob("*") if path.is_file()} == before


def test_backups_of_the_settings_file_are_shown_empty(workspace: Workspace) -> None:
    """Before, `read_file` refused `masterplanner.toml~` but code read it whole."""
    root = workspace.root
    for name in ("masterplanner.toml~", ".masterplanner.toml.swp", "sub/masterplanner.toml.bak"):
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text('[mcp_servers.x]\nenv = { TOKEN = "sk-secret" }\n')
    (root / "notes.txt").write_text("kept")
    code, out, _, _ = python(
        workspace,
        "for name in ('masterplanner.toml~', '.masterplanner.toml.swp', 'sub/masterplanner.toml.bak', "
        "'notes.txt'):\n"
        "    print(name, repr(open(name).read()))",
    )
    assert (code, out.splitlines()) == (
        0,
        [
            "masterplanner.toml~ ''",
            ".masterplanner.toml.swp ''",
            "sub/masterplanner.toml.bak ''",
            "notes.txt 'kept'",
        ],
    )
    assert "sk-secret" in (root / "masterplanner.toml~").read_text()  # the file itself is left as it was


@as_root
def test_a_1100_deep_tree_is_handed_back_and_no_uid_lock_leaks(workspace: Workspace) -> None:
    code, out, _, _ = python(
        workspace,
        "import os\n"
        "for _ in range(1100):\n"
        "    os.mkdir('folder'); os.chdir('folder')\n"
        "open('bottom.txt', 'w').write('x')\n"
        "print(len(os.getcwd()))",  # 7,710 characters: longer than PATH_MAX
    )
    assert (code, out) == (0, "7710\n")
    assert _deepest_owner(workspace.root, "folder") == (1100, 0)
    for number in range(70):
        code, out, _, _ = python(workspace, f"print({number})")
        assert (code, out) == (0, f"{number}\n")
    assert pool.leased_uids() == []
    assert _locked_uids() == []
    removed = run(workspace, "rm -rf folder", language="bash")  # pytest's rmtree would recurse too deep
    assert (removed.exit_code, list(workspace.root.iterdir())) == (0, [])


@as_root
def test_a_failing_hand_back_releases_the_uid_and_the_next_run_repairs_ownership(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(pool, "settle", broken)
        with pytest.raises(SandboxError, match=r"could not be handed back after the run: .*Input/output"):
            python(workspace, "open('made.txt', 'w').write('x')")
    assert pool.leased_uids() == []
    assert _locked_uids() == []
    assert os.stat(workspace.root / "made.txt").st_uid in UID_POOL  # left lent by the failure
    code, _, _, _ = python(workspace, "print(open('made.txt').read())")
    assert code == 0
    assert {os.lstat(path).st_uid for path in [workspace.root, *workspace.root.rglob("*")]} == {0}


@as_root
@pytest.mark.parametrize("after_s", [0.0, 0.001, 0.01, 0.05, 0.3])
def test_a_caller_that_gives_up_leaks_no_uid_process_or_ownership(
    workspace: Workspace, after_s: float
) -> None:
    (workspace.root / "kept.txt").write_text("kept\n")

    async def give_up() -> None:
        task = asyncio.create_task(run_in_sandbox(["/usr/bin/sleep", "30"], workspace.root))
        await asyncio.sleep(after_s)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)  # the hand-back of a lease still being taken finishes in its thread

    asyncio.run(give_up())
    assert pool.leased_uids() == []
    assert _locked_uids() == []
    assert {os.lstat(path).st_uid for path in [workspace.root, *workspace.root.rglob("*")]} == {0}
    assert _sandbox_processes() == []


def _deepest_owner(root: Path, name: str) -> tuple[int, int]:
    """(depth, uid of the file at the bottom), walked with descriptors (the path is too long)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    depth = 0
    try:
        while True:
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return depth, os.stat("bottom.txt", dir_fd=fd, follow_symlinks=False).st_uid
            assert os.fstat(child).st_uid == 0
            os.close(fd)
            fd, depth = child, depth + 1
    finally:
        os.close(fd)


def _locked_uids() -> list[int]:
    """Pool uids whose lock file some open descriptor holds."""
    locked = []
    for uid in UID_POOL:
        path = pool.PRIVATE_DIR / "locks" / f"{uid}.lock"
        if not path.exists():
            continue
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            locked.append(uid)
        finally:
            os.close(fd)
    return locked


@as_root
def test_lock_files_live_in_a_private_folder(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_tmp = {path: path.lstat().st_mtime_ns for path in Path("/tmp").glob("masterplanner-sandbox-*")}
    assert python(workspace, "print('ran')")[:2] == (0, "ran\n")
    assert {path: path.lstat().st_mtime_ns for path in Path("/tmp").glob("masterplanner-sandbox-*")} == in_tmp
    private = pool.private_dir()
    try:
        info = os.fstat(private)
    finally:
        os.close(private)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o711)
    assert stat.S_IMODE(os.stat(pool.PRIVATE_DIR / "locks").st_mode) == 0o700
    assert {path.name for path in (pool.PRIVATE_DIR / "locks").iterdir()} <= {
        f"{uid}.lock" for uid in UID_POOL
    }

    monkeypatch.setattr(pool, "PRIVATE_DIR", tmp_path / "private")  # under world-writable /tmp
    with pytest.raises(SandboxError, match="owned by uid 0 with mode 1777"):
        pool.private_dir()

    planted = Path("/run") / f"masterplanner-test-{os.getpid()}"
    monkeypatch.setattr(pool, "PRIVATE_DIR", planted)
    try:
        planted.symlink_to(tmp_path)  # a symlink planted where the folder should be
        with pytest.raises(SandboxError, match="is not a folder or is a symlink"):
            pool.private_dir()
        planted.unlink()
        planted.mkdir(mode=0o777)
        planted.chmod(0o777)
        with pytest.raises(SandboxError, match="writable only by us"):
            pool.private_dir()
        planted.chmod(0o700)
        os.chown(planted, 1234, 1234)
        with pytest.raises(SandboxError, match="owned by uid 1234"):
            pool.private_dir()
        os.chown(planted, 0, 0)
        (planted / "locks").symlink_to(tmp_path)
        with pytest.raises(SandboxError, match="is not a folder or is a symlink"):
            pool.Lease.acquire(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))
    finally:
        if planted.is_symlink():
            planted.unlink()
        elif planted.exists():
            for child in planted.iterdir():
                child.unlink()
            planted.rmdir()


PIPE_ABUSE = {
    "flood stdout (yes)": ("bash", "yes"),
    "flood stdout and stderr from Python": (
        "python",
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536); sys.stderr.write('y' * 65536)",
    ),
    "close stdout and stderr, keep running": ("bash", "exec >&- 2>&-; sleep 100"),
    "a child holds the pipes after the parent exits": ("bash", "(trap '' HUP TERM; sleep 100) & exit 0"),
    "a new session and a double fork hold the pipes": (
        "python",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(100)\n    os._exit(0)\nprint('parent done')",
    ),
    "ignore SIGTERM and SIGHUP": ("bash", "trap '' TERM HUP INT; while :; do sleep 1; done"),
    "never read a large stdin": ("python", "import time; time.sleep(100)"),
}


@pytest.mark.parametrize("attack", PIPE_ABUSE)
def test_code_execution_returns_within_its_timeout_whatever_the_program_does_to_its_pipes(
    workspace: Workspace, attack: str
) -> None:
    language, code = PIPE_ABUSE[attack]
    started = time.monotonic()
    result = asyncio.run(execute_code(workspace, language, code, stdin="z" * (4 << 20), timeout_s=1))
    elapsed = time.monotonic() - started
    assert elapsed <= 1 + 2
    if attack.startswith(("a child", "a new session")):
        # the program itself exits at once; bwrap's pid-1 going takes every process of the namespace
        assert (result.exit_code, result.timed_out, result.killed) == (0, False, None)
    else:
        assert (result.exit_code, result.timed_out) == (-9, True)
        assert result.killed == "the program ran longer than 1 s"
        assert result.stderr.endswith("killed: the program ran longer than 1 s")
        assert format_result(result).startswith("exit code -9 (killed: the program ran longer than 1 s)")
    if attack.startswith("flood"):
        assert result.stdout_truncated
        assert len(result.stdout) == 1 << 20  # what came before the kill is kept, up to the cap
        assert set(result.stdout) <= {"y", "\n", "x"}


def test_code_execution_arguments_are_checked(workspace: Workspace) -> None:
    with pytest.raises(ToolError, match="language must be one of python, bash, javascript, sql"):
        asyncio.run(execute_code(workspace, "ruby", "puts 1"))
    with pytest.raises(ToolError, match="code is empty"):
        asyncio.run(execute_code(workspace, "python", "  "))
    with pytest.raises(ToolError, match="timeout_s must be between"):
        asyncio.run(execute_code(workspace, "python", "print(1)", timeout_s=1000))
    result = asyncio.run(execute_code(workspace, "javascript", "console.log(6 * 7)"))
    assert (result.exit_code, result.stdout) == (0, "42\n")


def test_sql_is_one_query_over_the_workspaces_csv_files_which_it_only_reads(workspace: Workspace) -> None:
    expenses = (
        "date,category,amount\n2024-01-03,food,42.50\n2024-01-05,transport,15.00\n2024-01-09,food,38.25\n"
    )
    (workspace.root / "expenses.csv").write_text(expenses)
    (workspace.root / "data").mkdir()
    (workspace.root / "data" / "q1 prices.csv").write_text('product,price\nkeyboard,49.99\n"desk, oak",899\n')

    def sql(query: str) -> tuple[int, str, str]:
        result = asyncio.run(execute_code(workspace, "sql", query))
        return result.exit_code, result.stdout, result.stderr

    # numbers come back as numbers (no float noise), text as CSV, column names first
    assert sql("SELECT SUM(amount), COUNT(*) FROM expenses") == (0, "SUM(amount),COUNT(*)\n95.75,3\n", "")
    assert sql("SELECT AVG(amount) FROM expenses WHERE category = 'food'") == (0, "AVG(amount)\n40.375\n", "")
    assert sql("SELECT product FROM data_q1_prices ORDER BY price DESC LIMIT 1") == (
        0,
        'product\n"desk, oak"\n',
        "",
    )
    tables = (
        "Tables: data_q1_prices(product, price) from data/q1 prices.csv; "
        "expenses(date, category, amount) from expenses.csv\n"
    )
    assert sql("SELECT * FROM nope") == (1, "", "the query failed: no such table: nope. " + tables)
    assert sql("SELECT 1; SELECT 2") == (
        1,
        "",
        "the query failed: give one statement only. " + tables,
    )
    # a query only reads: nothing that changes a table, sets a pragma or makes a file runs
    reads = "the query failed: only a query that reads (SELECT … or WITH … SELECT …) can run. "
    for statement in (
        "DROP TABLE expenses",
        "DELETE FROM expenses",
        "ATTACH DATABASE 'made.db' AS made",
        "VACUUM INTO 'copy.db'",
        "PRAGMA journal_mode = WAL",
    ):
        assert sql(statement) == (1, "", reads + tables), statement
    assert sql("WITH t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 3) SELECT SUM(n) FROM t") == (
        0,
        "SUM(n)\n6\n",
        "",
    )
    assert sorted(path.name for path in workspace.root.iterdir()) == ["data", "expenses.csv"]
    assert (workspace.root / "expenses.csv").read_text() == expenses


def _sandbox_processes() -> list[int]:
    """Pids of processes running as a sandbox uid, after giving exiting ones 2 s to exit."""
    deadline = time.monotonic() + 2
    while (found := _sandbox_pids()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _sandbox_pids() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        uid = int(status.split("Uid:")[1].split()[0])
        # a zombie runs nothing: bwrap's pid-1 init is left for the host's init to reap
        if uid in UID_POOL and status.split("State:")[1].split()[0] != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    yield
    assert _sandbox_processes() == []
