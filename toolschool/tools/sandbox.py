"""Run model-written Python in a separate, limited process whose boundary is the operating system.

Containment, in layers (docs/sandbox.md has the threat model; `containment()` says what is active here):

1. **bubblewrap** (`bwrap`, the sandbox under Flatpak): each run gets its own mount, PID, network, IPC and UTS
   namespaces; a read-only root holding only the interpreter, its standard library and the libraries they link;
   a size-limited tmpfs as the only writable place; a fresh /proc showing only its own processes; no
   capabilities and an unprivileged uid of its own; a seccomp filter against the calls that reach past the
   namespaces; `--die-with-parent` and a new session. See `_bwrap` and `_seccomp`.
2. **Resource limits**, set by the bootstrap before any user code runs: address space (memory), CPU time,
   processes and threads, file size, open files, no core dumps; the tmpfs's size caps the disk.
3. **An audit hook** (`sys.addaudithook`), a second layer only: it turns attempts at the network, processes,
   signals, ctypes, writes outside the working directory and other processes' /proc entries into clear
   messages. User code can switch it off; nothing depends on it.
4. **The parent**: a wall-clock deadline, stdout/stderr read incrementally with a size cap, a scrubbed
   environment, and the verdict. What it reports as a hit limit comes only from what it observes itself (its
   clock, the bytes it read) and what the kernel tells it (exit status, CPU time from wait4's rusage): no
   channel the code can write to decides it.

Without bubblewrap the python tool refuses to run, with one line naming the install command
(`SandboxUnavailable`), unless the user opts in to weaker containment with TOOLSCHOOL_SANDBOX=weak: then the code
runs as a plain child process with layers 2-4 only.
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
from dataclasses import dataclass
from pathlib import Path

from toolschool.errors import ToolschoolError
from toolschool.tools import _bwrap
from toolschool.tools._seccomp import denied_syscalls, seccomp_filter

_BOOT_SOURCE = (Path(__file__).with_name("_sandbox_boot.py")).read_text(encoding="utf-8")
CPU_VERDICT_SHARE = 0.75  # of the CPU limit that wait4 must count for a SIGXCPU/SIGKILL death to be the limit
MODE_VARIABLE = "TOOLSCHOOL_SANDBOX"
WEAK_MODE = "weak"
INSTALL_HINT = (
    "install it with `apt-get install bubblewrap` (as root; `make install` does this), or set "
    f"{MODE_VARIABLE}={WEAK_MODE} to accept weaker containment (audit hook and resource limits only)"
)


class SandboxUnavailable(ToolschoolError):
    """The python tool cannot contain code on this machine and the user has not opted in to weaker containment."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. `guard=False` turns off the audit hook (only to test the OS layer on its own)."""

    wall_seconds: float = 5.0
    cpu_seconds: float | None = None  # default: the wall time, rounded up
    memory_mb: int = 512
    max_output_bytes: int = 20_000  # per stream; more kills the process and truncates with a marker
    max_processes: int = 64  # RLIMIT_NPROC: processes and threads of this run's own uid
    max_file_mb: int = 16
    max_open_files: int = 64
    disk_mb: int = 64  # size of the working directory's tmpfs: all files together
    guard: bool = True

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
    limit: str | None  # what the parent observed: wall_time, cpu_time or output
    truncated: bool
    seconds: float
    cpu_seconds: float = 0.0  # user + system time of every process of the run (wait4's rusage)

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
            parts.append(f"[sandbox] {_LIMIT_TEXT[self.limit].format(limits=limits)}")
        elif self.exit_code not in (0, None):
            parts.append(f"[sandbox] {_ending(self.exit_code)}")
        if not parts:
            parts.append("(no output — use print() to show results)")
        return "\n".join(parts)


_LIMIT_TEXT = {
    "wall_time": "wall time limit of {limits.wall_seconds:g} s hit; the process group was killed",
    "cpu_time": "CPU time limit of {limits.cpu_seconds_text} s hit; the process was stopped",
    "output": "output limit of {limits.max_output_bytes} bytes hit; output truncated and the process killed",
}
TRUNCATION_MARKER = "\n[... output truncated ...]"


def _ending(exit_code: int) -> str:
    if exit_code < 0:
        try:
            return f"the program was killed by signal {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"the program was killed by signal {-exit_code}"
    return f"the program exited with status {exit_code}"


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` in a fresh sandboxed interpreter; never raises for anything the code does.

    Raises SandboxUnavailable when bubblewrap is missing or cannot create its namespaces here and the user has
    not set TOOLSCHOOL_SANDBOX=weak."""
    limits = limits or SandboxLimits()
    mode = sandbox_mode()
    if mode == "bwrap":
        return _run_bwrap(code, limits)
    return _run_weak(code, limits)


def sandbox_mode() -> str:
    """'bwrap', or 'weak' when the user opted in to it; raises SandboxUnavailable otherwise."""
    if os.environ.get(MODE_VARIABLE, "").strip().lower() == WEAK_MODE:
        return "weak"
    problem = _bwrap_problem()
    if problem is not None:
        raise SandboxUnavailable(
            f"the python tool needs bubblewrap (bwrap) to contain code, but {problem}", hint=INSTALL_HINT
        )
    return "bwrap"


def _config(limits: SandboxLimits, *, root: str, code_path: str, uid: int, report_fd: int | None) -> str:
    return json.dumps(
        {
            "root": root,
            "report_fd": report_fd,
            "code_path": code_path,
            "uid": uid,
            "cpu_seconds": limits.effective_cpu_seconds(),
            "memory_mb": limits.memory_mb,
            "max_processes": limits.max_processes,
            "max_file_mb": limits.max_file_mb,
            "max_open_files": limits.max_open_files,
            "disk_mb": limits.disk_mb,
            "guard": limits.guard,
        }
    )


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)  # close-on-exec: only the bwrap started with it in pass_fds inherits it
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _run_bwrap(code: str, limits: SandboxLimits) -> SandboxResult:
    start = time.monotonic()
    as_root = os.geteuid() == 0
    uid = _bwrap.sandbox_uid() if as_root else 65534
    fds = [_memfd("boot", _BOOT_SOURCE.encode()), _memfd("code", code.encode("utf-8", "surrogatepass"))]
    seccomp = seccomp_filter()
    seccomp_fd = _memfd("seccomp", seccomp) if seccomp is not None else None
    report_r, report_w = os.pipe()
    fds += [report_w] + ([seccomp_fd] if seccomp_fd is not None else [])
    config = _config(limits, root=_bwrap.WORK, code_path=_bwrap.CODE_PATH, uid=uid, report_fd=report_w)
    command = _bwrap.bwrap_command(
        boot_fd=fds[0],
        code_fd=fds[1],
        seccomp_fd=seccomp_fd,
        disk_bytes=limits.disk_mb * 1024 * 1024,
        as_root=as_root,
        boot_args=[config],
    )
    try:  # _start_and_supervise closes the descriptors it passes, once: other threads reuse the numbers
        return _start_and_supervise(command, limits, start, cwd="/", pass_fds=tuple(fds), report_fd=report_r)
    finally:
        os.close(report_r)


def _run_weak(code: str, limits: SandboxLimits) -> SandboxResult:
    """The opted-in fallback: a plain child process, with the rlimits, the audit hook and the parent's watch."""
    start = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="toolschool-py-"))
    try:
        (workdir / "main.py").write_text(code, encoding="utf-8", errors="surrogatepass")
        boot = workdir / "_sandbox_boot.py"
        boot.write_text(_BOOT_SOURCE, encoding="utf-8")
        config = _config(limits, root=str(workdir), code_path=str(workdir / "main.py"), uid=os.getuid(), report_fd=None)
        command = [_bwrap.interpreter(), *_bwrap.python_flags(), str(boot), config]
        return _start_and_supervise(command, limits, start, cwd=str(workdir), pass_fds=())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _start_and_supervise(
    command: list[str],
    limits: SandboxLimits,
    start: float,
    *,
    cwd: str,
    pass_fds: tuple[int, ...],
    report_fd: int | None = None,
) -> SandboxResult:
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=_bwrap.sandbox_environment(cwd),
            start_new_session=True,
            pass_fds=pass_fds,
        )
    except OSError as exc:
        return SandboxResult("", f"could not start the sandbox: {exc}", None, False, None, False, 0.0)
    finally:  # the child holds its copies; the report pipe must reach end-of-file when it is done
        for fd in pass_fds:
            os.close(fd)
    try:
        return _supervise(proc, limits, start, report_fd)
    finally:
        if proc.returncode is None:
            _kill(proc)
            _wait(proc, None)


def _supervise(
    proc: subprocess.Popen[bytes], limits: SandboxLimits, start: float, report_fd: int | None
) -> SandboxResult:
    assert proc.stdout is not None and proc.stderr is not None
    deadline = start + limits.wall_seconds
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    buffers: dict[int, bytearray] = {out_fd: bytearray(), err_fd: bytearray()}
    report = bytearray()
    timed_out = overflow = False
    with selectors.DefaultSelector() as selector:
        for fd in (*buffers, *([report_fd] if report_fd is not None else [])):
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map() and not overflow:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in selector.select(remaining):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fd)
                elif key.fd == report_fd:
                    report += data[: 4096 - len(report)]
                else:
                    buffers[key.fd] += data
                    overflow = overflow or len(buffers[key.fd]) > limits.max_output_bytes
    if timed_out or overflow:
        _kill(proc)
        cpu = _wait(proc, None)
    else:
        cpu = _wait(proc, deadline)
        if cpu is None:  # closed its output but kept running
            timed_out = True
            _kill(proc)
            cpu = _wait(proc, None)
    proc.stdout.close()
    proc.stderr.close()
    exit_code = proc.returncode
    if report_fd is not None:  # bwrap: the supervisor inside knows the program's own status and CPU time
        exit_code, cpu = _read_report(bytes(report), exit_code)
    stdout, out_truncated = _decode(buffers[out_fd], limits.max_output_bytes)
    stderr, err_truncated = _decode(buffers[err_fd], limits.max_output_bytes)
    cpu_seconds = cpu or 0.0
    return SandboxResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=exit_code,
        timed_out=timed_out,
        limit=_which_limit(timed_out, overflow, exit_code, cpu_seconds, limits),
        truncated=out_truncated or err_truncated,
        seconds=time.monotonic() - start,
        cpu_seconds=cpu_seconds,
    )


def _which_limit(
    timed_out: bool, overflow: bool, exit_code: int | None, cpu_seconds: float, limits: SandboxLimits
) -> str | None:
    """The limit the parent saw hit. A CPU verdict needs a death by SIGXCPU or SIGKILL and the kernel's count of CPU
    time near the limit (both from the supervisor's wait4, or the parent's own in weak mode). Near: wait4's user +
    system time, sampled from ticks, came out up to 16% below the limit the kernel enforced on a loaded machine
    (0.84 s for a 1 s limit); a program dying by SIGXCPU well before that is reported as killed by the signal."""
    if overflow:
        return "output"
    if timed_out:
        return "wall_time"
    if (
        exit_code in (-signal.SIGXCPU, -signal.SIGKILL)
        and cpu_seconds >= CPU_VERDICT_SHARE * limits.effective_cpu_seconds()
    ):
        return "cpu_time"
    return None


def _read_report(raw: bytes, fallback_status: int | None) -> tuple[int | None, float | None]:
    """The supervisor's (status, CPU seconds); without a report (the run was killed) bwrap's status and no CPU."""
    try:
        report = json.loads(raw)
        return int(report["status"]), float(report["cpu_seconds"])
    except (ValueError, KeyError, TypeError):
        return fallback_status, None


def _wait(proc: subprocess.Popen[bytes], deadline: float | None) -> float | None:
    """Reap the process with wait4 and return the CPU seconds it and its waited-for descendants used; None if it
    is still running at the deadline."""
    while True:
        try:
            pid, status, usage = os.wait4(proc.pid, 0 if deadline is None else os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere already
            proc.returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
            return 0.0
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


def _decode(raw: bytearray, cap: int) -> tuple[str, bool]:
    if len(raw) <= cap:
        return raw.decode("utf-8", "replace"), False
    return raw[:cap].decode("utf-8", "replace") + TRUNCATION_MARKER, True


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the sandbox. With bwrap, killing its monitor kills the namespace's first process
    (--die-with-parent), which takes every process inside with it; the process group covers weak mode."""
    for send in (lambda: os.kill(proc.pid, signal.SIGKILL), lambda: os.killpg(proc.pid, signal.SIGKILL)):
        try:
            send()
        except (ProcessLookupError, PermissionError):
            pass


@functools.cache
def _bwrap_problem() -> str | None:
    """Why bubblewrap cannot run a sandbox here (None: it can), found once per process by running one."""
    if sys.platform != "linux":
        return f"it runs on Linux only (this is {sys.platform})"
    if _bwrap.bwrap_path() is None:
        return "bwrap is not installed"
    try:
        result = _run_bwrap("print('ok')", SandboxLimits(wall_seconds=20))
    except OSError as exc:
        return f"bwrap could not start: {exc}"
    if result.stdout != "ok\n" or result.exit_code != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        return f"bwrap could not create its sandbox here ({lines[-1] if lines else f'status {result.exit_code}'})"
    return None


def containment() -> dict[str, str]:
    """What contains the sandbox on this machine, layer by layer (for `toolschool tools list`, bench and docs)."""
    weak = os.environ.get(MODE_VARIABLE, "").strip().lower() == WEAK_MODE
    problem = None if weak else _bwrap_problem()
    if weak or problem is not None:
        isolation = "weak (opted in with TOOLSCHOOL_SANDBOX=weak)" if weak else f"unavailable: {problem}"
        return {
            "isolation": isolation,
            "network": "audit hook only",
            "processes": "audit hook + RLIMIT_NPROC",
            "filesystem": "audit hook (writes only in the temporary directory); what the user can read is readable",
            "seccomp": "none",
        }
    as_root = os.geteuid() == 0
    return {
        "isolation": "bwrap",
        "network": "own network namespace (no interfaces) + audit hook",
        "processes": "own PID namespace and fresh /proc + RLIMIT_NPROC of its own uid + audit hook",
        "filesystem": "read-only root of the interpreter and its standard library; a tmpfs as the only writable place",
        "user": "a dynamic uid of its own, no capabilities (bubblewrap run as root)"
        if as_root
        else "unprivileged user namespace without nested user namespaces, no capabilities",
        "seccomp": f"refused: {', '.join(denied_syscalls())}"
        if seccomp_filter() is not None
        else "none (no filter for this architecture)",
    }
