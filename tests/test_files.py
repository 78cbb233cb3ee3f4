"""The project's text files: JSONL lines end at newlines only (a record holding U+2028, written raw by
ensure_ascii=False as in 15 of 2,000 FLAN prompts, is one line for every reader), and markers are replaced whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolschool.evaluate.report import read_log
from toolschool.files import read_lines


def test_read_lines_splits_at_newlines_only(tmp_path: Path) -> None:
    records = [{"step": 1, "text": "a\u2028b\u2029c\x85d\x1ce\x0bf\x0cg"}, {"step": 2, "text": "h"}]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    assert [json.loads(line) for line in read_lines(path)] == records
    path.write_text('{"step": 1}\r\n{"step": 2}', encoding="utf-8")  # CRLF, no final newline
    assert read_lines(path) == ['{"step": 1}', '{"step": 2}']


def test_a_training_log_record_holding_u2028_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "train_log.jsonl"
    record = {"step": 5, "validation": {"sample": "first\u2028second"}}
    path.write_text(json.dumps({"step": 1}) + "\n" + json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    assert read_log(path) == [{"step": 1}, record]


def test_write_text_atomic_replaces_the_file_whole_or_not_at_all(tmp_path: Path) -> None:
    from toolschool.files import write_text_atomic

    path = tmp_path / "meta.json"
    write_text_atomic(path, '{"old": true}\n')
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(path, '{"new": "\ud83d"}\n')  # fails while writing: the old file stays as it was
    assert path.read_text() == '{"old": true}\n'
    write_text_atomic(path, '{"new": 1}\n')
    assert path.read_text() == '{"new": 1}\n' and [p.name for p in tmp_path.iterdir()] == ["meta.json"]
