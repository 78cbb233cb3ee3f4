"""The bubblewrap command line of one sandboxed run: what the sandbox sees and which namespaces it gets.

The root of the sandbox is bubblewrap's own empty tmpfs, made read-only once set up, holding only:

- read-only binds of the interpreter, its standard library (its `site-packages` hidden under an empty read-only
  tmpfs: the code gets the standard library only) and the shared libraries the interpreter and the standard
  library's extension modules link (as `ldd` lists them), plus the loader's cache;
- a fresh /proc of the sandbox's own PID namespace and a minimal /dev (null, zero, random, urandom, tty);
- `/work`, a size-limited tmpfs: the only writable place (`/tmp` links to it), gone when the run ends;
- `/sandbox/boot.py` and `/sandbox/main.py`, read-only copies of the bootstrap and the code, passed as memfds.

Namespaces: mount, PID, network (no interfaces), IPC, UTS and cgroup where supported. As root, bubblewrap runs
privileged with every capability dropped except setuid/setgid, which the bootstrap spends at once to become an
unprivileged uid of its own (see `sandbox_uid`); as another user it runs unprivileged in a new user namespace
that may not create further user namespaces. Either way the process has no capabilities when user code runs,
`--die-with-parent` ends it with its caller, `--new-session` detaches it from any terminal, and the seccomp
filter of `_seccomp` refuses the calls that reach past the namespaces.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

WORK = "/work"
BOOT_PATH = "/sandbox/boot.py"
CODE_PATH = "/sandbox/main.py"
_UID_BASE = 0x50000000  # dynamic uids: far above any account's uid, below the 2**31 some tools assume
_uid_counter = itertools.count()
_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def sandbox_uid() -> int:
    """A uid no other sandbox of this machine uses at the same time (as root only).

    Each run gets its own so that RLIMIT_NPROC, which the kernel counts per user, limits this run alone: with one
    shared `nobody`, concurrent sandboxes shared one process budget and could starve each other."""
    return _UID_BASE + ((os.getpid() & 0xFFFF) << 12) + (next(_uid_counter) & 0xFFF)


def interpreter() -> str:
    return os.path.realpath(sys.executable)


def _stdlib_dirs() -> list[str]:
    """The standard library the interpreter finds on its own under -I -S: the directory of `os` and lib-dynload
    (those of the base installation: a virtual environment's own folders are not the standard library)."""
    dirs = [os.path.realpath(os.path.dirname(os.__file__))]
    dirs += [os.path.realpath(p) for p in sys.path if os.path.basename(p) == "lib-dynload" and os.path.isdir(p)]
    return list(dict.fromkeys(dirs))


@functools.cache
def _readonly_paths() -> tuple[list[str], list[str]]:
    """(paths to bind read-only, directories to hide under an empty tmpfs), each an absolute real path."""
    stdlib = _stdlib_dirs()
    extensions = [str(p) for root in stdlib for p in Path(root).glob("*.so")]
    extensions += [str(p) for root in stdlib for p in Path(root).glob("lib-dynload/*.so")]
    binds = [interpreter(), *stdlib, *_shared_libraries([interpreter(), *extensions])]
    if os.path.exists("/etc/ld.so.cache"):
        binds.append("/etc/ld.so.cache")
    hidden = [p for root in stdlib for p in (os.path.join(root, "site-packages"),) if os.path.isdir(p)]
    return _outermost(binds), hidden


def _shared_libraries(objects: list[str]) -> list[str]:
    """Every library `ldd` resolves for these objects, at the path the loader looks it up (it may be a link)."""
    ldd = shutil.which("ldd")
    if ldd is None:  # no ldd (not glibc): the usual library directories whole
        return [d for d in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(d)]
    found: list[str] = []
    for start in range(0, len(objects), 64):
        done = subprocess.run([ldd, *objects[start : start + 64]], capture_output=True, text=True, check=False)
        found += [m.group(1) for m in _LDD_PATH.finditer(done.stdout) if os.path.exists(m.group(1))]
    return list(dict.fromkeys(found))


def _outermost(paths: list[str]) -> list[str]:
    """The paths with those inside another one left out (bound with it already)."""
    unique = sorted(set(paths), key=lambda p: (p.count("/"), p))
    kept: list[str] = []
    for path in unique:
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _parent_dirs(paths: list[str]) -> list[str]:
    """The directories bubblewrap must create to hold the binds, shallowest first (created 0755 explicitly:
    otherwise they may not be searchable by the sandbox's unprivileged user)."""
    dirs = {str(parent) for p in paths for parent in Path(p).parents if str(parent) != "/"}
    return sorted(dirs, key=lambda d: (d.count("/"), d))


def bwrap_command(
    *, boot_fd: int, code_fd: int, seccomp_fd: int | None, disk_bytes: int, as_root: bool, boot_args: list[str]
) -> list[str]:
    binds, hidden = _readonly_paths()
    command = [
        bwrap_path() or "bwrap",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ]
    if as_root:  # privileged: all capabilities but the two the bootstrap spends on leaving root
        command += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        command += ["--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534"]
    for directory in _parent_dirs(binds + [BOOT_PATH]):
        command += ["--perms", "0755", "--dir", directory]
    for path in binds:
        command += ["--ro-bind", path, path]
    for path in hidden:
        command += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
    command += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(disk_bytes),
        "--perms",
        "1777",
        "--tmpfs",
        WORK,
        "--symlink",
        WORK,
        "/tmp",
        "--perms",
        "0444",
        "--ro-bind-data",
        str(boot_fd),
        BOOT_PATH,
        "--perms",
        "0444",
        "--ro-bind-data",
        str(code_fd),
        CODE_PATH,
        "--remount-ro",
        "/",
        "--chdir",
        WORK,
    ]
    for name, value in sandbox_environment(WORK).items():
        command += ["--setenv", name, value]
    if seccomp_fd is not None:
        command += ["--seccomp", str(seccomp_fd)]
    return [*command, "--", interpreter(), *python_flags(), BOOT_PATH, *boot_args]


def python_flags() -> list[str]:
    """Isolated mode (no site-packages, no user paths, no PYTHON* variables), no bytecode files, UTF-8 I/O."""
    return ["-I", "-S", "-B", "-X", "utf8"]


def sandbox_environment(workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "MALLOC_ARENA_MAX": "2",  # each thread's malloc arena reserves 64 MB of the address-space limit otherwise
    }
