"""The seccomp filter the sandboxed process runs under, compiled to BPF with libseccomp.

Everything is allowed but the system calls listed here; sockets are an allowlist: `socket()` and
`socketpair()` work only for `AF_UNIX`. The family argument is compared as the full 64-bit
register, so a family with stray high bits (which the kernel would truncate to a real family) is
refused too. System calls of another ABI (i386 `int 0x80`, x32) kill the process: libseccomp's
default for a foreign architecture.
"""

from __future__ import annotations

import errno
import socket
import tempfile
from typing import IO

__all__ = ["ALLOWED_SOCKET_FAMILY", "DENIED_SYSCALLS", "compiled_filter"]

DENIED_SYSCALLS = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "unshare",
    "setns",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    # another process's descriptors (as ptrace would give)
    "pidfd_getfd",
    # memory no process maps and no file holds: the watchdog could not count it
    "shmget",
    "msgget",
    "memfd_secret",
)
"""Refused with EPERM: debugging other processes, mounts and namespaces, kernel interfaces, and
System V shared memory and message queues (memory the sandbox's budget could not see)."""

ALLOWED_SOCKET_FAMILY = socket.AF_UNIX
"""The only family `socket()` and `socketpair()` accept; any other fails with EAFNOSUPPORT."""


def compiled_filter() -> IO[bytes]:
    """A temporary file holding the BPF program, positioned at its start (pass its fd to bwrap)."""
    import pyseccomp as seccomp

    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (ValueError, RuntimeError):  # not a syscall on this architecture
            continue
    for call in ("socket", "socketpair"):
        other_family = seccomp.Arg(0, seccomp.NE, ALLOWED_SOCKET_FAMILY)
        rules.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), call, other_family)
    program = tempfile.TemporaryFile()
    rules.export_bpf(program)
    program.seek(0)
    return program
