"""Bootstrap of the python sandbox: runs inside the child interpreter before the user's code.

Run as `python -I -S -B boot.py CONFIG`, CONFIG being one JSON argument: the limits, the uid to become, the
working directory, the code's path and the report pipe. Inside bubblewrap it forks: the parent half
(`supervise`) waits for the program and reports to the sandbox's caller how it ended and the CPU time the kernel
counted (wait4), on a pipe the program never holds; the child half (`run_program`) leaves root (as root,
bubblewrap keeps only setuid/setgid for this step; the new uid clears every capability), sets the resource limits
(here rather than in a `preexec_fn`, which is unsafe when the parent has threads), installs the audit hook and
runs the code. Standard library only.

Nothing the program can reach decides what the caller reports: everything in the program's process, this
file's functions and the audit hook's state included, is within the user code's reach, so the caller takes only
the supervisor's report (a process of another uid, or non-dumpable, whose pipe the program closed before it
started) and its own clock and byte counts. What the child half adds is text for the program's own error
output: a limit named in the exception the code hit (MemoryError, a file too large, a full working directory, a
thread that could not start).

The audit hook is a second layer behind the operating system's: it refuses network, process creation, signals to
other processes, native code (ctypes), writes outside the working directory and reads of other processes' /proc
entries, so an attempt ends in a clear message rather than in whatever the kernel answers. Code that really
wants to can disable it; that gains nothing the namespaces, the read-only root and the rlimits do not hold.
"""

import errno
import json
import os
import re
import resource
import sys
import traceback

CONFIG: dict = {}
ROOT = ""


def leave_root(uid: int) -> None:
    """Become `uid` (no supplementary groups): the kernel then clears every capability. Fails closed.
    (Nothing to leave when not root, or in the weak mode run by root, where `uid` is 0: it was opted in to.)"""
    if os.getuid() != 0 or uid == 0:
        return
    try:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    except OSError as exc:
        sys.stderr.write(f"sandbox: could not leave root: {exc}\n")
        os._exit(125)
    if os.getuid() == 0 or os.geteuid() == 0:
        os._exit(125)


def set_limits() -> None:
    mb = 1024 * 1024
    cpu = int(CONFIG["cpu_seconds"])
    limits = {
        resource.RLIMIT_AS: CONFIG["memory_mb"] * mb,
        resource.RLIMIT_CPU: (cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL a second later
        resource.RLIMIT_NPROC: CONFIG["max_processes"],
        resource.RLIMIT_FSIZE: CONFIG["max_file_mb"] * mb,
        resource.RLIMIT_NOFILE: CONFIG["max_open_files"],
        resource.RLIMIT_CORE: 0,
    }
    for which, value in limits.items():
        soft, hard = value if isinstance(value, tuple) else (value, value)
        current_hard = resource.getrlimit(which)[1]
        if current_hard != resource.RLIM_INFINITY:
            hard = min(hard, current_hard)
            soft = min(soft, hard)
        resource.setrlimit(which, (soft, hard))


class SandboxRefusal(PermissionError):
    """Raised by the audit hook; a PermissionError so library code that tolerates OSError keeps working."""


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_PROCESS_EVENTS = frozenset(
    {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "pty.spawn"}
)
_NETWORK_EVENTS = frozenset(
    {"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname"}
)
_NATIVE_EVENTS = frozenset({"ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function"})
_PATH_EVENTS = {  # event -> indexes of path arguments that must stay inside the working directory
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.mkdir": (0,),
    "os.rename": (0, 1),
    "os.replace": (0, 1),
    "os.symlink": (1,),
    "os.link": (1,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.truncate": (0,),
    "os.utime": (0,),
    "shutil.rmtree": (0,),
}
_OTHER_PROCESS = re.compile(r"^/proc/(\d+)(/|$)")


def _inside(path: object) -> bool:
    if isinstance(path, int):  # an already-open descriptor
        return True
    try:
        full = os.path.realpath(os.path.join(os.getcwd(), os.fsdecode(path)))  # type: ignore[arg-type]
    except (TypeError, ValueError, OSError):
        return False
    return full == ROOT or full.startswith(ROOT + os.sep) or full == "/dev/null"


def _other_process(path: object) -> bool:
    """A path into another process's /proc entry, however spelled (/proc/./1, /proc//1/, a relative path)."""
    try:
        text = os.path.normpath(os.path.join(os.getcwd(), os.fsdecode(path)))  # type: ignore[arg-type]
    except (TypeError, ValueError, OSError):
        return False
    match = _OTHER_PROCESS.match(text)
    return match is not None and int(match.group(1)) != os.getpid()


def refuse(message: str) -> None:
    raise SandboxRefusal(f"sandbox: {message}")


def audit(event: str, args: tuple) -> None:
    if event in _NETWORK_EVENTS:
        refuse("network access is disabled")
    if event in _PROCESS_EVENTS:
        refuse("starting processes is not allowed")
    if event in _NATIVE_EVENTS:
        refuse("ctypes / native code is not allowed")
    if event in ("os.kill", "os.killpg"):
        if event == "os.killpg" or args[0] != os.getpid():
            refuse("sending signals to other processes is not allowed")
    elif event == "open":
        path, mode, flags = args
        writing = bool((flags or 0) & _WRITE_FLAGS) or any(c in (mode or "") for c in "wax+")
        if writing and not _inside(path):
            refuse(f"writing outside the working directory is not allowed: {path!r}")
        if isinstance(path, str | bytes) and _other_process(path):
            refuse(f"reading other processes' /proc entries is not allowed: {path!r}")
    elif event in _PATH_EVENTS:
        for index in _PATH_EVENTS[event]:
            if index < len(args) and not _inside(args[index]):
                refuse(f"changing files outside the working directory is not allowed: {args[index]!r}")


def limit_note(exc: BaseException) -> str | None:
    """The limit behind an exception the code did not handle, as a line for its error output."""
    mb = CONFIG["memory_mb"]
    if isinstance(exc, MemoryError):
        return f"the memory limit of {mb} MB was hit"
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        return f"the file size limit of {CONFIG['max_file_mb']} MB was hit"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"the working directory is full: it holds at most {CONFIG['disk_mb']} MB"
    if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
        return f"the open files limit of {CONFIG['max_open_files']} was hit"
    if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
        import threading

        return (
            f"a thread could not start with {threading.active_count()} running: each thread's stack counts "
            f"against the memory limit of {mb} MB, and processes and threads together are limited to "
            f"{CONFIG['max_processes']}"
        )
    if isinstance(exc, OSError) and exc.errno == errno.EAGAIN:  # fork() past RLIMIT_NPROC
        return f"the limit of {CONFIG['max_processes']} processes and threads was hit"
    return None


def run_user_code() -> int:
    with open(CONFIG["code_path"], "rb") as f:
        source = f.read()  # bytes: compile() reports invalid UTF-8 as the program's SyntaxError
    try:
        code = compile(source, "main.py", "exec")
        exec(code, {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__})
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return 0 if exc.code is None else exc.code
        sys.stderr.write(f"{exc.code}\n")  # sys.exit("message"): python prints the message and exits 1
        return 1
    except BaseException as exc:  # the user's traceback, without this bootstrap's frames
        own = os.path.abspath(__file__)
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) != own]
        text = "".join(traceback.format_list(frames)) + "".join(traceback.format_exception_only(type(exc), exc))
        note = limit_note(exc)
        sys.stderr.write("Traceback (most recent call last):\n" + text + (f"[limit] {note}\n" if note else ""))
        return 1
    return 0


def run_program() -> None:
    """In the child: leave root, set the limits, install the hook, run the code; never returns."""
    leave_root(int(CONFIG["uid"]))
    set_limits()
    if CONFIG["guard"]:
        sys.addaudithook(audit)
    code = run_user_code()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code & 0xFF)


def supervise(report_fd: int) -> None:
    """In the parent: wait for the program and report, on a pipe the program never holds, how it ended and the
    CPU time the kernel counted for it. As root the program runs under another uid; otherwise this process
    makes itself non-dumpable so the program (same uid) cannot read or write its memory through /proc."""
    if os.getuid() != 0:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    pid = os.fork()
    if pid == 0:
        os.close(report_fd)
        run_program()
    _, status, usage = os.wait4(pid, 0)
    report = {"status": os.waitstatus_to_exitcode(status), "cpu_seconds": usage.ru_utime + usage.ru_stime}
    try:
        os.write(report_fd, json.dumps(report).encode())
    except OSError:
        pass
    os._exit(0)


def main() -> None:
    global CONFIG, ROOT
    CONFIG = json.loads(sys.argv[1])
    ROOT = os.path.realpath(CONFIG["root"])
    if CONFIG.get("report_fd") is None:
        run_program()
    supervise(int(CONFIG["report_fd"]))


if __name__ == "__main__":
    main()
