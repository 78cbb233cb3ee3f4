"""The hostile battery: what an attacker tried through the python tool (issue 31), each attempt asserted contained
and answered with a clear message.

S1-S9 are the probes that got through the old sandbox; the rest held then and must still hold. Most run with the
audit hook off too (`guard=False`): the operating system's boundary (bubblewrap's namespaces, the read-only root,
the tmpfs, the rlimits, the seccomp filter) is what is tested, the hook is a second layer only.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from toolschool.tools.sandbox import SandboxLimits, SandboxResult, containment, run_python

WALL = 10.0  # an upper bound only (runs end when their code does): room for a 2-core machine under other load
MARGIN = 3.0
GUARDED = SandboxLimits(wall_seconds=WALL)
OS_ONLY = SandboxLimits(wall_seconds=WALL, guard=False)

pytestmark = pytest.mark.skipif(
    containment()["isolation"] != "bwrap", reason="the battery tests the bubblewrap sandbox (make install sets it up)"
)


def run(code: str, limits: SandboxLimits = GUARDED) -> SandboxResult:
    started = time.monotonic()
    result = run_python(code, limits)
    assert time.monotonic() - started < limits.wall_seconds + MARGIN
    return result


@dataclass(frozen=True)
class Probe:
    name: str
    code: str
    limits: SandboxLimits = GUARDED
    says: tuple[str, ...] = ()  # all of these appear in the observation text ("a|b": either a or b)
    never: tuple[str, ...] = ()  # none of these appear in it
    limit: str | None = None  # the limit the parent reports
    ok: bool = False
    extra: dict = field(default_factory=dict)


# Each probe: the attack and the message that answers it.
PROBES = [
    # S1: host files. Only the interpreter and its standard library are there, read-only; the uid is unprivileged.
    Probe("S1 /etc/shadow", "print(open('/etc/shadow').read()[:80])", OS_ONLY, ("FileNotFoundError", "/etc/shadow")),
    Probe("S1 /etc/passwd", "print(open('/etc/passwd').read())", OS_ONLY, ("FileNotFoundError",), ("root:x:0",)),
    Probe(
        "S1 no capabilities, not root",
        "import os\ncaps = [l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm'))]\n"
        "print('root' if os.getuid() == 0 else 'unprivileged', caps)",
        OS_ONLY,
        ("unprivileged", "['0000000000000000', '0000000000000000']"),
        ok=True,
    ),
    Probe("S1 the project is not there", f"print(open({__file__!r}).read())", OS_ONLY, ("FileNotFoundError",)),
    Probe(
        "S1 the root holds only the sandbox's own tree",
        "import os\nprint(sorted(os.listdir('/')), sorted(os.listdir('/etc')))",
        OS_ONLY,
        ("'work'", "['ld.so.cache']"),
        ("'home'", "'var'", "'usr'"),
        ok=True,
    ),
    Probe(
        "S1 setuid(0) is refused", "import os\nos.setuid(0)", OS_ONLY, ("PermissionError", "Operation not permitted")
    ),
    # S2: writes outside the working directory, through dir_fd or not: the root is read-only.
    Probe(
        "S2 dir_fd write outside",
        "import os\nd = os.open('/', os.O_RDONLY)\nos.open('x', os.O_WRONLY | os.O_CREAT, dir_fd=d)",
        OS_ONLY,
        ("Read-only file system",),
    ),
    Probe(
        "S2 the standard library is read-only",
        "import os\nopen(os.__file__, 'a').write('# pwned')",
        OS_ONLY,
        ("Read-only file system|Permission denied",),  # as root the file's owner is another uid than the sandbox's
    ),
    Probe(
        "S2 a symlink out of the working directory",
        "import os\nos.symlink('/', 'up')\nopen('up/etc/x', 'w').write('x')",
        OS_ONLY,
        ("Read-only file system",),
    ),
    Probe(
        "S2 writing outside, hook on",
        "open('/etc/x', 'w').write('x')",
        GUARDED,
        ("sandbox: writing outside the working directory is not allowed",),
    ),
    Probe("S2 /proc/sys is read-only", "open('/proc/sys/kernel/hostname', 'w').write('x')", OS_ONLY, ("Error",)),
    # S3/S4: with the hook switched off or bypassed, a process starts only inside the sandbox, and no shell is there.
    Probe(
        "S3 hook switched off, os.system",
        "import sys\nsys.modules['__main__'].refuse = lambda *a: None\nimport os\nprint('status', os.system('id'))",
        GUARDED,
        ("status 32512",),  # 127 << 8: /bin/sh is not in the sandbox
        ("uid=",),
        ok=True,
    ),
    Probe(
        "S4 _posixsubprocess.fork_exec of /bin/sh",
        "import _posixsubprocess, os\nr, w = os.pipe()\n"
        "pid = _posixsubprocess.fork_exec([b'/bin/sh', b'-c', b'id'], [b'/bin/sh'], True, (w,), None, None,"
        " -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)\n"
        "os.close(w)\nprint('exec error:', b''.join(iter(lambda: os.read(r, 200), b'')))\nos.waitpid(pid, 0)",
        GUARDED,
        ("exec error: b'OSError:2",),
        ("uid=",),
        ok=True,
    ),
    Probe(
        "S4 a child interpreter stays inside",
        "import _posixsubprocess, os, sys\nr, w = os.pipe()\nout_r, out_w = os.pipe()\n"
        "code = b'import os; print(os.getpid() < 10, os.getuid() != 0, os.listdir(\"/etc\"))'\n"
        "pid = _posixsubprocess.fork_exec([sys.executable.encode(), b'-I', b'-c', code], [sys.executable.encode()],"
        " True, tuple(sorted((out_w, w))), None, None, -1, -1, -1, out_w, -1, -1, r, w, True, False, -1,"
        " None, None, None, -1, None, False)\nos.close(w)\nos.close(out_w)\nos.waitpid(pid, 0)\n"
        "print(os.read(out_r, 200).decode())",
        GUARDED,
        ("True True ['ld.so.cache']",),
        ok=True,
    ),
    # S5: other processes: only the sandbox's own PID namespace is in /proc.
    Probe(
        "S5 /proc lists only the sandbox",
        "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
        OS_ONLY,
        ("[1, 2, 3]",),
        ok=True,
    ),
    Probe(
        "S5 /proc/./1/cmdline, hook on",
        "print(open('/proc/./1/cmdline').read())",
        GUARDED,
        ("sandbox: reading other processes' /proc entries is not allowed",),
    ),
    Probe("S5 the init's environment", "print(open('/proc/1/environ').read())", OS_ONLY, ("Permission denied",)),
    # S7: the report cannot be forged: the parent decides it from its own observations and the kernel's.
    Probe(
        "S7 writing a fake report to every descriptor",
        'import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b\'{"status": -24, "cpu_seconds": 99}\')\n'
        "    except OSError:\n        pass\nprint('done')",
        OS_ONLY,
        ("done",),
        ok=True,
    ),
    Probe(
        "S7 writing to the supervisor's report pipe",
        "import json, os, sys\nfd = json.loads(sys.argv[1])['report_fd']\nos.write(fd, b'{\"status\": -24}')",
        OS_ONLY,
        ("Bad file descriptor",),
    ),
    Probe(
        "S7 dying by SIGXCPU without using the CPU",
        "import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)",
        OS_ONLY,
        ("[sandbox] the program was killed by signal SIGXCPU",),
        ("CPU time limit",),
    ),
    Probe("S7 exit status 152", "import os\nos._exit(152)", OS_ONLY, ("exited with status 152",), ("CPU time limit",)),
    # S8: the disk: the working directory is a tmpfs of disk_mb.
    Probe(
        "S8 filling the disk",
        "for i in range(100):\n    open(f'f{i}', 'wb').write(b'x' * 4 * 1024 * 1024)",
        SandboxLimits(wall_seconds=WALL, guard=False, disk_mb=8, max_file_mb=4),
        ("No space left on device", "[limit] the working directory is full: it holds at most 8 MB"),
    ),
    # S9: a thread that cannot start is explained by both limits that can stop it.
    Probe(
        "S9 200 threads",
        "import threading, time\nfor _ in range(200):\n"
        "    threading.Thread(target=time.sleep, args=(10,), daemon=True).start()",
        GUARDED,
        ("can't start new thread", "each thread's stack counts against the memory limit of 512 MB", "limited to 64"),
    ),
    # Held before: network, signals, processes, memory, CPU, output, file size, open files, native code.
    Probe(
        "network, hook on",
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)",
        GUARDED,
        ("sandbox: network access is disabled",),
    ),
    Probe(
        "network, OS only",
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)",
        OS_ONLY,
        ("Network is unreachable",),
    ),
    Probe("DNS, OS only", "import socket\nsocket.getaddrinfo('example.com', 80)", OS_ONLY, ("socket.gaierror",)),
    Probe("kill the parent, hook on", "import os\nos.kill(os.getppid(), 9)", GUARDED, ("sandbox: sending signals",)),
    Probe("kill the init, OS only", "import os\nos.kill(1, 9)", OS_ONLY, ("PermissionError",)),
    Probe(
        "fork bomb, hook on",
        "import os\nwhile True:\n    os.fork()",
        GUARDED,
        ("sandbox: starting processes is not allowed",),
    ),
    Probe(
        "fork bomb, OS only",
        "import os, time\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0:\n            time.sleep(30)\n"
        "            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('stopped after', n, e.strerror)",
        SandboxLimits(wall_seconds=WALL, guard=False, max_processes=16),
        ("stopped after", "Resource temporarily unavailable"),
        ok=True,
    ),
    Probe(
        "memory bomb",
        "blocks = []\nwhile True:\n    blocks.append(bytearray(128 * 1024 * 1024))",
        SandboxLimits(wall_seconds=15, guard=False),
        ("MemoryError", "[limit] the memory limit of 512 MB was hit"),
    ),
    Probe(
        "CPU loop",
        "x = 0\nwhile True:\n    x += 1",
        SandboxLimits(wall_seconds=15, cpu_seconds=1, guard=False),
        ("[sandbox] CPU time limit of 1 s hit",),
        limit="cpu_time",
    ),
    Probe(
        "CPU loop ignoring SIGXCPU",
        "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nx = 0\nwhile True:\n    x += 1",
        SandboxLimits(wall_seconds=15, cpu_seconds=1, guard=False),
        ("[sandbox] CPU time limit of 1 s hit",),
        limit="cpu_time",
    ),
    Probe(
        "sleeping past the wall time",
        "import time\ntime.sleep(60)",
        SandboxLimits(wall_seconds=1, guard=False),
        ("[sandbox] wall time limit of 1 s hit",),
        limit="wall_time",
    ),
    Probe(
        "a 100 MB print",
        "print('x' * 100_000_000)",
        OS_ONLY,
        ("[... output truncated ...]", "[sandbox] output limit of 20000 bytes hit"),
        limit="output",
    ),
    Probe(
        "a flood on stderr",
        "import sys\nwhile True:\n    sys.stderr.write('y' * 10000)",
        OS_ONLY,
        ("[sandbox] output limit of 20000 bytes hit",),
        limit="output",
    ),
    Probe(
        "a file over the size limit",
        "open('big', 'wb').write(b'x' * 3 * 1024 * 1024)",
        SandboxLimits(wall_seconds=WALL, guard=False, max_file_mb=1),
        ("File too large", "[limit] the file size limit of 1 MB was hit"),
    ),
    Probe(
        "too many open files",
        "files = [open(f'f{i}', 'w') for i in range(20)]",
        SandboxLimits(wall_seconds=WALL, guard=False, max_open_files=10),
        ("Too many open files", "[limit] the open files limit of 10 was hit"),
    ),
    Probe("ctypes, hook on", "import ctypes", GUARDED, ("sandbox: ctypes / native code is not allowed",)),
    Probe(
        "a nested user namespace through ctypes (seccomp)",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())",
        OS_ONLY,
        ("unshare -1 1",),  # EPERM
        ok=True,
    ),
    Probe(
        "mount through ctypes (seccomp)",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('mount', libc.mount(b'none', b'/work', b'tmpfs', 0, None), ctypes.get_errno())",
        OS_ONLY,
        ("mount -1 1",),
        ok=True,
    ),
    Probe(
        "ptrace of the init (seccomp)",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('ptrace', libc.ptrace(16, 1, 0, 0), ctypes.get_errno())",
        OS_ONLY,
        ("ptrace -1 1",),
        ok=True,
    ),
    Probe(
        "the environment is scrubbed",
        "import os\nprint(sorted(os.environ))",
        OS_ONLY,
        ("'HOME'", "'PATH'"),
        ("TOOLSCHOOL_BATTERY_SECRET",),
        ok=True,
    ),
    Probe(
        "a background child does not outlive the run",
        "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nprint('parent done')",
        OS_ONLY,
        ("parent done",),
        ok=True,
    ),
    Probe(
        "C recursion past the stack",
        "import sys\nsys.setrecursionlimit(10**6)\nnested = []\nfor _ in range(100_000):\n    nested = [nested]\n"
        "print(repr(nested))",
        SandboxLimits(wall_seconds=10, guard=False),
        ("[sandbox] the program was killed by signal SIGSEGV",),
    ),
]


@pytest.mark.parametrize("probe", PROBES, ids=[p.name for p in PROBES])
def test_probe_is_contained(probe: Probe, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLSCHOOL_BATTERY_SECRET", "hunter2")
    result = run(probe.code, probe.limits)
    text = result.describe(probe.limits)
    for phrase in probe.says:
        assert any(option in text for option in phrase.split("|")), f"{phrase!r} missing from:\n{text}"
    for phrase in probe.never:
        assert phrase not in text, f"{phrase!r} in:\n{text}"
    assert result.limit == probe.limit, text
    assert result.ok is probe.ok, text


def test_battery_has_every_issue_probe() -> None:
    names = " ".join(p.name for p in PROBES)
    assert all(f"S{i} " in names for i in (1, 2, 3, 4, 5, 7, 8, 9))  # S6 is the two-sandbox test below
    assert len(PROBES) >= 30


def test_dir_fd_write_to_tmp_stays_in_the_sandbox() -> None:
    """S2 as reported: /tmp inside is the sandbox's own tmpfs, so the host's /tmp gets nothing."""
    name = f"toolschool-escape-{uuid.uuid4().hex}"
    code = f"import os\nd = os.open('/tmp', os.O_RDONLY)\nos.close(os.open({name!r}, os.O_CREAT, dir_fd=d))"
    assert run(code, OS_ONLY).ok
    assert not Path("/tmp", name).exists()


def test_host_command_lines_are_invisible() -> None:
    """S5: a host process's secret argument cannot be read back, whatever the path's spelling."""
    secret = f"--api-key=sk-{uuid.uuid4().hex}"
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", secret])
    try:
        code = (
            "import os\nfound = []\nfor path in ['/proc/./%d/cmdline', '/proc/%d/cmdline']:\n"
            "    try:\n        found.append(open(path % PID).read())\n"
            "    except OSError as e:\n        found.append(str(e))\n"
            "for p in os.listdir('/proc'):\n    if p.isdigit():\n"
            "        found.append(open(f'/proc/{p}/cmdline').read())\n"
            "print(found)"
        ).replace("PID", str(host.pid))
        result = run(code, OS_ONLY)
        assert result.ok and secret not in result.stdout and "No such file" in result.stdout
    finally:
        host.kill()
        host.wait()


def test_concurrent_sandboxes_cannot_reach_each_other() -> None:
    """S6: two runs at once: each has its own tmpfs, uid and PID namespace, so neither sees the other's files."""
    writer = (
        "import os, time\nopen('/work/secret-of-a', 'w').write('a')\ntime.sleep(4)\nprint(sorted(os.listdir('/work')))"
    )
    intruder = (
        "import os, time\ntime.sleep(1)\nseen = []\nfor root, dirs, files in os.walk('/'):\n"
        "    if root.startswith('/proc'):\n        continue\n"
        "    seen += [f for f in files if f.startswith(('secret-of', 'planted'))]\n"
        "open('/work/planted-by-b', 'w').write('b')\n"
        "print('seen', seen, sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    )
    results: dict[str, SandboxResult] = {}
    threads = [
        threading.Thread(
            target=lambda k=k, c=c: results.__setitem__(k, run_python(c, SandboxLimits(guard=False, wall_seconds=30)))
        )
        for k, c in (("a", writer), ("b", intruder))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["a"].ok and results["a"].stdout.strip() == "['secret-of-a']"
    assert results["b"].ok and results["b"].stdout.startswith("seen [] [1, 2, 3]")


def test_many_files_end_within_the_wall_time() -> None:
    """S8: 20,000 files in a loop: the run ends by the wall limit (the tmpfs goes with the namespace, nothing to
    delete file by file afterwards)."""
    limits = SandboxLimits(wall_seconds=2, guard=False)
    result = run("i = 0\nwhile True:\n    open(f'f{i}', 'w').write('x')\n    i += 1", limits)
    assert result.limit == "wall_time" or "[limit]" in result.stderr
