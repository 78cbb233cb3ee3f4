"""Run model-written Python in a separate, limited process.

Containment, in layers (see `containment()` for what is active on this machine):

1. **Namespaces** (Linux, `unshare` from util-linux, when permitted): a new network namespace (no interfaces
   but a downed loopback: no network at all) and a new PID namespace (the code cannot see or signal any
   process outside it; when its first process dies the kernel kills every process left inside).
   As root, `setpriv` then drops to the unprivileged user `nobody` (keeping only CAP_DAC_READ_SEARCH so the
   interpreter under a root-only home directory stays readable), which makes RLIMIT_NPROC effective (root is
   exempt from it) and leaves the code unable to write anything outside world-writable directories. As a
   regular user, a user namespace is added (`--user --map-root-user`) where the OS allows it.
2. **Resource limits** (set by the bootstrap before any user code runs): address space (memory), CPU time,
   number of processes, file size, open files, no core dumps.
3. **An audit hook** (`sys.addaudithook`, installed by the bootstrap): refuses sockets, process creation,
   signals to other processes, ctypes, writes outside the temporary working directory and reads of other
   processes' /proc entries. It is the only network/filesystem guard where namespaces are unavailable (the
   documented fallback); on its own it stops Python-level attempts, not native code — which is why ctypes
   is refused too.
4. **The parent**: a new session (the whole process group is killed on timeout), a wall-clock deadline,
   stdout/stderr read incrementally with a size cap (the process is killed when output overflows),
   a scrubbed environment, `python -I -S -B` (no site-packages, no user paths, no PYTHON* variables: the
   code gets the standard library only), and a temporary working directory removed afterwards.
"""

from __future__ import annotations

import functools
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

NOBODY_UID = 65534
NOBODY_GID = 65534
_BOOT_SOURCE = (Path(__file__).with_name("_sandbox_boot.py")).read_text(encoding="utf-8")
_KILL_GRACE_SECONDS = 1.0


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. `guard=False` turns off the audit hook (only to test the OS layer on its own)."""

    wall_seconds: float = 5.0
    cpu_seconds: float | None = None  # default: the wall time, rounded up
    memory_mb: int = 512
    max_output_bytes: int = 20_000  # per stream; more kills the process and truncates with a marker
    max_processes: int = 64  # RLIMIT_NPROC (counts every process of the sandbox user)
    max_file_mb: int = 16
    max_open_files: int = 64
    guard: bool = True
    isolate: bool = True  # use namespaces / an unprivileged user when the OS allows

    @property
    def cpu_seconds_text(self) -> str:
        return str(self.effective_cpu_seconds())

    def effective_cpu_seconds(self) -> int:
        return max(1, math.ceil(self.cpu_seconds if self.cpu_seconds is not None else self.wall_seconds))


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # negative: killed by that signal; None: could not be started
    timed_out: bool
    limit: str | None  # wall_time, cpu_time, memory, output, processes, network, filesystem, open_files, ...
    truncated: bool
    seconds: float
    refusals: list[str] = field(default_factory=list)  # what the audit hook refused, in order

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None

    def describe(self, limits: SandboxLimits | None = None) -> str:
        """The observation text: output, then the error output, then which limit was hit."""
        limits = limits or SandboxLimits()
        parts: list[str] = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr and (self.exit_code != 0 or self.limit is not None):
            parts.append(self.stderr.rstrip("\n"))
        if self.limit is not None:
            parts.append(f"[sandbox] {_LIMIT_TEXT.get(self.limit, self.limit).format(limits=limits)}")
        elif self.exit_code not in (0, None):
            parts.append(f"[sandbox] the program exited with status {self.exit_code}")
        if not parts:
            parts.append("(no output — use print() to show results)")
        return "\n".join(parts)


_LIMIT_TEXT = {
    "wall_time": "wall time limit of {limits.wall_seconds:g} s hit; the process group was killed",
    "cpu_time": "CPU time limit of {limits.cpu_seconds_text} s hit; the process was stopped",
    "memory": "memory limit of {limits.memory_mb} MB hit",
    "output": "output limit of {limits.max_output_bytes} bytes hit; output truncated and the process killed",
    "processes": "process limit hit: starting processes is not allowed",
    "threads": "thread limit hit: at most {limits.max_processes} processes and threads (use fewer threads)",
    "network": "network access is disabled",
    "filesystem": "file access refused: only the temporary working directory is writable",
    "file_size": "file size limit of {limits.max_file_mb} MB hit",
    "open_files": "open files limit of {limits.max_open_files} hit (close files you no longer need)",
    "signals": "sending signals to other processes is not allowed",
    "native_code": "native code (ctypes) is not allowed",
    "other_processes": "reading other processes' information is not allowed",
    "cpu_time_or_memory": "killed by the kernel: CPU time or memory limit hit",
}
TRUNCATION_MARKER = "\n[... output truncated ...]"


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` in a fresh sandboxed interpreter; never raises for anything the code does."""
    limits = limits or SandboxLimits()
    start = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="toolschool-py-"))
    mode = _isolation_mode() if limits.isolate else "none"
    status_r, status_w = os.pipe()
    proc: subprocess.Popen[bytes] | None = None
    try:
        (workdir / "main.py").write_text(code, encoding="utf-8")
        boot = workdir / "_sandbox_boot.py"
        boot.write_text(_BOOT_SOURCE, encoding="utf-8")
        if mode == "netns-pidns-nobody":
            for path in (workdir, workdir / "main.py", boot):
                os.chown(path, NOBODY_UID, NOBODY_GID)
        config = {
            "status_fd": status_w,
            "root": str(workdir),
            "cpu_seconds": limits.effective_cpu_seconds(),
            "memory_mb": limits.memory_mb,
            "max_processes": limits.max_processes,
            "max_file_mb": limits.max_file_mb,
            "max_open_files": limits.max_open_files,
            "guard": limits.guard,
        }
        command = [*_prefix(mode), *_python_command(), str(boot), json.dumps(config)]
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=_scrubbed_env(workdir),
                start_new_session=True,
                pass_fds=(status_w,),
            )
        except OSError as exc:
            return SandboxResult("", f"could not start the sandbox: {exc}", None, False, None, False, 0.0)
        finally:
            os.close(status_w)
        return _supervise(proc, status_r, limits, start)
    finally:
        if proc is not None and proc.poll() is None:
            _kill(proc)
        os.close(status_r)
        shutil.rmtree(workdir, ignore_errors=True)


def _supervise(proc: subprocess.Popen[bytes], status_r: int, limits: SandboxLimits, start: float) -> SandboxResult:
    assert proc.stdout is not None and proc.stderr is not None
    deadline = start + limits.wall_seconds
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    buffers: dict[int, bytearray] = {out_fd: bytearray(), err_fd: bytearray()}
    status = bytearray()
    timed_out = overflow = False
    selector = selectors.DefaultSelector()
    for fd in (*buffers, status_r):
        selector.register(fd, selectors.EVENT_READ)
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in selector.select(remaining):
                fd = key.fd
                data = os.read(fd, 65536)
                if not data:
                    selector.unregister(fd)
                elif fd == status_r:
                    status += data[: 65536 - len(status)]
                else:
                    buffers[fd] += data
                    if len(buffers[fd]) > limits.max_output_bytes:
                        overflow = True
            if overflow:
                break
    finally:
        selector.close()
    if timed_out or overflow:
        _kill(proc)
    else:
        try:
            proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # closed its output but kept running
            timed_out = True
            _kill(proc)
    _reap_stragglers(proc)
    proc.stdout.close()
    proc.stderr.close()
    exit_code = proc.returncode
    refusals = _parse_status(bytes(status))
    stdout, out_truncated = _decode(buffers[out_fd], limits.max_output_bytes)
    stderr, err_truncated = _decode(buffers[err_fd], limits.max_output_bytes)
    return SandboxResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=exit_code,
        timed_out=timed_out,
        limit=_which_limit(timed_out, overflow, refusals, exit_code),
        truncated=out_truncated or err_truncated,
        seconds=time.monotonic() - start,
        refusals=refusals,
    )


def _which_limit(timed_out: bool, overflow: bool, refusals: list[str], exit_code: int | None) -> str | None:
    if overflow:
        return "output"
    if timed_out:
        return "wall_time"
    if "memory" in refusals:
        return "memory"
    if refusals:
        return refusals[0]
    if exit_code == -signal.SIGXCPU:
        return "cpu_time"
    if exit_code == -signal.SIGXFSZ:
        return "file_size"
    if exit_code == -signal.SIGKILL:  # not killed by us: the CPU hard limit or the kernel's OOM killer
        return "cpu_time_or_memory"
    return None


def _parse_status(raw: bytes) -> list[str]:
    refusals: list[str] = []
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            refusals.append(str(json.loads(line)["limit"]))
        except (ValueError, KeyError, TypeError):
            continue
    return refusals


def _decode(raw: bytearray, cap: int) -> tuple[str, bool]:
    if len(raw) <= cap:
        return raw.decode("utf-8", "replace"), False
    return raw[:cap].decode("utf-8", "replace") + TRUNCATION_MARKER, True


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the sandbox: the namespace's first process (which takes every process inside with it) and the
    whole process group (the fallback without a PID namespace)."""
    for pid in _children(proc.pid):
        _signal(lambda p=pid: os.kill(p, signal.SIGKILL))
    _signal(lambda: os.killpg(proc.pid, signal.SIGKILL))
    try:
        proc.wait(timeout=_KILL_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        pass


def _reap_stragglers(proc: subprocess.Popen[bytes]) -> None:
    """Background processes left in the group after a normal exit (possible only without the guard)."""
    _signal(lambda: os.killpg(proc.pid, signal.SIGKILL))


def _signal(send: object) -> None:
    try:
        send()  # type: ignore[operator]
    except (ProcessLookupError, PermissionError):
        pass


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _scrubbed_env(workdir: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


def _python_command() -> list[str]:
    return [os.path.realpath(sys.executable), "-I", "-S", "-B", "-X", "utf8"]


def _prefix(mode: str) -> list[str]:
    if mode == "netns-pidns-nobody":
        return [
            "unshare",
            "--net",
            "--pid",
            "--fork",
            "--kill-child",
            "setpriv",
            f"--reuid={NOBODY_UID}",
            f"--regid={NOBODY_GID}",
            "--clear-groups",
            "--inh-caps=-all,+dac_read_search",
            "--ambient-caps=+dac_read_search",
            "--no-new-privs",
        ]
    if mode == "userns-netns-pidns":
        return ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"]
    return []


@functools.cache
def _isolation_mode() -> str:
    """The strongest isolation this machine permits, probed once per process."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return "none"
    candidates = ["userns-netns-pidns"]
    if os.geteuid() == 0 and shutil.which("setpriv") is not None:
        candidates.insert(0, "netns-pidns-nobody")
    probe = "import os, sys; sys.exit(0 if os.getpid() == 1 else 3)"
    for mode in candidates:
        try:
            done = subprocess.run(
                [*_prefix(mode), *_python_command(), "-c", probe],
                capture_output=True,
                timeout=10,
                env=_scrubbed_env(Path("/")),
                cwd="/",
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return mode
    return "none"


def containment() -> dict[str, str]:
    """What contains the sandbox on this machine, layer by layer (for `toolschool tools list` and docs)."""
    mode = _isolation_mode()
    namespaces = mode != "none"
    return {
        "isolation": mode,
        "network": "network namespace (no interfaces) + audit hook" if namespaces else "audit hook only (fallback)",
        "processes": "PID namespace + RLIMIT_NPROC + audit hook"
        if mode == "netns-pidns-nobody"
        else ("PID namespace + audit hook" if namespaces else "audit hook + RLIMIT_NPROC"),
        "filesystem": "runs as nobody + audit hook (writes only in the temporary directory)"
        if mode == "netns-pidns-nobody"
        else "audit hook (writes only in the temporary directory)",
        "parent": "PID namespace: parent invisible" if namespaces else "audit hook refuses signals to other processes",
    }
