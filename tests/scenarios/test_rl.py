"""End-to-end RL scenarios as a TRL user runs them: resume, multi-process runs, stage hand-offs, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import answer_example, calc_example, read_log, rl_config, train_rl, write_jsonl

from toolschool.errors import ToolschoolError


@pytest.fixture()
def train_file(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "train.jsonl",
        [calc_example(12, 34), calc_example(7, 8), answer_example(), calc_example(3, 9), calc_example(5, 6)],
    )


def test_resume_with_settings_the_checkpoint_or_data_order_depend_on_is_refused(
    tiny_model_dir: Path, train_file: Path, tmp_path: Path
) -> None:
    """Another LoRA rank cannot load the checkpoint (PEFT died with a size mismatch), and another batch size, group
    size, seed or format silently trained on other prompts than a straight run: each is refused by name, as SFT
    does; a longer run with another learning rate still resumes. A start model trained again in place (`toolschool
    sft` into the same folder) is refused as other weights: the message read "come from 'X' ..., not 'X' ..."."""
    import shutil

    from helpers import save_tiny_llama

    start = tmp_path / "sft-merged"
    shutil.copytree(tiny_model_dir, start)
    out = tmp_path / "rl"
    train_rl(rl_config(start, train_file, num_steps=1, max_tokens=4, merge=False), out, progress=False)
    log_before = (out / "train_log.jsonl").read_text()
    changes = {
        "lora_rank": (8, "lora.rank: 32 → 8"),
        "batch_size": (6, "rl.batch_size: 4 → 6"),
        "num_generations": (4, "rl.num_generations: 2 → 4"),
        "format": ("json", 'model.format: "hermes" → "json"'),
    }
    for key, (value, named) in changes.items():
        config = rl_config(start, train_file, num_steps=2, max_tokens=4, **{key: value})
        with pytest.raises(ToolschoolError) as refused:
            train_rl(config, out, resume=True, progress=False)
        assert named in str(refused.value), (key, str(refused.value))
        assert "config.toml" in refused.value.hint
    seeded = rl_config(start, train_file, num_steps=2, max_tokens=4)
    seeded.run.seed = 7
    with pytest.raises(ToolschoolError, match=r"run\.seed: 0 → 7"):
        train_rl(seeded, out, resume=True, progress=False)
    assert (out / "train_log.jsonl").read_text() == log_before  # nothing was trimmed or appended by the refusals

    resumed = train_rl(
        rl_config(start, train_file, num_steps=2, max_tokens=4, learning_rate=5e-4, merge=False),
        out,
        resume=True,
        progress=False,
    )
    assert resumed.steps == 2
    assert [r["step"] for r in read_log(out) if "reward" in r] == [1, 2]

    shutil.rmtree(start)
    save_tiny_llama(start, tiny_model_dir, seed=5)  # the same architecture and tokenizer, other weights
    with pytest.raises(ToolschoolError) as refused:
        train_rl(rl_config(start, train_file, num_steps=3, max_tokens=4), out, resume=True, progress=False)
    message = str(refused.value)
    assert f"(trained from '{start}') ran with other inputs: base model weights: " in message, message


def test_under_accelerate_only_the_main_process_ends_the_log_and_writes_the_summary(
    tiny_model_dir: Path, train_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`accelerate launch -m toolschool rl` runs this command in every process; only RANK 0 saves adapter/ and
    merged/. The other process wrote an "end" record into the shared log too and a summary.json saying there was
    no adapter and no merged model, racing the main process's. Here the process is told it is not the main one."""
    from typer.testing import CliRunner

    from toolschool.cli import app
    from toolschool.engine.shared_prompt_grpo import SharedPromptGRPOTrainer

    monkeypatch.setattr(SharedPromptGRPOTrainer, "is_world_process_zero", lambda self: False)
    out = tmp_path / "rl"
    args = ["rl", "--model", str(tiny_model_dir), "--train", str(train_file), "--out", str(out), "--steps", "1"]
    args += ["--batch-size", "4", "--num-generations", "2", "--max-tokens", "4", "--log-interval", "1", "--resume"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    # --resume with nothing to resume says so (as `toolschool sft` does) rather than starting over without a word
    assert "no checkpoint in" in result.output and "starting at step 0" in result.output
    assert not (out / "summary.json").exists()
    assert '"merged": null' not in result.output
    # the main process writes the log (here: nobody, as this process is told it is not the main one)
    assert not (out / "train_log.jsonl").exists()


def test_run_with_sft_data_of_its_own_and_no_distill_refuses_rl_data_before_sft_trains(
    tiny_model_dir: Path, train_file: Path, tmp_path: Path
) -> None:
    """stages = ["sft", "rl"] with `[sft] train` set: RL reads `[rl] train`, by default the run's distill/train.jsonl,
    which no stage of this run writes. The run trained SFT first and only then stopped, with a hint naming a
    `--train` flag that `toolschool run` does not have."""
    from toolschool.config import load_config
    from toolschool.pipeline import run_pipeline

    config = load_config(
        None,
        {
            "run.root": str(tmp_path / "runs"),
            "run.name": "own",
            "model.name": str(tiny_model_dir),
            "model.device": "cpu",
            "sft.train": str(train_file),
            "sft.num_steps": 1,
            "rl.batch_size": 4,
            "rl.num_generations": 2,
            "pipeline.stages": ["sft", "rl"],
        },
    )
    with pytest.raises(ToolschoolError) as refused:
        run_pipeline(config)
    assert "distill/train.jsonl" in str(refused.value) and "[rl] train" in refused.value.hint
    assert not (tmp_path / "runs" / "own" / "sft").exists()


def test_run_with_merge_off_hands_each_stage_the_adapter_it_saved(tmp_path: Path) -> None:
    """`[sft] merge = false` / `[rl] merge = false` save adapter/ only, which every command loads. The rl stage
    then stopped with "rl starts from the SFT model, but .../sft/merged does not exist" after SFT had run, and the
    eval stage silently left the model out of the comparison table."""
    from toolschool.config import load_config
    from toolschool.pipeline import eval_models, rl_model_dir, sft_model_dir

    config = load_config(
        None,
        {"run.root": str(tmp_path / "runs"), "run.name": "m", "sft.merge": False, "rl.merge": False},
    )
    run = tmp_path / "runs" / "m"
    for stage in ("sft", "rl"):
        (run / stage / "adapter").mkdir(parents=True)
        (run / stage / "adapter" / "adapter_config.json").write_text("{}")
    assert sft_model_dir(config) == run / "sft" / "adapter"
    assert dict(eval_models(config)) == {
        "base": config.model.name,
        "sft": str(run / "sft" / "adapter"),
        "sft+rl": str(run / "rl" / "adapter"),
    }
    (run / "rl" / "merged").mkdir()  # a merged model, where there is one, stays what is compared
    assert rl_model_dir(config) == run / "rl" / "merged"


def test_lines_already_written_in_a_text_format_are_prompted_once_and_rewarded_against_their_written_call(
    tokenizer,  # noqa: ANN001
) -> None:
    """`dataset build-calc-python` writes json/ and react/ files whose lines hold the format's instructions in the
    system message and the gold call as text (meta.format). RL converted them again (a second instruction block
    saying "no tools are available") and read the gold call as a direct answer: the right call scored tool -0.5
    and no arguments reward, answering without calling scored +0.5 — training the model away from its tools."""
    from toolschool.chat.formats import get_format
    from toolschool.data.records import example_to_format
    from toolschool.train.rewards import COMPONENTS, RewardSuite
    from toolschool.train.rl import build_single_turn_rows

    for name, right, direct in (
        ("json", '{"tool": "calculator", "args": {"expression": "12*34"}}', '{"final": "408"}'),
        ("react", ' I use it.\nAction: calculator\nAction Input: {"expression": "12*34"}', " x\nFinal Answer: 408"),
    ):
        fmt = get_format(name)
        written = example_to_format(calc_example(12, 34), name)
        (row,) = build_single_turn_rows([written], fmt, tokenizer, 4000, "x.jsonl")
        (canonical,) = build_single_turn_rows([calc_example(12, 34)], fmt, tokenizer, 4000, "x.jsonl")
        assert row["prompt"] == canonical["prompt"], name
        suite = RewardSuite(fmt, ["format", "tool", "arguments", "length"])
        scores = {}
        for reply in (right, direct):
            scored = suite.score([reply], [row["gold"]])[0]
            scores[reply] = [COMPONENTS[n](scored) for n in suite.names]
        assert scores[right] == [1.0, 0.5, 1.0, 0.0], (name, scores)
        assert scores[direct] == [1.0, -0.5, 0.0, 0.0], (name, scores)


def test_lines_written_in_another_format_than_rl_uses_are_refused_with_their_line(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from toolschool.data.records import example_to_format
    from toolschool.errors import DataError

    train = write_jsonl(tmp_path / "json.jsonl", [example_to_format(calc_example(2, 3), "json")] * 2)
    with pytest.raises(DataError) as refused:
        train_rl(rl_config(tiny_model_dir, train), tmp_path / "rl", progress=False)
    assert f"{train}:1" in str(refused.value) and "'json' format" in str(refused.value)
    assert "--format json" in refused.value.hint
    assert not (tmp_path / "rl").exists()


def test_multi_turn_keeps_the_argument_types_the_model_wrote_as_evaluation_does(tokenizer) -> None:  # noqa: ANN001
    """TRL's response parser types each argument by the tool's schema ("7" becomes 7 for an integer), so a rollout
    writing `"days": "7"` ran date_add and was rewarded, while `toolschool eval --execute` runs the call as written
    and the tool refuses it ("'7' is not of type 'integer'"): RL rewarded what evaluation counts as a failed call."""
    import copy

    from trl.trainer.grpo_trainer import parse_response

    from toolschool.tools.registry import build_registry
    from toolschool.train.rl import _set_response_parser, tool_callable

    tok = copy.deepcopy(tokenizer)
    _set_response_parser(tok)
    registry = build_registry(only=["date_add"])
    try:
        tools = [tool_callable(registry.get("date_add"))]
        prefix = tok.apply_chat_template(
            [{"role": "user", "content": "What date is 7 days after 2024-01-01?"}],
            tools=tools,
            tokenize=True,
            add_generation_prompt=True,
            return_dict=False,
        )
        text = '<tool_call>\n{"name": "date_add", "arguments": {"date": "2024-01-01", "days": "7"}}\n</tool_call>'
        ids = tok(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
        call = parse_response(tok, ids, prefix=prefix, tools=tools)["tool_calls"][0]["function"]
        assert call["arguments"] == {"date": "2024-01-01", "days": "7"}
        observation = tools[0](**call["arguments"])  # what TRL's tool loop runs
        assert observation == registry.call("date_add", {"date": "2024-01-01", "days": "7"}).text
        assert "is not of type 'integer'" in observation
    finally:
        registry.close()


def test_run_with_rl_but_no_sft_model_is_refused_before_the_first_stage(tmp_path: Path) -> None:
    """The rl stage starts from the SFT stage's model; with "sft" left out of [pipeline] stages and no SFT model in
    the run folder, the run distilled (or explored, for hours) and only then stopped at the rl stage."""
    from pipeline_helpers import _trial

    from toolschool.config import load_config
    from toolschool.pipeline import run_pipeline

    config = load_config(
        None,
        {
            "run.root": str(tmp_path / "runs"),
            "run.name": "nosft",
            "tools.only": ["calculator"],
            "rl.batch_size": 4,
            "rl.num_generations": 2,
            "pipeline.stages": ["distill", "rl"],
        },
    )
    explore = config.run_dir() / "explore"
    explore.mkdir(parents=True)
    (explore / "trials.jsonl").write_text("".join(json.dumps(_trial(i, 12 + i, 31)) + "\n" for i in range(8)))
    with pytest.raises(ToolschoolError) as refused:
        run_pipeline(config)
    assert "sft" in str(refused.value) and "[pipeline] stages" in refused.value.hint
    assert not (config.run_dir() / "distill").exists()
