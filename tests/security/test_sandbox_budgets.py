"""The sandbox's budget holds for a whole execution, not per process: memory, CPU time, processes, disk.

Each test runs real code in the real jail with small budgets (64 MiB, 1 s of CPU, a few MiB of
workspace growth) so the file stays quick on a slow machine.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from masterplanner.sandbox import SandboxLimits, SandboxResult, run_in_sandbox
from masterplanner.sandbox.jail import UID_POOL
from masterplanner.tools.code_execution import execute_code, format_result
from masterplanner.tools.workspace import Workspace

pytestmark = [pytest.mark.security, pytest.mark.usefixtures("sandbox_available")]
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the uid pool exists only as root")

MIB = 1 << 20


def python(workspace: Workspace, code: str, **limits: Any) -> SandboxResult:
    argv = ["/usr/bin/python3", "-I", "-c", code]
    return asyncio.run(run_in_sandbox(argv, workspace.root, limits=SandboxLimits(**limits)))


def bash(workspace: Workspace, code: str, **limits: Any) -> SandboxResult:
    return asyncio.run(
        run_in_sandbox(["/usr/bin/bash", "-c", code], workspace.root, limits=SandboxLimits(**limits))
    )


def assert_killed(result: SandboxResult, reason: str) -> None:
    assert (result.exit_code, result.timed_out, result.killed) == (-9, False, reason)
    assert result.stderr.endswith(f"killed: {reason}")
    assert format_result(result).startswith(f"exit code -9 (killed: {reason})")


MEMORY_ATTACKS = {
    "/tmp and /dev/shm, each under its own size": (
        "bash",
        "head -c 40M /dev/zero > /tmp/a && head -c 40M /dev/zero > /dev/shm/b && sleep 10; echo survived",
    ),
    "three processes of 30 MiB, each under the address-space cap": (
        "python",
        "import os, time\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        block = bytearray(30 << 20); time.sleep(10); os._exit(0)\n"
        "time.sleep(10); print('survived')",
    ),
    "memfds written, never mapped": (
        "python",
        "import os, time\n"
        "kept = [os.memfd_create(f'm{i}') for i in range(3)]\n"
        "for fd in kept: os.write(fd, b'x' * (30 << 20))\n"
        "time.sleep(10); print('survived')",
    ),
    "a deleted file kept open in /tmp plus a process": (
        "python",
        "import os, time\n"
        "f = open('/tmp/x', 'wb'); os.unlink('/tmp/x'); f.write(b'x' * (40 << 20)); f.flush()\n"
        "block = bytearray(30 << 20); time.sleep(10); print('survived')",
    ),
}


@pytest.mark.parametrize("attack", MEMORY_ATTACKS)
def test_memory_is_a_total_over_processes_and_tmpfs(workspace: Workspace, attack: str) -> None:
    language, code = MEMORY_ATTACKS[attack]
    limits = {"memory_bytes": 64 * MIB, "tmp_bytes": 48 * MIB, "shm_bytes": 48 * MIB, "wall_s": 20}
    result = (python if language == "python" else bash)(workspace, code, **limits)
    assert_killed(result, "the program used more than 64 MiB of memory in total")
    assert "survived" not in result.stdout
    assert result.seconds < 10  # killed by the watchdog, long before the program's sleep ended


def test_memory_under_the_budget_is_fine(workspace: Workspace) -> None:
    result = python(
        workspace,
        "import os\n"
        "for _ in range(2):\n"
        "    if os.fork() == 0:\n"
        "        block = bytearray(8 << 20); os._exit(0)\n"
        "os.wait(); os.wait()\n"
        "open('/tmp/a', 'wb').write(b'x' * (8 << 20)); print('fine')",
        memory_bytes=64 * MIB,
        tmp_bytes=48 * MIB,
    )
    assert (result.exit_code, result.killed, result.stdout) == (0, None, "fine\n")


def test_one_process_still_meets_its_address_space_cap(workspace: Workspace) -> None:
    result = python(
        workspace,
        "try:\n    block = bytearray(2 << 30); print('ALLOCATED')\n"
        "except MemoryError: print('memory refused')",
    )
    assert (result.exit_code, result.killed, result.stdout) == (0, None, "memory refused\n")


CPU_ATTACKS = {
    "four busy processes at once": "import os\nfor _ in range(2): os.fork()\nwhile True: pass",
    "children that burn 0.3 s each and exit (reaped: cutime)": (
        "import os, time\n"
        "for _ in range(8):\n"
        "    if os.fork() == 0:\n"
        "        end = time.process_time() + 0.3\n"
        "        while time.process_time() < end: pass\n"
        "        os._exit(0)\n"
        "    os.wait()\n"
        "print('survived')"
    ),
    "orphans reaped by the namespace's init": (
        "import os, time\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        if os.fork() == 0:\n"
        "            while True: pass\n"
        "        os._exit(0)\n"
        "time.sleep(30); print('survived')"
    ),
}


@pytest.mark.parametrize("attack", CPU_ATTACKS)
def test_cpu_time_is_a_total_over_processes(workspace: Workspace, attack: str) -> None:
    # every process stays under its own 2 s RLIMIT_CPU: only the total can stop it
    result = python(workspace, CPU_ATTACKS[attack], cpu_s=2, wall_s=30)
    assert_killed(result, "the program used more than 2 s of CPU time in total")
    assert "survived" not in result.stdout


def test_cpu_time_under_the_budget_is_fine(workspace: Workspace) -> None:
    result = python(
        workspace,
        "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\nprint('fine')",
        cpu_s=2,
    )
    assert (result.exit_code, result.killed, result.stdout) == (0, None, "fine\n")


@as_root
def test_processes_are_capped_per_uid_which_is_per_workspace(workspace: Workspace, tmp_path: Path) -> None:
    forks = (
        "import os, time\n"
        "made = 0\n"
        "while True:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as e:\n"
        "        print(made, e.errno); break\n"
        "    if pid == 0:\n"
        "        time.sleep(2); os._exit(0)\n"
        "    made += 1"
    )
    # 8 tasks of the uid: bwrap, its pid-1 init and python itself, so 5 forks succeed, also right
    # after other runs (whose inits wait as zombies for the host to reap them: uids rotate)
    for _ in range(3):
        assert python(workspace, forks, processes=8).stdout == "5 11\n"  # EAGAIN
    threads = (
        "import threading, time\n"
        "started = 0\n"
        "try:\n"
        "    for _ in range(20):\n"
        "        threading.Thread(target=time.sleep, args=(2,), daemon=True).start(); started += 1\n"
        "except RuntimeError as e: print(started, e)"
    )
    assert python(workspace, threads, processes=8).stdout == "5 can't start new thread\n"  # threads count too

    other = Workspace(tmp_path / "other").create()
    show_uid = "import os, time; print(os.getuid()); time.sleep(1)"

    async def side_by_side() -> list[SandboxResult]:
        return list(
            await asyncio.gather(
                run_in_sandbox(["/usr/bin/python3", "-I", "-c", show_uid], workspace.root),
                run_in_sandbox(["/usr/bin/python3", "-I", "-c", show_uid], workspace.root),
                run_in_sandbox(["/usr/bin/python3", "-I", "-c", show_uid], other.root),
            )
        )

    same, again, elsewhere = (int(result.stdout) for result in asyncio.run(side_by_side()))
    assert same == again and same != elsewhere  # two workspaces never share a uid (nor its limit)
    assert {same, elsewhere} <= set(UID_POOL)


GROWTH_ATTACKS = {
    "many files of 512 KiB": (
        "import time\n"
        "for i in range(40):\n"
        "    open(f'f{i}', 'wb').write(b'x' * (512 << 10)); time.sleep(0.02)\n"
        "print('survived')"
    ),
    "files deleted but kept open": (
        "import os, time\n"
        "kept = []\n"
        "for i in range(3):\n"
        "    f = open(f'u{i}', 'wb'); os.unlink(f'u{i}')\n"
        "    f.write(b'x' * (3 << 20)); f.flush(); kept.append(f)\n"
        "time.sleep(10); print('survived')"
    ),
    "many empty files": "for i in range(50_000): open(f'e{i}', 'w').close()\nprint('survived')",
}


@pytest.mark.parametrize("attack", GROWTH_ATTACKS)
def test_the_workspace_may_grow_only_by_its_allowance(workspace: Workspace, attack: str) -> None:
    result = python(
        workspace, GROWTH_ATTACKS[attack], max_growth_bytes=4 * MIB, max_new_entries=2000, wall_s=20
    )
    reason = (
        "the program created more than 2,000 files and folders in the workspace"
        if attack == "many empty files"
        else "the workspace grew by more than 4 MiB while the program ran"
    )
    assert_killed(result, reason)
    assert "survived" not in result.stdout


def test_one_file_meets_the_allowance_as_its_size_limit(workspace: Workspace) -> None:
    result = python(
        workspace,
        "import signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "try:\n    open('big.bin', 'wb').write(b'x' * (3 << 20)); print('WROTE')\n"
        "except OSError as e: print('size refused', e.errno)",
        max_growth_bytes=1 * MIB,
    )
    assert (result.exit_code, result.killed, result.stdout) == (0, None, "size refused 27\n")  # EFBIG
    assert (workspace.root / "big.bin").stat().st_size == 1 * MIB
    assert result.workspace_growth_bytes == 1 * MIB


def test_rewriting_a_file_is_not_growth_and_growth_is_reported(workspace: Workspace) -> None:
    result = asyncio.run(
        execute_code(
            workspace,
            "python",
            "for _ in range(10): open('same.bin', 'wb').write(b'x' * (1 << 20))\nprint('fine')",
            max_growth_bytes=2 * MIB,
        )
    )
    assert (result.exit_code, result.killed, result.stdout) == (0, None, "fine\n")
    assert result.workspace_growth_bytes == 1 * MIB
    result = asyncio.run(execute_code(workspace, "python", "import os; os.unlink('same.bin')"))
    assert result.workspace_growth_bytes == -1 * MIB


def test_no_allowance_left_means_no_file_can_be_written(workspace: Workspace) -> None:
    result = asyncio.run(
        execute_code(
            workspace,
            "python",
            "import signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "print('computed', 6 * 7)\n"
            "try:\n"
            "    with open('out.txt', 'w') as f: f.write('x')\n"
            "    print('WROTE')\n"
            "except OSError as e: print('write refused', e.errno)",
            max_growth_bytes=0,
        )
    )
    assert (result.exit_code, result.stdout) == (0, "computed 42\nwrite refused 27\n")


def test_the_watchdog_costs_little(workspace: Workspace) -> None:
    asyncio.run(run_in_sandbox(["/usr/bin/true"], workspace.root))  # warm up
    cpu = time.process_time()
    result = asyncio.run(
        run_in_sandbox(["/usr/bin/bash", "-c", "for i in 1 2 3 4; do sleep 2 & done; wait"], workspace.root)
    )
    used = time.process_time() - cpu
    assert (result.exit_code, result.killed) == (0, None)
    assert 2 <= result.seconds < 4
    assert used < 0.2  # the whole host side, watchdog included, for 2 s of a 6-process sandbox


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    yield
    deadline = time.monotonic() + 2
    while (left := _sandbox_pids()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []


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
