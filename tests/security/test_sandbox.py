"""The code sandbox under attack: each test runs real code in the real jail (bubblewrap, seccomp, rlimits)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from masterplanner import ToolError
from masterplanner.sandbox import SandboxLimits, run_in_sandbox, sandbox_problems
from masterplanner.sandbox.jail import UID_POOL
from masterplanner.tools.code_execution import execute_code
from masterplanner.tools.workspace import Workspace

pytestmark = pytest.mark.security


@pytest.fixture(autouse=True)
def _sandbox_available() -> None:
    problems = sandbox_problems()
    if problems:
        message = "the sandbox cannot start: " + "; ".join(problems)
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs bubblewrap: these tests must run there
        pytest.skip(message)


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "ws").create()


def python(workspace: Workspace, code: str, **limits: float) -> tuple[int, str, str, bool]:
    result = asyncio.run(
        run_in_sandbox(["/usr/bin/python3", "-I", "-c", code], workspace.root, limits=SandboxLimits(**limits))  # type: ignore[arg-type]
    )
    return result.exit_code, result.stdout, result.stderr, result.timed_out


def test_host_secrets_and_environment_are_out_of_reach(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = Path("/tmp") / f"masterplanner-test-secret-{os.getpid()}"
    secret.write_text("TOP SECRET")
    secret.chmod(0o644)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-never-leak")
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
    assert "OPENAI_API_KEY" not in out
    assert out.splitlines()[1] == "['HOME', 'LANG', 'LC_CTYPE', 'PATH', 'PWD', 'SHLVL']" or "API" not in out


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


def test_code_execution_arguments_are_checked(workspace: Workspace) -> None:
    with pytest.raises(ToolError, match="language must be one of python, bash, javascript"):
        asyncio.run(execute_code(workspace, "ruby", "puts 1"))
    with pytest.raises(ToolError, match="code is empty"):
        asyncio.run(execute_code(workspace, "python", "  "))
    with pytest.raises(ToolError, match="timeout_s must be between"):
        asyncio.run(execute_code(workspace, "python", "print(1)", timeout_s=1000))
    result = asyncio.run(execute_code(workspace, "javascript", "console.log(6 * 7)"))
    assert (result.exit_code, result.stdout) == (0, "42\n")


def _sandbox_processes() -> list[int]:
    """Pids of processes running as a sandbox uid, after giving exiting ones 2 s to be reaped."""
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
        if uid in UID_POOL:
            found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    yield
    assert _sandbox_processes() == []
