"""The seccomp deny-list the sandboxed process runs under, compiled to BPF with libseccomp."""

from __future__ import annotations

import errno
import socket
import tempfile
from typing import IO

__all__ = ["DENIED_SOCKET_FAMILIES", "DENIED_SYSCALLS", "compiled_filter"]

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
)
"""Refused with EPERM: debugging other processes, mounts and namespaces, kernel interfaces."""

DENIED_SOCKET_FAMILIES = (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, socket.AF_PACKET)
"""`socket()` of these families fails with EAFNOSUPPORT (the network namespace is empty anyway)."""


def compiled_filter() -> IO[bytes]:
    """A temporary file holding the BPF program, positioned at its start (pass its fd to bwrap)."""
    import pyseccomp as seccomp

    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (ValueError, RuntimeError):  # not a syscall on this architecture
            continue
    for family in DENIED_SOCKET_FAMILIES:
        rules.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.EQ, family))
    program = tempfile.TemporaryFile()
    rules.export_bpf(program)
    program.seek(0)
    return program
