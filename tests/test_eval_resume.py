"""`toolschool eval --resume` keeps an interrupted evaluation's items only where they were scored as the rest will be:
the same model, the same settings that decide a verdict, and the same items."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from eval_helpers import _calc_item, _FlakyBackend, _hermes

from toolschool.errors import ConfigError
from toolschool.evaluate.runner import EvalOptions
from toolschool.evaluate.session import Benchmark, run_evaluation

SCRIPT = {f"What is {i} + {i}?": _hermes("calculator", {"expression": f"{i} + {i}"}) for i in range(3)}


def _interrupted(out: Path, model: str = "m", options: EvalOptions | None = None) -> list:
    """An evaluation of 3 items broken off after the first two."""
    items = [_calc_item(i) for i in range(3)]
    with pytest.raises(RuntimeError, match="interrupted"):
        run_evaluation(
            [model],
            [Benchmark("data", items)],
            options or EvalOptions(concurrency=1),
            out,
            make_backend=lambda _m: _FlakyBackend(SCRIPT, "What is 2 + 2?"),
        )
    return items


def test_resuming_with_other_scoring_settings_names_each_change_and_the_ways_on(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    items = _interrupted(out)
    changed = EvalOptions(concurrency=1, mode="semantic", max_tokens=64)
    with pytest.raises(ConfigError) as info:
        run_evaluation(["m"], [Benchmark("data", items)], changed, out, make_backend=None, resume=True)
    message = str(info.value)
    assert f"cannot resume {out / 'm' / 'data.items.jsonl'}: it was scored with other settings (" in message
    assert "max_tokens: 256 -> 64" in message and "mode: 'exact' -> 'semantic'" in message
    assert "format" not in message.split(" — ")[0], "only what changed is named"
    assert "rerun without --resume to score every item again, or evaluate into another --out" in message
    # the settings it was scored with resume it: only the missing item runs
    again = _FlakyBackend(SCRIPT)
    run_evaluation(
        ["m"], [Benchmark("data", items)], EvalOptions(concurrency=1), out, make_backend=lambda _m: again, resume=True
    )
    assert again.asked == ["What is 2 + 2?"]


def test_an_edited_test_file_whose_ids_are_unchanged_is_not_resumed(tmp_path: Path) -> None:
    """Items of a `--data` file are named by their line number (or meta.id): a file edited in place kept every id,
    and the resume mixed verdicts on the old gold answers with verdicts on the new ones."""
    out = tmp_path / "eval"
    items = _interrupted(out)
    edited = list(items)
    edited[1] = dataclasses.replace(items[1], gold_calls=[])  # q1's gold answer changed; its id did not
    with pytest.raises(ConfigError) as info:
        run_evaluation(
            ["m"], [Benchmark("data", edited)], EvalOptions(concurrency=1), out, make_backend=None, resume=True
        )
    message = str(info.value)
    assert "item 1 ('q1') changed since it was scored (its prompt, tools, gold answer or meta differ)" in message
    assert "rerun without --resume" in message and "another --out" in message


def test_a_model_folder_trained_again_in_place_is_not_resumed(tmp_path: Path) -> None:
    """A model folder is named by its path: one written again (an SFT rerun into the same folder) was resumed
    as if it were the model that scored the first items."""
    model = tmp_path / "merged"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"first training")
    out = tmp_path / "eval"
    items = _interrupted(out, str(model))
    state_path = next(out.rglob("data.state.json"))
    assert set(json.loads(state_path.read_text())["model_files"]) == {"config.json", "model.safetensors"}
    (model / "model.safetensors").write_bytes(b"the second training")
    (model / "eval").mkdir()  # what `toolschool evaluate CHECKPOINT` writes into a model folder is not the model
    with pytest.raises(ConfigError, match=r"model files: model\.safetensors changed since \(the model was written"):
        run_evaluation(
            [str(model)], [Benchmark("data", items)], EvalOptions(concurrency=1), out, make_backend=None, resume=True
        )


def test_a_settings_file_written_before_model_files_were_recorded_still_resumes(tmp_path: Path) -> None:
    model = tmp_path / "merged"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    out = tmp_path / "eval"
    items = _interrupted(out, str(model))
    state_path = next(out.rglob("data.state.json"))
    older = {k: v for k, v in json.loads(state_path.read_text()).items() if k != "model_files"}
    state_path.write_text(json.dumps(older))
    items_path = state_path.with_name("data.items.jsonl")
    lines = [json.loads(line) for line in items_path.read_text().splitlines()]
    items_path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "item_digest"}) + "\n" for r in lines))
    again = _FlakyBackend(SCRIPT)
    summary = run_evaluation(
        [str(model)],
        [Benchmark("data", items)],
        EvalOptions(concurrency=1),
        out,
        make_backend=lambda _m: again,
        resume=True,
    )
    assert again.asked == ["What is 2 + 2?"]
    assert summary["models"][str(model)]["data"]["resumed_items"] == 2
