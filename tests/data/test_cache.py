"""The judge/paraphraser reply cache of distill."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolschool.data.cache import ReplyCache
from toolschool.errors import DataError


def test_cache_ignores_a_torn_last_line_but_not_a_bad_middle_line(tmp_path: Path) -> None:
    path = tmp_path / "cache.jsonl"
    path.write_text('{"key": "a", "value": "x\u2028y"}\n{"key": "b", "val')
    assert ReplyCache(path).get("a") == "x\u2028y"
    path.write_text('garbage\n{"key": "a", "value": 1}\n')
    with pytest.raises(DataError, match="cache.jsonl:1: not valid JSON .* — delete the cache file to start over"):
        ReplyCache(path)
    path.write_text('{"key": "a"}\n{"key": "b", "value": 1}\n')  # JSON, but not an entry
    with pytest.raises(DataError, match="cache.jsonl:1: not a cache entry — delete the cache file to start over"):
        ReplyCache(path)
