"""Model replies that distill paid for, kept append-only so an interrupted or repeated distill never asks again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from toolschool.errors import DataError
from toolschool.run_state import append_jsonl, scan_jsonl


class ReplyCache:
    """Append-only JSONL of model replies keyed by a hash of (purpose, model, prompt, sampling)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._data: dict[str, Any] = {}
        if path.exists():
            hint = "delete the cache file to start over"
            scan = scan_jsonl(path, hint=hint)  # a torn last line (a run killed mid-write) is asked for again
            if scan.valid_bytes < path.stat().st_size:  # cut it off: the next entry appended would make one broken line
                with path.open("r+b") as raw:
                    raw.truncate(scan.valid_bytes)
            for number, entry in scan.lines:
                if not isinstance(entry, dict) or "key" not in entry or "value" not in entry:
                    raise DataError(f"{path}:{number}: not a cache entry", hint=hint)
                self._data[entry["key"]] = entry["value"]

    @staticmethod
    def key(*parts: Any) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:32]

    def get(self, key: str) -> Any:
        return self._data.get(key)

    def put(self, key: str, value: Any) -> None:
        self._data[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            append_jsonl(handle, {"key": key, "value": value})
