"""A seccomp filter for the python sandbox: the system calls that reach past the sandbox's namespaces fail.

bubblewrap loads it (`--seccomp FD`) just before it starts the interpreter. It is a deny list, as Flatpak's is:
new namespaces (a nested user namespace would give the code a mount namespace of its own, where it could mount an
unlimited tmpfs), mounts, ptrace and reading other processes' memory, kernel keyrings, BPF, perf events,
userfaultfd, io_uring, kernel modules, kexec, reboot, swap, chroot and file handles. Those calls return EPERM
(`clone3` returns ENOSYS so the C library falls back to `clone`, whose flags a classic filter can read); a call
from another ABI (x32) fails the same way and a foreign architecture kills the process.

The filter is classic BPF written out here, not built with libseccomp, so the project needs no native library.
Only x86_64 is described; on other machines `seccomp_filter()` returns None and the sandbox runs without this
layer (containment() says so).
"""

from __future__ import annotations

import errno
import platform
import struct

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000

# x86_64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl).
_DENIED_X86_64 = {
    "ptrace": 101,
    "syslog": 103,
    "personality": 135,
    "pivot_root": 155,
    "chroot": 161,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}
_CLONE_X86_64 = 56
_CLONE3_X86_64 = 435
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
_NEW_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_NR_OFFSET, _ARCH_OFFSET, _ARG0_LOW_OFFSET = 0, 4, 16  # struct seccomp_data, little-endian


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def denied_syscalls() -> list[str]:
    """The names of the calls the filter refuses (for documentation and tests)."""
    return [*sorted(_DENIED_X86_64), "clone with new-namespace flags", "clone3 (ENOSYS: falls back to clone)"]


def seccomp_filter() -> bytes | None:
    """The filter program as bubblewrap reads it (an array of struct sock_filter), or None off x86_64."""
    if platform.machine() not in ("x86_64", "AMD64", "amd64"):
        return None
    eperm = _RET_ERRNO | errno.EPERM
    program = [
        _insn(_LD_W_ABS, _ARCH_OFFSET),
        _insn(_JEQ_K, _AUDIT_ARCH_X86_64, jt=1, jf=0),
        _insn(_RET_K, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, _NR_OFFSET),
        _insn(_JGE_K, _X32_SYSCALL_BIT, jt=0, jf=1),
        _insn(_RET_K, eperm),
    ]
    for number in sorted(_DENIED_X86_64.values()):
        program += [_insn(_JEQ_K, number, jt=0, jf=1), _insn(_RET_K, eperm)]
    program += [
        _insn(_JEQ_K, _CLONE3_X86_64, jt=0, jf=1),
        _insn(_RET_K, _RET_ERRNO | errno.ENOSYS),
        _insn(_JEQ_K, _CLONE_X86_64, jt=0, jf=3),
        _insn(_LD_W_ABS, _ARG0_LOW_OFFSET),
        _insn(_JSET_K, _NEW_NAMESPACE_FLAGS, jt=0, jf=1),
        _insn(_RET_K, eperm),
        _insn(_RET_K, _RET_ALLOW),
    ]
    return b"".join(program)
