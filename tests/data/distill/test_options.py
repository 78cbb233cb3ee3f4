"""Distill settings that cannot work are refused before anything is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from distill_helpers import good_trials

from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.runner import distill
from toolschool.errors import DataError


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("paraphrase_max_tokens", 0, "paraphrase_max_tokens=0 must be a whole number of tokens >= 1"),
        ("paraphrase_max_tokens", 2.5, "paraphrase_max_tokens=2.5 must be a whole number of tokens >= 1"),
        ("max_tokens", -1, "max_tokens=-1 must be a whole number of tokens >= 1"),
        ("variants", -1, "variants=-1 must be a whole number >= 0"),
    ],
)
def test_token_budgets_that_cannot_work_are_refused_before_anything_is_written(
    tmp_path: Path, key: str, value: object, message: str
) -> None:
    opts = DistillOptions(trials=tmp_path / "t.jsonl", out=tmp_path / "o", **{key: value})
    with pytest.raises(DataError, match=re.escape(message)):
        distill(good_trials(), opts)
    assert not opts.out.exists()


def test_paraphrase_max_tokens_in_the_toml_is_checked_with_the_key_and_the_bound(tmp_path: Path) -> None:
    from toolschool.config import load_config
    from toolschool.errors import ConfigError

    path = tmp_path / "run.toml"
    path.write_text("[distill]\nparaphrase_max_tokens = 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}: 'distill.paraphrase_max_tokens' = 0 — expected greater than or equal to 1" in str(info.value)
    path.write_text("[distill]\nparaphrase_max_tokens = 48\nmax_tokens = 200\n")
    config = load_config(path)
    assert (config.distill.paraphrase_max_tokens, config.distill.max_tokens) == (48, 200)


def test_variants_without_the_tools_to_run_them_on_are_refused(tmp_path: Path) -> None:
    opts = DistillOptions(trials=tmp_path / "t.jsonl", out=tmp_path / "o", variants=2)
    with pytest.raises(DataError, match=re.escape("variants=2 needs the tools to run the variants' calls on")):
        distill(good_trials(), opts)
    assert not opts.out.exists()
