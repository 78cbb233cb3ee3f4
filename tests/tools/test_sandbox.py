"""The python sandbox's ordinary behaviour: output, tracebacks, the limits the parent reports, the working directory,
and what happens where bubblewrap is missing. The attacks are in test_sandbox_battery.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from toolschool.tools import sandbox
from toolschool.tools.sandbox import (
    TRUNCATION_MARKER,
    SandboxLimits,
    SandboxUnavailable,
    containment,
    run_python,
)

WALL = 2.0  # where the wall-time limit itself is tested
MARGIN = 3.0  # generous on a loaded 2-core machine; containment is what is tested, not speed
LIMITS = SandboxLimits(wall_seconds=10)  # elsewhere an upper bound only: runs end when their code does


def run(code: str, limits: SandboxLimits = LIMITS):
    started = time.monotonic()
    result = run_python(code, limits)
    assert time.monotonic() - started < limits.wall_seconds + MARGIN
    return result


def test_this_machine_runs_the_bubblewrap_sandbox() -> None:
    # `make install` installs bubblewrap; the suite must exercise the real boundary, not the weak fallback.
    layers = containment()
    assert layers["isolation"] == "bwrap"
    assert all(call in layers["seccomp"] for call in ("unshare", "mount", "ptrace", "setns", "bpf"))


def test_runs_code_and_returns_stdout() -> None:
    result = run("print(sum(range(10)))")
    assert result.ok and result.stdout == "45\n" and result.exit_code == 0 and result.limit is None
    assert result.describe(LIMITS) == "45"


def test_standard_library_extension_modules_import() -> None:
    code = "import ssl, sqlite3, decimal, zlib, lzma, bz2, hashlib, json, datetime, fractions\nprint('ok')"
    assert run(code).stdout == "ok\n"


def test_traceback_points_at_user_code() -> None:
    result = run("x = 1\n1 / 0")
    assert result.exit_code == 1 and result.limit is None
    assert 'File "main.py", line 2' in result.stderr and "ZeroDivisionError" in result.stderr
    assert "boot" not in result.stderr  # the bootstrap's frames are hidden
    assert "exited with status 1" in result.describe(LIMITS)


def test_no_output_hint() -> None:
    assert "use print()" in run("x = 2 + 2").describe(LIMITS)


def test_infinite_loop_is_killed_at_the_wall_time() -> None:
    result = run("while True:\n    pass", SandboxLimits(wall_seconds=WALL, cpu_seconds=30))
    assert result.timed_out and result.limit == "wall_time" and result.exit_code is not None
    assert "wall time limit of 2 s" in result.describe(SandboxLimits(wall_seconds=WALL))


def test_cpu_limit_is_reported_from_the_kernels_count() -> None:
    limits = SandboxLimits(wall_seconds=15, cpu_seconds=1)
    result = run("x = 0\nwhile True:\n    x += 1", limits)
    assert result.limit == "cpu_time" and not result.timed_out and result.cpu_seconds >= 0.75
    assert "[sandbox] CPU time limit of 1 s hit" in result.describe(limits)


def test_100_mb_print_is_truncated() -> None:
    result = run("print('x' * 100_000_000)")
    assert result.truncated and result.limit == "output"
    assert result.stdout.endswith(TRUNCATION_MARKER)
    assert len(result.stdout) <= LIMITS.max_output_bytes + len(TRUNCATION_MARKER)


def test_writing_inside_the_working_directory_works_and_tmp_is_the_same_place() -> None:
    code = "import os\nopen('out.txt', 'w').write('ok')\nprint(open('/tmp/out.txt').read(), os.getcwd())"
    result = run(code)
    assert result.ok and result.stdout.split() == ["ok", "/work"]


def test_each_run_starts_with_an_empty_working_directory() -> None:
    run("open('left-behind', 'w').write('x')")
    assert run("import os\nprint(os.listdir('.'))").stdout == "[]\n"


def test_exit_with_a_message_shows_the_message() -> None:
    # sys.exit("...") prints its message and exits 1, as python itself does.
    result = run("import sys\nprint('checking')\nsys.exit('x must be positive')")
    assert result.exit_code == 1 and result.limit is None
    assert result.describe(LIMITS).splitlines() == [
        "checking",
        "x must be positive",
        "[sandbox] the program exited with status 1",
    ]


def test_code_with_a_lone_surrogate_is_a_syntax_error_not_a_crash() -> None:
    result = run("print('a\ud800b')")
    assert result.exit_code == 1 and "SyntaxError" in result.stderr


def test_missing_bubblewrap_is_one_line_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox._bwrap, "bwrap_path", lambda: None)
    monkeypatch.setattr(sandbox, "_bwrap_problem", sandbox._bwrap_problem.__wrapped__)
    monkeypatch.delenv(sandbox.MODE_VARIABLE, raising=False)
    with pytest.raises(SandboxUnavailable) as caught:
        run_python("print(1)")
    message = str(caught.value)
    assert "\n" not in message
    assert "bwrap is not installed" in message and "apt-get install bubblewrap" in message
    assert "TOOLSCHOOL_SANDBOX=weak" in message
    assert containment()["isolation"].startswith("unavailable: bwrap is not installed")


def test_weaker_containment_only_when_opted_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox._bwrap, "bwrap_path", lambda: None)
    monkeypatch.setattr(sandbox, "_bwrap_problem", sandbox._bwrap_problem.__wrapped__)
    monkeypatch.setenv(sandbox.MODE_VARIABLE, "weak")
    assert containment()["isolation"].startswith("weak")
    result = run("print(sum(range(10)))")
    assert result.ok and result.stdout == "45\n"
    refused = run("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)")
    assert "sandbox: network access is disabled" in refused.stderr  # the audit hook is all there is
    cpu = run("x = 0\nwhile True:\n    x += 1", SandboxLimits(wall_seconds=15, cpu_seconds=1))
    assert cpu.limit == "cpu_time"


def test_weak_mode_writes_only_in_its_temporary_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(sandbox.MODE_VARIABLE, "weak")
    target = tmp_path / "escaped.txt"
    result = run(f"open({str(target)!r}, 'w').write('pwned')")
    assert "writing outside the working directory is not allowed" in result.stderr and not target.exists()
