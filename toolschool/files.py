"""Reading and writing the project's own text files (logs, markers, run metadata).

`read_lines` splits at newlines only, as a file iterates: `str.splitlines()` also splits at U+2028, U+2029,
U+0085, \\x1c-\\x1e, \\v and \\f, which `json.dumps(..., ensure_ascii=False)` writes unescaped inside strings, so a
JSONL record holding one (15 of 2,000 FLAN prompts hold U+2028) came back as two broken lines.

`write_text_atomic` replaces a file in one step: a reader (a resumed run, another process of an `accelerate
launch`, a report) sees the old file or the new one, never a half-written one.
"""

from __future__ import annotations

import os
from pathlib import Path


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file without their line ends (\\n, \\r\\n or \\r), a last unterminated one too."""
    with open(path, encoding="utf-8") as handle:  # universal newlines: \n, \r\n and \r end a line, nothing else
        return [line.rstrip("\n") for line in handle]


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` through a temporary file of this process, renamed over it."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per process: two writers never share it
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
