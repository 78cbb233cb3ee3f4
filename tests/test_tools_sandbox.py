"""Security battery of the python sandbox: each attack is contained, the parent survives, the result says which
limit was hit, and the call returns within the wall-time limit plus a small margin."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from toolschool.tools.sandbox import TRUNCATION_MARKER, SandboxLimits, containment, run_python

WALL = 2.0
MARGIN = 2.0  # generous on a loaded 2-core machine; containment is what is tested, not speed
LIMITS = SandboxLimits(wall_seconds=WALL)
NAMESPACES = containment()["isolation"] != "none"


def run(code: str, limits: SandboxLimits = LIMITS):
    started = time.monotonic()
    result = run_python(code, limits)
    assert time.monotonic() - started < limits.wall_seconds + MARGIN
    return result


def test_runs_code_and_returns_stdout() -> None:
    result = run("print(sum(range(10)))")
    assert result.ok and result.stdout == "45\n" and result.exit_code == 0 and result.limit is None
    assert result.describe(LIMITS) == "45"


def test_traceback_points_at_user_code() -> None:
    result = run("x = 1\n1 / 0")
    assert result.exit_code == 1 and result.limit is None
    assert 'File "main.py", line 2' in result.stderr and "ZeroDivisionError" in result.stderr
    assert "_sandbox_boot" not in result.stderr  # the bootstrap's frames are hidden
    assert "exited with status 1" in result.describe(LIMITS)


def test_no_output_hint() -> None:
    assert "use print()" in run("x = 2 + 2").describe(LIMITS)


def test_fork_bomb() -> None:
    result = run("import os\nwhile True:\n    os.fork()")
    assert result.limit == "processes"
    assert "process limit" in result.describe(LIMITS)


def test_memory_bomb() -> None:
    # A generous wall time: on a loaded machine zero-filling 512 MB can take longer than the default 2 s,
    # and this test is about the memory limit, not the clock.
    limits = SandboxLimits(wall_seconds=15)
    result = run("blocks = []\nwhile True:\n    blocks.append(bytearray(128 * 1024 * 1024))", limits)
    assert result.limit == "memory"
    assert "memory limit of 512 MB" in result.describe(LIMITS)


def test_infinite_loop_is_killed_at_the_wall_time() -> None:
    result = run("while True:\n    pass", SandboxLimits(wall_seconds=WALL, cpu_seconds=30))
    assert result.timed_out and result.limit == "wall_time" and result.exit_code is not None
    assert "wall time limit of 2 s" in result.describe(SandboxLimits(wall_seconds=WALL))


def test_cpu_limit() -> None:
    result = run("x = 0\nwhile True:\n    x += 1", SandboxLimits(wall_seconds=5, cpu_seconds=1))
    assert result.limit == "cpu_time" and not result.timed_out


def test_sleeping_child_is_killed() -> None:
    result = run("import time\ntime.sleep(60)")
    assert result.timed_out and result.limit == "wall_time"


def test_writing_outside_the_temp_dir(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    result = run(f"open({str(target)!r}, 'w').write('pwned')")
    assert result.limit == "filesystem"
    assert not target.exists()
    assert "only the temporary working directory is writable" in result.describe(LIMITS)


def test_writing_inside_the_temp_dir_works_and_is_removed() -> None:
    result = run("import os\nopen('out.txt', 'w').write('ok')\nprint(open('out.txt').read(), os.getcwd())")
    assert result.ok
    text, cwd = result.stdout.split()
    assert text == "ok" and not Path(cwd).exists()


def test_parent_environment_is_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLSCHOOL_TEST_SECRET", "hunter2")
    result = run("import os\nprint(sorted(os.environ))\nprint(os.environ.get('TOOLSCHOOL_TEST_SECRET'))")
    assert "hunter2" not in result.stdout and "TOOLSCHOOL_TEST_SECRET" not in result.stdout
    proc = run(f"print(open('/proc/{os.getpid()}/environ').read())")
    assert "hunter2" not in proc.stdout and proc.limit == "other_processes"


def test_network_socket_is_refused() -> None:
    result = run("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)")
    assert result.limit == "network" and "network access is disabled" in result.describe(LIMITS)


def test_100_mb_print_is_truncated() -> None:
    result = run("print('x' * 100_000_000)")
    assert result.truncated and result.limit == "output"
    assert result.stdout.endswith(TRUNCATION_MARKER)
    assert len(result.stdout) <= LIMITS.max_output_bytes + len(TRUNCATION_MARKER)


def test_killing_the_parent_is_refused() -> None:
    result = run("import os\nos.kill(os.getppid(), 9)")
    assert result.limit == "signals"
    result = run(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)")
    assert result.limit == "signals"
    # still alive: this line runs


def test_ctypes_and_subprocess_are_refused() -> None:
    assert run("import ctypes").limit == "native_code"
    assert run("import subprocess\nsubprocess.run(['true'])").limit == "processes"


def test_file_size_limit() -> None:
    result = run("open('big', 'wb').write(b'x' * 3 * 1024 * 1024)", SandboxLimits(wall_seconds=WALL, max_file_mb=1))
    assert result.limit == "file_size"


@pytest.mark.skipif(not NAMESPACES, reason="namespaces are not permitted here; the audit hook is the only guard")
def test_os_layer_contains_without_the_audit_hook() -> None:
    """With the Python-level guard off, the namespaces, the unprivileged user and the rlimits still hold."""
    code = f"""
import os, socket, time
try:
    socket.create_connection(('1.1.1.1', 80), timeout=1)
    print('net: open')
except OSError as e:
    print('net:', e.errno)
try:
    os.kill({os.getpid()}, 9)
    print('kill: sent')
except OSError as e:
    print('kill:', e.errno)
n = 0
try:
    while n < 500:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print('fork stopped')
"""
    result = run(code, SandboxLimits(wall_seconds=WALL, guard=False, max_processes=16))
    assert "net: open" not in result.stdout and "net:" in result.stdout
    assert "kill: sent" not in result.stdout
    if containment()["isolation"] == "netns-pidns-nobody":
        assert "fork stopped" in result.stdout


def test_exit_with_a_message_shows_the_message() -> None:
    # sys.exit("...") prints its message and exits 1, as python itself does.
    result = run("import sys\nprint('checking')\nsys.exit('x must be positive')")
    assert result.exit_code == 1 and result.limit is None
    assert result.describe(LIMITS).splitlines() == [
        "checking",
        "x must be positive",
        "[sandbox] the program exited with status 1",
    ]


def test_open_files_limit_is_named() -> None:
    limits = SandboxLimits(wall_seconds=WALL, max_open_files=10)
    result = run("files = [open(f'f{i}', 'w') for i in range(20)]", limits)
    assert result.limit == "open_files"
    assert "Too many open files" in result.stderr
    assert "[sandbox] open files limit of 10 hit" in result.describe(limits)


def test_thread_limit_is_named() -> None:
    # RLIMIT_NPROC counts threads too: a program starting more threads than max_processes is told so.
    limits = SandboxLimits(wall_seconds=WALL, max_processes=8)
    code = "import threading, time\nfor _ in range(40):\n    threading.Thread(target=time.sleep, args=(1,)).start()"
    result = run(code, limits)
    if "can't start new thread" not in result.stderr:  # root without the switch to nobody: no RLIMIT_NPROC
        pytest.skip("RLIMIT_NPROC does not apply to the sandbox's user here")
    assert result.limit == "threads"
    assert "[sandbox] thread limit hit: at most 8 processes and threads" in result.describe(limits)
