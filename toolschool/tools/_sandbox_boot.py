"""Bootstrap of the python sandbox: runs inside the child interpreter before the user's code.

It is copied into the temporary working directory (the package directory may not be readable by the
sandbox's unprivileged user) and run as `python -I -S -B _sandbox_boot.py CONFIG`, CONFIG being one JSON
argument: the limits, the status pipe's fd and the working directory. It sets the resource limits (here rather
than in a `preexec_fn`, which is unsafe when the parent has threads: registries run tools from event-loop and
worker threads), installs an audit hook that refuses network, process creation, signals to other processes,
native code (ctypes) and writes outside the working directory, then runs `main.py`. Every refusal is reported
on the status pipe so the parent can say which limit was hit even when the user's code swallows the exception.
Standard library only.
"""

import errno
import json
import os
import re
import resource
import signal
import sys
import traceback

CONFIG: dict = {}
STATUS_FD = -1
ROOT = ""


def report(limit: str, detail: str) -> None:
    try:
        os.write(STATUS_FD, (json.dumps({"limit": limit, "detail": detail}) + "\n").encode())
    except OSError:
        pass


def set_limits() -> None:
    mb = 1024 * 1024
    cpu = int(CONFIG["cpu_seconds"])
    limits = {
        resource.RLIMIT_AS: CONFIG["memory_mb"] * mb,
        resource.RLIMIT_CPU: (cpu, cpu + 1),
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
_PROCESS_EVENTS = {
    "os.fork",
    "os.forkpty",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "subprocess.Popen",
    "pty.spawn",
}
_NETWORK_EVENTS = {"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname"}
_NATIVE_EVENTS = {"ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function"}
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
_OTHER_PROCESS = re.compile(r"^/proc/\d+(/|$)")


def _inside(path: object) -> bool:
    if isinstance(path, int):  # an already-open descriptor
        return True
    try:
        text = os.fsdecode(path)  # type: ignore[arg-type]
        full = os.path.realpath(os.path.join(os.getcwd(), text))
    except (TypeError, ValueError, OSError):
        return False
    return full == ROOT or full.startswith(ROOT + os.sep) or full == "/dev/null"


def refuse(limit: str, message: str) -> None:
    report(limit, message)
    raise SandboxRefusal(f"sandbox: {message}")


def audit(event: str, args: tuple) -> None:
    if event in _NETWORK_EVENTS:
        refuse("network", "network access is disabled")
    if event in _PROCESS_EVENTS:
        refuse("processes", "starting processes is not allowed")
    if event in _NATIVE_EVENTS:
        refuse("native_code", "ctypes / native code is not allowed")
    if event in ("os.kill", "os.killpg"):
        if event == "os.killpg" or args[0] != os.getpid():
            refuse("signals", "sending signals to other processes is not allowed")
    elif event == "open":
        path, mode, flags = args
        writing = bool((flags or 0) & _WRITE_FLAGS) or any(c in (mode or "") for c in "wax+")
        if writing and not _inside(path):
            refuse("filesystem", f"writing outside the working directory is not allowed: {path!r}")
        if isinstance(path, str | bytes) and _OTHER_PROCESS.match(os.fsdecode(path)):
            refuse("other_processes", f"reading other processes' /proc entries is not allowed: {path!r}")
    elif event in _PATH_EVENTS:
        for index in _PATH_EVENTS[event]:
            if index < len(args) and not _inside(args[index]):
                refuse("filesystem", f"changing files outside the working directory is not allowed: {args[index]!r}")


def run_user_code() -> int:
    with open("main.py", encoding="utf-8") as f:
        source = f.read()
    try:
        code = compile(source, "main.py", "exec")
        exec(code, {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__})
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return 0 if exc.code is None else exc.code
        sys.stderr.write(f"{exc.code}\n")  # sys.exit("message"): python prints the message and exits 1
        return 1
    except MemoryError:
        report("memory", f"the memory limit of {CONFIG['memory_mb']} MB was hit")
        sys.stderr.write(f"MemoryError: the memory limit of {CONFIG['memory_mb']} MB was hit\n")
        return 1
    except BaseException as exc:  # the user's traceback, without this bootstrap's frames
        if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
            report("file_size", f"the file size limit of {CONFIG['max_file_mb']} MB was hit")
        if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):  # RLIMIT_NPROC counts threads
            report("threads", f"the limit of {CONFIG['max_processes']} processes and threads was hit")
        if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
            report("open_files", f"the open files limit of {CONFIG['max_open_files']} was hit")
        own = os.path.abspath(__file__)
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) != own]
        text = "".join(traceback.format_list(frames)) + "".join(traceback.format_exception_only(type(exc), exc))
        sys.stderr.write("Traceback (most recent call last):\n" + text)
        return 1
    return 0


def on_cpu_limit(signum: int, frame: object) -> None:
    report("cpu_time", f"the CPU time limit of {CONFIG['cpu_seconds']} s was hit")
    sys.stderr.write(f"the CPU time limit of {CONFIG['cpu_seconds']} s was hit\n")
    sys.stderr.flush()
    os._exit(1)


def main() -> None:
    global CONFIG, STATUS_FD, ROOT
    CONFIG = json.loads(sys.argv[1])
    STATUS_FD = CONFIG["status_fd"]
    ROOT = os.path.realpath(CONFIG["root"])
    set_limits()
    signal.signal(signal.SIGXCPU, on_cpu_limit)
    if CONFIG["guard"]:
        sys.addaudithook(audit)
    code = run_user_code()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
