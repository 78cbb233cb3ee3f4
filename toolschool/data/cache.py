"""Model replies that distill paid for, kept append-only so an interrupted or repeated distill never asks again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from toolschool.errors import DataError


class ReplyCache:
    """Append-only JSONL of model replies keyed by a hash of (purpose, model, prompt, sampling)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._data: dict[str, Any] = {}
        if path.exists():
            data = path.read_bytes()
            whole = data.rfind(b"\n") + 1  # a run killed mid-write leaves a last line without its newline
            if whole < len(data):  # cut it off: the next entry appended to it would make both one broken line
                with path.open("r+b") as raw:
                    raw.truncate(whole)
            lines = data[:whole].decode("utf-8").split("\n")  # not splitlines: replies may hold U+2028
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                    self._data[entry["key"]] = entry["value"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    if any(rest.strip() for rest in lines[number:]):
                        raise DataError(
                            f"{path}:{number}: not a cache entry", hint="delete the cache file to start over"
                        ) from None
                    # a torn last line from an interrupted run: ignored, its reply is asked for again

    @staticmethod
    def key(*parts: Any) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:32]

    def get(self, key: str) -> Any:
        return self._data.get(key)

    def put(self, key: str, value: Any) -> None:
        self._data[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"key": key, "value": value}, ensure_ascii=False) + "\n")
            handle.flush()
