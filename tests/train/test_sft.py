from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import _config, _example, _write, save_sft_like_adapter, train_sft

from toolschool.errors import DataError, ToolschoolError
from toolschool.train.common import latest_checkpoint
from toolschool.train.sft import build_validation_items, check_has_assistant, prepare_examples


@pytest.fixture()
def data_files(tmp_path: Path) -> tuple[Path, Path]:
    train = _write(tmp_path / "train.jsonl", [_example(i, i + 3) for i in range(2, 14)])
    validation = _write(tmp_path / "validation.jsonl", [_example(i, 7) for i in range(20, 23)])
    return train, validation


def test_labels_cover_only_assistant_tokens(tokenizer) -> None:
    from toolschool.chat.formats import get_format

    prepared = prepare_examples([_example(12, 34)], get_format("hermes"), tokenizer, max_length=512)
    row = prepared.rows[0]
    learned = tokenizer.decode([t for t, lab in zip(row["input_ids"], row["labels"], strict=True) if lab != -100])
    assert '"expression": "12 * 34"' in learned
    assert "12 * 34 = 408." in learned
    assert learned.count("<|im_end|>") == 2  # each assistant turn's end-of-turn token is learned
    assert "What is" not in learned and "408\n</tool_response>" not in learned
    assert prepared.truncated == 0


def test_truncation_is_counted(tokenizer) -> None:
    from toolschool.chat.formats import get_format

    fmt = get_format("hermes")
    short = _example(3, 4)
    limit = len(fmt.render(short["messages"], short["tools"], tokenizer).input_ids) + 5
    long_example = _example(1, 2)
    long_example["messages"][0]["content"] = "word " * 400
    prepared = prepare_examples([long_example, short], fmt, tokenizer, max_length=limit)
    assert prepared.truncated == 1
    assert prepared.dropped_no_assistant_after_truncation == 1  # the only assistant text fell past the cut
    assert len(prepared.rows) == 1
    assert prepared.max_seen_length > limit


def test_validation_prompts_longer_than_max_length_are_counted_and_kept_whole(tokenizer) -> None:
    from toolschool.chat.formats import get_format

    fmt = get_format("hermes")
    long_example = _example(1, 2)
    long_example["messages"][0]["content"] = "word " * 400
    items = build_validation_items([_example(3, 4), long_example], fmt, tokenizer, limit=2, max_length=300)
    assert [item.over_max_length for item in items] == [False, True]
    assert len(items[1].prompt_ids) > 300  # sent whole, as `toolschool eval` sends it (training cuts it)
    assert items[1].messages[0]["content"].startswith("word word")


def test_no_assistant_turn_is_refused_with_file_and_line() -> None:
    bad = {"messages": [{"role": "user", "content": "hi"}], "tools": [], "meta": {}}
    with pytest.raises(DataError, match=r"data.jsonl:2") as info:
        check_has_assistant([_example(1, 2), bad], "data.jsonl")
    assert "no assistant turn" in str(info.value)


def test_missing_training_file_is_clear(tmp_path: Path, tiny_model_dir: Path, data_files) -> None:
    _, validation = data_files
    config = _config(tmp_path, tiny_model_dir, tmp_path / "missing.jsonl", validation)
    with pytest.raises(ToolschoolError, match="training data .*missing.jsonl' does not exist"):
        train_sft(config, tmp_path / "out", progress=False)


def test_a_missing_training_file_is_named_before_the_model_or_trainer_loads(tmp_path: Path) -> None:
    """`sft --train missing.jsonl` answered after loading the model (7-9 s); now before any slow import."""
    code = (
        "import sys\nfrom pathlib import Path\nfrom toolschool.config import load_config\n"
        "from toolschool.errors import ToolschoolError\nfrom toolschool.train.sft import SFTInputs, run_sft\n"
        f"inputs = SFTInputs('/no/model', Path({str(tmp_path / 'missing.jsonl')!r}))\n"
        f"try:\n    run_sft(load_config(None), inputs, Path({str(tmp_path / 'out')!r}), progress=False)\n"
        "except ToolschoolError as exc:\n    print(exc)\n"
        "print(sorted(m for m in ('trl', 'datasets', 'torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    message, loaded = done.stdout.strip().splitlines()
    assert "missing.jsonl' does not exist" in message and loaded == "[]"


def test_a_resumed_run_reports_the_seconds_and_loss_of_the_whole_run(
    tmp_path: Path, tiny_model_dir: Path, data_files
) -> None:
    from toolschool.train.whole_run import RUN_SECONDS_FILE

    train, validation = data_files
    out = tmp_path / "out"
    first = train_sft(_config(tmp_path, tiny_model_dir, train, validation, num_steps=2), out, progress=False)
    clock_at_2 = json.loads((out / "checkpoints" / "checkpoint-2" / RUN_SECONDS_FILE).read_text())["seconds"]
    assert 0 < clock_at_2 <= first.seconds
    second = train_sft(_config(tmp_path, tiny_model_dir, train, validation), out, resume=True, progress=False)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in log if "loss" in r}
    assert sorted(losses) == [1, 2, 3, 4]
    final = [r for r in log if "train_loss" in r][-1]
    # the Trainer alone reports the loss of steps 3-4 divided by 4 steps and the seconds since the resume
    assert final["train_loss"] == pytest.approx(sum(losses.values()) / 4)
    assert clock_at_2 < final["train_runtime"] <= second.seconds
    clock_at_4 = json.loads((out / "checkpoints" / "checkpoint-4" / RUN_SECONDS_FILE).read_text())["seconds"]
    assert clock_at_2 < clock_at_4 <= second.seconds


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path):
    """One 2-step LoRA run shared by the tests below (training is the slow part)."""
    tmp_path = tmp_path_factory.mktemp("sft-run")
    train = _write(tmp_path / "train.jsonl", [_example(i, i + 3) for i in range(2, 14)])
    validation = _write(tmp_path / "validation.jsonl", [_example(i, 7) for i in range(20, 23)])
    out = tmp_path / "sft"
    result = train_sft(_config(tmp_path, tiny_model_dir, train, validation, num_steps=2), out, progress=False)
    return tmp_path, train, validation, out, result


def test_existing_checkpoints_need_resume(first_run, tiny_model_dir: Path) -> None:
    tmp_path, train, validation, out, _ = first_run
    with pytest.raises(ToolschoolError, match="already holds checkpoints"):
        train_sft(_config(tmp_path, tiny_model_dir, train, validation), out, progress=False)


def test_resume_with_another_base_model_is_refused(first_run, tiny_model_dir: Path) -> None:
    from helpers import save_tiny_llama

    tmp_path, train, validation, out, _ = first_run
    other_dir = save_tiny_llama(tmp_path / "other-model", tiny_model_dir, hidden=32, layers=1, seed=1)
    with pytest.raises(ToolschoolError, match=r"ran with other inputs: base model hidden_size: 64 → 32; "):
        train_sft(_config(tmp_path, other_dir, train, validation), out, resume=True, progress=False)


def test_resume_with_same_shaped_but_different_weights_is_refused(first_run, tiny_model_dir: Path) -> None:
    """Another model of the same architecture (e.g. a fine-tune of the base) is still another base model."""
    from helpers import save_tiny_llama

    tmp_path, train, validation, out, _ = first_run
    other_dir = save_tiny_llama(tmp_path / "same-shape-model", tiny_model_dir, seed=7)
    with pytest.raises(
        ToolschoolError, match=r"ran with other inputs: base model weights: \"[0-9a-f]{16}\" → \"[0-9a-f]{16}\" — "
    ):
        train_sft(_config(tmp_path, other_dir, train, validation), out, resume=True, progress=False)
    saved = json.loads((out / "toolschool_sft.json").read_text())["base"]
    assert saved["model"] == str(tiny_model_dir)  # the refused resume did not overwrite the run's base


def test_resume_on_another_training_file_is_refused(first_run, tiny_model_dir: Path) -> None:
    """The resumed trainer skips the batches it had seen: with other data those would be other batches."""
    tmp_path, train, validation, out, _ = first_run
    changed = tmp_path / "changed-train.jsonl"
    changed.write_text(train.read_text() + json.dumps(_example(7, 8)) + "\n")
    meta_before = (out / "toolschool_sft.json").read_text()
    with pytest.raises(ToolschoolError, match=r"ran with other inputs: training file: [0-9a-f]{10}… → [0-9a-f]{10}…"):
        train_sft(_config(tmp_path, tiny_model_dir, changed, validation), out, resume=True, progress=False)
    assert (out / "toolschool_sft.json").read_text() == meta_before


def test_a_fresh_run_into_a_folder_with_a_dead_runs_log_does_not_mix_them(first_run, tiny_model_dir: Path) -> None:
    """A run that died before its first checkpoint left steps in the log; the next run starts from step 0."""
    tmp_path, train, validation, _, _ = first_run
    out = tmp_path / "after-a-dead-run"
    out.mkdir()
    (out / "train_log.jsonl").write_text(json.dumps({"step": 1, "loss": 99.0}) + "\n")
    train_sft(
        _config(tmp_path, tiny_model_dir, train, validation, num_steps=1, validation_samples=0), out, progress=False
    )
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1] and all(r.get("loss") != 99.0 for r in records)


def test_sft_from_an_adapter_folder_trains_on_top_of_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`--model runs/x/sft/adapter` used to die in TRL ("a PeftModel together with a peft_config"); the start
    adapter is now merged in, and adapter/, merged/ and the checkpoints all load with it."""
    import torch

    from toolschool.models.loading import load_model

    start = save_sft_like_adapter(tiny_model_dir, tmp_path / "start-adapter")
    train = _write(tmp_path / "train.jsonl", [_example(i, i + 3) for i in range(2, 8)])
    validation = _write(tmp_path / "validation.jsonl", [_example(20, 7)])
    config = _config(tmp_path, start, train, validation, num_steps=1, learning_rate=1e-9, validation_samples=0)
    result = train_sft(config, tmp_path / "sft", progress=False)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])

    def logits(model: object) -> torch.Tensor:
        with torch.no_grad():
            return load_model(str(model), device="cpu", dtype="fp32").model(ids).logits

    expected = logits(start)
    assert (expected - logits(tiny_model_dir)).abs().max() > 0.1
    for saved in (result.merged_dir, result.adapter_dir, latest_checkpoint(tmp_path / "sft")):
        assert torch.allclose(logits(saved), expected, atol=1e-4), saved


def test_lora_sft_runs_validates_saves_and_resumes(first_run, tiny_model_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from toolschool.models.loading import load_model

    tmp_path, train, validation, out, first = first_run
    assert first.steps == 2
    assert first.stats["validation_prompts_over_max_length"] == 0
    assert latest_checkpoint(out).name == "checkpoint-2"
    # A run killed after its last checkpoint (step 2) had already logged step 3; the resumed run redoes step 3.
    with (out / "train_log.jsonl").open("a") as handle:
        handle.write(json.dumps({"step": 3, "loss": 99.0, "tokens_represented": 1e9}) + "\n")
    # Continue the same run to step 4: starts at step 2, not from scratch.
    result = train_sft(_config(tmp_path, tiny_model_dir, train, validation), out, resume=True, progress=False)
    assert result.steps == 4
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    starts = [r for r in log if r.get("event") == "start"]
    assert [s["step"] for s in starts] == [0, 2]
    losses = [r for r in log if "loss" in r]
    assert [r["step"] for r in losses] == [1, 2, 3, 4]  # one record per step: the lost step-3 record is gone
    assert all(r["loss"] != 99.0 for r in losses)
    # Resuming a finished run (or one stopped while saving its final model) trains nothing more: the HF Trainer
    # alone would run a step past num_steps. It saves the final model again from the last checkpoint.
    (out / "merged" / "model.safetensors").unlink()
    again = train_sft(_config(tmp_path, tiny_model_dir, train, validation), out, resume=True, progress=False)
    assert again.steps == 4 and latest_checkpoint(out).name == "checkpoint-4"
    assert (out / "merged" / "model.safetensors").is_file()
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    losses = [r for r in log if "loss" in r]
    assert [r["step"] for r in losses] == [1, 2, 3, 4]
    assert [(r["step"], r.get("trained", True)) for r in log if r.get("event") == "start"] == [
        (0, True),
        (2, True),
        (4, False),
    ]
    saved = load_file(out / "adapter" / "adapter_model.safetensors")
    at_checkpoint = load_file(out / "checkpoints" / "checkpoint-4" / "adapter_model.safetensors")
    assert saved.keys() == at_checkpoint.keys() and all(torch.equal(saved[k], at_checkpoint[k]) for k in saved)
    # Token counts are totals since step 0: they go on from the checkpoint's, not from zero.
    for key in ("tokens_run", "tokens_represented", "tokens_computed", "num_tokens"):
        counts = [r[key] for r in losses]
        assert counts == sorted(counts) and len(set(counts)) == 4, (key, counts)
    validations = [r["validation"] for r in log if "validation" in r]
    assert validations and "well_formed" in validations[-1]
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (result.adapter_dir / "adapter_config.json").is_file()
    merged = load_model(str(result.merged_dir), dtype="fp32")
    adapter = load_model(str(result.adapter_dir), dtype="fp32")
    assert merged.num_parameters == load_model(str(tiny_model_dir), dtype="fp32").num_parameters
    assert adapter.adapter == str(result.adapter_dir)


def test_two_processes_with_accelerate(tmp_path: Path, tiny_model_dir: Path, data_files, tokenizer) -> None:
    """The same command under `accelerate launch`: 2 CPU processes (gloo) for a few steps."""
    from toolschool.chat.formats import get_format

    train, validation = data_files
    out = tmp_path / "ddp"
    # `accelerate launch --cpu --num_processes 2` starts ONE process (its CPU launcher needs mpirun for more);
    # the multi-process launcher (torchrun) with no visible GPU runs 2 CPU processes over gloo.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "toolschool",
        "sft",
        "--model",
        str(tiny_model_dir),
        "--train",
        str(train),
        "--num-steps",
        "2",
        "--batch-size",
        "2",
        "--max-length",
        "384",
        "--lora-rank",
        "4",
        "--validation-samples",
        "0",
        "--log-interval",
        "1",
        "--checkpoint-interval",
        "2",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "adapter" / "adapter_config.json").is_file()
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert any(r.get("step") == 2 for r in log)
    assert proc.stderr.count("sft: ") == 2  # each process announces itself: there really were two
    assert proc.stdout.count('"out_dir"') == 1  # one summary, from the main process
    assert json.loads((out / "summary.json").read_text())["adapter"] == str(out / "adapter")
    assert [r["event"] for r in log if "event" in r] == ["start", "end"]  # written once, by the main process
    # Token counts cover both processes: 2 steps x 2 processes x 2 rows = 8 rows, not the main process's 4.
    examples = [json.loads(line) for line in train.read_text().splitlines()]
    lengths = sorted(len(r["input_ids"]) for r in prepare_examples(examples, get_format("hermes"), tokenizer, 384).rows)
    at_step_2 = next(r for r in log if r.get("step") == 2 and "tokens_represented" in r)
    assert at_step_2["tokens_represented"] >= sum(lengths[:8]), (at_step_2, lengths)


def test_refused_or_failed_sft_leaves_the_runs_config_alone(tmp_path: Path, tiny_model_dir: Path, data_files) -> None:
    """config.toml records what a run was trained with; a command that stops before training must not replace it."""
    from typer.testing import CliRunner

    from toolschool.cli import app

    train, _ = data_files
    out = tmp_path / "run"
    (out / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (out / "config.toml").write_text("# the run's own settings\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(train.read_text().splitlines()[0] + "\n{not json\n")
    base = ["sft", "--model", str(tiny_model_dir), "--out", str(out), "--num-steps", "9", "--validation-samples", "0"]
    refused = CliRunner().invoke(app, [*base, "--train", str(train)])
    assert refused.exit_code == 2 and "already holds checkpoints" in refused.output
    broken = CliRunner().invoke(app, [*base, "--train", str(bad), "--resume"])
    assert broken.exit_code == 2 and "bad.jsonl:2: not valid JSON" in broken.output
    assert (out / "config.toml").read_text() == "# the run's own settings\n"


def test_resume_without_checkpoints_says_it_starts_at_step_0(tmp_path: Path, tiny_model_dir: Path, data_files) -> None:
    """`--resume` into a folder with no checkpoint (a typo in --out, say) trains from scratch, and says so, with
    the path whole however long it is (stderr is not wrapped at 80 columns either: a log kept it in two pieces)."""
    from typer.testing import CliRunner

    from toolschool.cli import app

    train, _ = data_files
    out = tmp_path / ("a-long-folder-name-" * 5) / "typo"
    args = ["sft", "--model", str(tiny_model_dir), "--train", str(train), "--out", str(out), "--resume"]
    result = CliRunner().invoke(app, [*args, "--num-steps", "1", "--batch-size", "2", "--validation-samples", "0"])
    assert result.exit_code == 0, result.output
    assert f"no checkpoint in {out / 'checkpoints'}: starting at step 0" in result.output


def test_training_arguments_raise_no_deprecation_warning(tmp_path: Path, tiny_model_dir: Path, data_files) -> None:
    """`sft.gradient_checkpointing` reaches transformers under its current name (`activation_checkpointing`): the
    old keyword printed a FutureWarning at the start of every SFT run, the first thing a user saw of training."""
    import warnings

    train, validation = data_files
    config = _config(tmp_path, tiny_model_dir, train, validation, num_steps=1, validation_samples=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_sft(config, tmp_path / "out", progress=False)
    assert not [w for w in caught if "`gradient_checkpointing` is deprecated" in str(w.message)]
