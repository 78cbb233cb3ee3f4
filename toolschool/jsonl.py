"""Reading JSONL files line by line, as a file iterates: lines end at newlines only.

`str.splitlines()` also splits at U+2028, U+2029, U+0085, \\x1c-\\x1e, \\v and \\f, which `json.dumps(...,
ensure_ascii=False)` writes unescaped inside strings: a record holding one (15 of 2,000 FLAN prompts hold U+2028)
came back as two broken lines. Every JSONL reader that takes a whole file at once uses `read_lines`.
"""

from __future__ import annotations

from pathlib import Path


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file without their line ends (\\n, \\r\\n or \\r), a last unterminated one too."""
    with open(path, encoding="utf-8") as handle:  # universal newlines: \n, \r\n and \r end a line, nothing else
        return [line.rstrip("\n") for line in handle]
