"""The system-call filter of a tenant program: what training never needs, refused (pure).

bubblewrap loads it (``--seccomp FD``) just before it executes the program,
after it has built the sandbox; it holds for the program and everything the
program starts, and no-new-privileges (bubblewrap's) keeps it from being
lifted.  A refused call fails with ``EPERM``, as an unprivileged process
would expect, so a library that probes (``unshare`` for a sandbox of its
own, ``perf_event_open`` for a profiler) carries on without it.

Refused:

- **namespaces**: ``unshare``, ``setns``, and ``clone`` with any
  ``CLONE_NEW*`` flag (a new user namespace is where most local kernel
  exploits start); ``clone3`` answers ``ENOSYS``, since its flags cannot be
  read by a filter, and the C library then falls back to ``clone``;
- **mounts**: ``mount``, ``umount2``, ``pivot_root`` and the new mount API;
- **other processes and the kernel**: ``ptrace``, ``process_vm_readv`` and
  ``process_vm_writev``, the kernel keyrings (``add_key``, ``request_key``,
  ``keyctl``), ``bpf``, ``userfaultfd``, ``perf_event_open``, modules,
  ``kexec``, ``reboot``, swap, clocks, host and domain names, ``syslog``,
  ``acct``, ``quotactl``, ``iopl``/``ioperm``, file handles
  (``open_by_handle_at``);
- any call of another ABI (32-bit calls on x86-64, the x32 ABI).

Architectures: x86-64 and AArch64 (``filter_for``); on another machine
there is no filter and the agent says so once (``workers.agent.processes``).
"""

from __future__ import annotations

import errno
import platform
import struct
from collections.abc import Iterable

# Classic BPF opcodes (linux/filter.h) and seccomp's return values (linux/seccomp.h).
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JSET_K = 0x45
RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

NR_OFFSET = 0
ARCH_OFFSET = 4
ARG0_OFFSET = 16  # the low 32 bits of args[0] (little-endian machines)

X32_BIT = 0x40000000
CLONE_NEW_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
    | 0x00000080  # CLONE_NEWTIME
)

REFUSED: tuple[str, ...] = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "open_tree", "move_mount",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "ptrace",
    "process_vm_readv", "process_vm_writev", "add_key", "request_key", "keyctl", "bpf",
    "userfaultfd", "perf_event_open", "init_module", "finit_module", "delete_module",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "syslog",
    "acct", "quotactl", "open_by_handle_at", "name_to_handle_at", "iopl", "ioperm",
)  # fmt: skip
"""System calls a training program never needs (iopl and ioperm exist on x86-64 only)."""


class Arch:
    """One architecture's audit id and system-call numbers."""

    def __init__(self, audit: int, numbers: dict[str, int], check_x32: bool) -> None:
        self.audit = audit
        self.numbers = numbers
        self.check_x32 = check_x32


X86_64 = Arch(
    0xC000003E,
    {
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "add_key": 248, "request_key": 249, "keyctl": 250,
        "bpf": 321, "userfaultfd": 323, "perf_event_open": 298, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
        "reboot": 169, "swapon": 167, "swapoff": 168, "settimeofday": 164,
        "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "sethostname": 170,
        "setdomainname": 171, "syslog": 103, "acct": 163, "quotactl": 179,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "iopl": 172, "ioperm": 173,
        "clone": 56, "clone3": 435,
    },
    check_x32=True,
)  # fmt: skip

AARCH64 = Arch(
    0xC00000B7,
    {
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "add_key": 217, "request_key": 218, "keyctl": 219,
        "bpf": 280, "userfaultfd": 282, "perf_event_open": 241, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294,
        "reboot": 142, "swapon": 224, "swapoff": 225, "settimeofday": 170,
        "clock_settime": 112, "clock_adjtime": 266, "adjtimex": 171, "sethostname": 161,
        "setdomainname": 162, "syslog": 116, "acct": 89, "quotactl": 60,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "clone": 220, "clone3": 435,
    },
    check_x32=False,
)  # fmt: skip

ARCHES: dict[str, Arch] = {"x86_64": X86_64, "amd64": X86_64, "aarch64": AARCH64, "arm64": AARCH64}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _refuse(nr: int, answer: int) -> bytes:
    """If the call is ``nr``, answer ``answer``; else go on."""
    return _insn(JEQ_K, nr, 0, 1) + _insn(RET_K, answer)


def program(arch: Arch, refused: Iterable[str] = REFUSED) -> bytes:
    """The filter, as the ``struct sock_filter`` array bubblewrap's ``--seccomp`` reads."""
    eperm = RET_ERRNO | errno.EPERM
    out = _insn(LD_W_ABS, ARCH_OFFSET)
    out += _insn(JEQ_K, arch.audit, 1, 0) + _insn(RET_K, eperm)  # another ABI: refused
    out += _insn(LD_W_ABS, NR_OFFSET)
    if arch.check_x32:
        out += _insn(JGE_K, X32_BIT, 0, 1) + _insn(RET_K, eperm)
    for name in refused:
        if name in arch.numbers:
            out += _refuse(arch.numbers[name], eperm)
    out += _refuse(arch.numbers["clone3"], RET_ERRNO | errno.ENOSYS)
    # clone: allowed unless it asks for a namespace (threads and fork never do).
    out += _insn(JEQ_K, arch.numbers["clone"], 1, 0) + _insn(RET_K, RET_ALLOW)
    out += _insn(LD_W_ABS, ARG0_OFFSET)
    out += _insn(JSET_K, CLONE_NEW_FLAGS, 0, 1) + _insn(RET_K, eperm)
    return out + _insn(RET_K, RET_ALLOW)


def filter_for(machine: str | None = None) -> bytes | None:
    """The filter for this machine (``platform.machine()``), or None where there is none."""
    arch = ARCHES.get((machine or platform.machine()).lower())
    return program(arch) if arch is not None else None
