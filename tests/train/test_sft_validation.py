"""SFT: validation scores like evaluation, shared-prefix edge cases, labels in every batching mode."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import CALC
from train_helpers import _config, _example, _lora_model, _write, train_sft

from toolschool.chat.formats import get_format
from toolschool.train.sft import build_validation_items, prepare_examples, validate


def _direct_answer(question: str, answer: str, expected: str) -> dict[str, Any]:
    """A line whose first assistant turn answers without a tool (the gold is a sentence, meta the answer)."""
    return {
        "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
        "tools": [copy.deepcopy(CALC)],
        "meta": {"source": "test", "expected_answer": expected},
    }


class _Canned:
    """A backend answering each conversation with the reply given for its user question."""

    name = "canned"

    def __init__(self, replies: dict[str, str]) -> None:
        self.replies = replies  # without the format's prefill, as the local backend returns a reply

    async def generate(self, request: Any) -> list[Any]:
        from toolschool.models.backend import Completion

        question = next(m["content"] for m in request.messages if m["role"] == "user")
        return [Completion(text=self.replies[question])]


def _eval_metrics(examples: list[dict[str, Any]], replies: dict[str, str], fmt_name: str) -> dict[str, float]:
    from toolschool.evaluate.items import item_from_example
    from toolschool.evaluate.metrics import aggregate
    from toolschool.evaluate.runner import EvalOptions, evaluate_items

    items = [item_from_example(example, i) for i, example in enumerate(examples)]
    backend = _Canned(replies)
    results = asyncio.run(evaluate_items(backend, items, EvalOptions(format=fmt_name)))  # type: ignore[arg-type]
    return aggregate([r.score for r in results])


def _validation_metrics(
    examples: list[dict[str, Any]], replies: dict[str, str], fmt_name: str, tokenizer: Any, monkeypatch: Any
) -> dict[str, float]:
    import toolschool.train.validation as validation

    fmt = get_format(fmt_name)
    items = build_validation_items(examples, fmt, tokenizer, len(examples), 512)
    questions = [next(m["content"] for m in e["messages"] if m["role"] == "user") for e in examples]
    answers = iter([replies[q] for q in questions])

    def canned_generation(model, tokenizer, requests, max_batch_size):  # noqa: ANN001, ANN202
        return [next(answers) for _ in requests]

    monkeypatch.setattr(validation, "generate_replies", canned_generation)
    return validate(torch.nn.Linear(1, 1), tokenizer, fmt, items, max_new_tokens=8)


@pytest.mark.parametrize(
    ("fmt_name", "converted"), [("hermes", False), ("json", False), ("react", False), ("json", True), ("react", True)]
)
def test_validation_scores_a_reply_as_evaluation_does(fmt_name: str, converted: bool, tokenizer, monkeypatch) -> None:
    """Validation "logs ... the same metric code as evaluation": the same replies to the same lines must give the
    same rates. A direct answer used to be matched against the gold turn's whole sentence ("12 * 34 = 408."),
    so "408" counted as wrong in training while `toolschool eval` (which reads meta.expected_answer) counted it
    right; lines already written in a text format (meta.format) were read another way too."""
    from toolschool.data.records import example_to_format

    fmt = get_format(fmt_name)
    examples = [
        _direct_answer("What is 12 * 34?", "12 * 34 = 408.", "408"),
        _direct_answer("What is the capital of France?", "The capital of France is Paris.", "Paris"),
        _direct_answer("Say hi.", "Hi there!", "Hi there!"),
        _example(5, 6),
    ]
    replies = {
        "What is 12 * 34?": _reply(fmt, "It is 408."),
        "What is the capital of France?": _reply(fmt, "Paris."),
        "Say hi.": _reply(fmt, "Hello."),
        "What is 5 * 6?": _call_reply(fmt, examples[3]),
    }
    if converted:
        examples = [example_to_format(e, fmt_name) for e in examples]
    want = _eval_metrics(examples, replies, fmt_name)
    got = _validation_metrics(examples, replies, fmt_name, tokenizer, monkeypatch)
    assert want["answer_accuracy"] == pytest.approx(2 / 3)
    assert got == want


def _reply(fmt: Any, answer: str) -> str:
    """The text a model writes (after the format's prefill) to answer without a tool."""
    message = {"role": "assistant", "content": answer}
    messages, _ = fmt.to_messages([{"role": "user", "content": "q"}, message], None)
    return messages[-1]["content"].removeprefix(fmt.prefill)


def _call_reply(fmt: Any, example: dict[str, Any]) -> str:
    messages, _ = fmt.to_messages(example["messages"][:2], example["tools"])
    content = messages[-1].get("content") or ""
    if fmt.name == "hermes":
        import json

        call = example["messages"][1]["tool_calls"][0]["function"]
        return f"<tool_call>\n{json.dumps({'name': call['name'], 'arguments': call['arguments']})}\n</tool_call>"
    return content.removeprefix(fmt.prefill)


def _keep(prepared_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(r) for r in prepared_rows]


def _reference(model: Any, rows: list[dict[str, Any]]) -> torch.Tensor:
    total, count = torch.zeros(()), 0
    for row in rows:
        logits = model(input_ids=torch.tensor([row["input_ids"]])).logits[0, :-1]
        targets = torch.tensor(row["labels"][1:])
        total = total + torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")
        count += int((targets != -100).sum())
    return total / count


@pytest.fixture(scope="module")
def lora_model(tiny_model_dir: Path):
    return _lora_model(tiny_model_dir)


def _with_system(example: dict[str, Any], text: str) -> dict[str, Any]:
    return {**example, "messages": [{"role": "system", "content": text}, *example["messages"]]}


def _edge_batch(case: str, tokenizer: Any) -> list[dict[str, Any]]:
    fmt = get_format("hermes")
    full = prepare_examples([_example(3, 4)], fmt, tokenizer, 4096).rows
    if case == "a batch of one":
        return full
    if case == "system blocks one token apart":
        pair = [_with_system(_example(3, 4), "Be brief."), _with_system(_example(5, 6), "Be brief!")]
        return prepare_examples(pair, fmt, tokenizer, 4096).rows
    if case == "cut inside an assistant turn, beside a whole row":
        first_label = next(i for i, lab in enumerate(full[0]["labels"]) if lab != -100)
        cut = prepare_examples([_example(3, 4), _example(7, 8)], fmt, tokenizer, first_label + 3)
        assert cut.truncated == 2 and all(sum(lab != -100 for lab in r["labels"]) == 3 for r in cut.rows)
        return [*cut.rows, *full]
    assert case == "no two rows share a prefix"
    return prepare_examples([_with_system(_example(i, 2), f"System {i}.") for i in range(3)], fmt, tokenizer, 4096).rows


@pytest.mark.parametrize(
    "case",
    [
        "a batch of one",
        "system blocks one token apart",
        "cut inside an assistant turn, beside a whole row",
        "no two rows share a prefix",
    ],
)
def test_shared_prefix_equals_rows_alone_in_edge_cases(case: str, lora_model, tokenizer) -> None:
    from toolschool.engine.shared_prefix_sft import SharedPrefixCollator, shared_prefix_loss_sum

    rows = _edge_batch(case, tokenizer)
    params = [p for p in lora_model.parameters() if p.requires_grad]
    reference = _reference(lora_model, rows)
    want = torch.autograd.grad(reference, params)
    batch = SharedPrefixCollator(tokenizer.pad_token_id)(_keep(rows))
    distinct = {tuple(r["input_ids"][: r["prefix_length"]]) for r in rows}
    assert batch["prefix_ids"].shape[0] == len(distinct)
    loss_sum, count = shared_prefix_loss_sum(lora_model, batch)
    got = torch.autograd.grad(loss_sum / count, params)
    assert (loss_sum / count).item() == pytest.approx(reference.item(), rel=1e-5)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_max_length_inside_the_system_block_drops_and_counts_the_example(tokenizer) -> None:
    prepared = prepare_examples([_example(3, 4)], get_format("hermes"), tokenizer, 50)
    assert (prepared.truncated, prepared.dropped_no_assistant_after_truncation, prepared.rows) == (1, 1, [])


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            '[lora]\ntarget_modules = ["q_proj", "vproj"]',
            "lora.target_modules: 'vproj' names no module of the model",
        ),
        ('[lora]\ntarget_modules = ["all-linear", "lm_head"]', "lora.target_modules: 'all-linear' names no module"),
        ('[sft]\nlr_scheduler = "cosin"', "sft.lr_scheduler = 'cosin' is not a transformers scheduler"),
    ],
)
def test_settings_peft_or_transformers_reject_are_one_line(
    setting: str, message: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A misspelt LoRA target or scheduler name ended in PEFT's / transformers' traceback (exit 1) after the run's
    config.toml had been replaced; a target matching nothing beside one that matches was silently not trained."""
    from typer.testing import CliRunner

    from toolschool.cli import app

    train = _write(tmp_path / "train.jsonl", [_example(i, i + 3) for i in range(2, 6)])
    run_toml = tmp_path / "run.toml"
    run_toml.write_text(f"{setting}\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.toml").write_text("# the run's own settings\n")
    args = ["sft", str(run_toml), "--model", str(tiny_model_dir), "--train", str(train), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--num-steps", "1", "--batch-size", "2", "--validation-samples", "0"])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert (out / "config.toml").read_text() == "# the run's own settings\n"


def test_warmup_and_lora_alpha_and_targets_are_flags_too(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Issue 7: LoRA rank, alpha, dropout, target modules, learning rate and warm-up are settings "TOML and flags";
    alpha, target modules and warm-up had no flag. They reach PEFT's adapter_config.json and the run's config."""
    import json
    import tomllib

    from typer.testing import CliRunner

    from toolschool.cli import app

    train = _write(tmp_path / "train.jsonl", [_example(i, i + 3) for i in range(2, 6)])
    out = tmp_path / "out"
    args = ["sft", "--model", str(tiny_model_dir), "--train", str(train), "--out", str(out), "--num-steps", "1"]
    args += ["--batch-size", "2", "--validation-samples", "0", "--lora-rank", "3", "--lora-dropout", "0.1"]
    args += ["--lora-alpha", "5", "--target-modules", "q_proj", "--target-modules", "v_proj", "--warmup-steps", "7"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"], adapter["lora_dropout"]) == (3, 5, 0.1)
    assert sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert tomllib.loads((out / "config.toml").read_text())["sft"]["warmup_steps"] == 7


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path):
    tmp_path = tmp_path_factory.mktemp("sft-resume-settings")
    train = _write(tmp_path / "train.jsonl", [_example(i, i + 3) for i in range(2, 10)])
    out = tmp_path / "sft"

    train_sft(_config(tmp_path, tiny_model_dir, train, train, num_steps=2, validation_samples=0), out, progress=False)
    return tmp_path, train, out


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"lora_rank": 8}, "lora.rank: 4 → 8"),  # was PEFT's "Error(s) in loading state_dict"
        ({"method": "full"}, 'sft.method: "lora" → "full"'),  # was "Can't find a checkpoint index"
        ({"toolkens": True}, "model.toolkens: false → true"),  # was KeyError 'base_model.model.model.embed_tokens'
        ({"batch_size": 3}, "sft.batch_size: 2 → 3"),  # trained on, with another data order
        ({"format": "json", "max_length": 300}, 'model.format: "hermes" → "json"; sft.max_length: 256 → 300'),
        ({"batching": "padded"}, 'sft.batching: "shared_prefix" → "padded"'),
    ],
)
def test_resume_with_settings_that_change_the_checkpoint_or_data_order_is_refused(
    change: dict[str, Any], named: str, two_step_run, tiny_model_dir: Path
) -> None:
    """`--resume` "continues at the same step with the same data order": with another batch size, format,
    max_length or batching the skipped batches are other batches (it trained on silently); another LoRA rank,
    method or toolkens setting cannot load the checkpoint (it died in PEFT/transformers with a traceback)."""
    import shutil

    from toolschool.errors import ToolschoolError

    tmp_path, train, out = two_step_run
    copy_dir = tmp_path / ("copy-" + "-".join(change))
    shutil.copytree(out, copy_dir)
    meta_before = (copy_dir / "toolschool_sft.json").read_text()
    config = _config(tmp_path, tiny_model_dir, train, train, num_steps=4, validation_samples=0, **change)
    with pytest.raises(
        ToolschoolError, match=r"the checkpoints in .* \(trained from .*\) ran with other settings"
    ) as info:
        train_sft(config, copy_dir, resume=True, progress=False)
    assert named in str(info.value)
    assert (copy_dir / "toolschool_sft.json").read_text() == meta_before


def test_resume_may_train_longer_with_another_rate_or_interval(two_step_run, tiny_model_dir: Path) -> None:
    import shutil

    tmp_path, train, out = two_step_run
    copy_dir = tmp_path / "longer"
    shutil.copytree(out, copy_dir)
    config = _config(
        tmp_path, tiny_model_dir, train, train, num_steps=3, validation_samples=0, learning_rate=1e-3, log_interval=3
    )
    assert train_sft(config, copy_dir, resume=True, progress=False).steps == 3


def _scripted(model: Any, script: list[int], prompt_length: int) -> Any:
    """`model`, made to reply `script` greedily to a prompt of `prompt_length` tokens: its logits are replaced by
    ones that pick the script's next token, read from the position ids the local backend passes."""
    cls = type(model)

    def forward(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        out = cls.forward(self, *args, **kwargs)
        logits = torch.full_like(out.logits[:, -1:, :], -1e9)
        for row, step in enumerate((kwargs["position_ids"][:, -1] + 1 - prompt_length).tolist()):
            logits[row, 0, script[min(step, len(script) - 1)]] = 0.0
        out.logits = logits
        return out

    model.__class__ = type("Scripted", (cls,), {"forward": forward})
    return model


def test_validation_stops_at_the_end_of_turn_like_the_backend_when_eos_is_another_token(
    tiny_model_dir: Path,
) -> None:
    """A tokenizer whose eos is not the chat template's end-of-turn token (a base model given a ChatML
    template: eos <|endoftext|>, turns end with <|im_end|>). Evaluation's local backend stops at <|im_end|>;
    validation passed only the eos, generated past the end of the turn and parsed the next turn's text as part
    of the reply (<|im_end|> itself removed by skip_special_tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.eos_token = "<|endoftext|>"
    assert tok.eos_token_id != tok.convert_tokens_to_ids("<|im_end|>")
    example = _example(5, 6)
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "5 * 6"}}\n</tool_call>'
    script = tok.encode(call, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    script += tok.encode("\n<tool_call>\n{not json", add_special_tokens=False)
    fmt = get_format("hermes")
    items = build_validation_items([example], fmt, tok, 1, 512)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.generation_config.eos_token_id = None  # only the chat template's <|im_end|> ends the turn
    model = _scripted(model, script, len(items[0].prompt_ids))
    metrics = validate(model, tok, fmt, items, max_new_tokens=len(script))
    assert (metrics["well_formed"], metrics["correct"]) == (1.0, 1.0)


def test_a_killed_run_resumed_ends_with_the_same_losses_schedule_and_adapter(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch
) -> None:
    """Killed after logging step 4 (its last checkpoint is step 3), resumed: the same per-step losses and learning
    rates (cosine with warm-up, LoRA dropout on, so the restored RNG matters) and bit-identical final adapter
    weights as a run that was never stopped, across an epoch boundary (8 examples of 2 prefixes, batches of 2)."""
    import json

    from safetensors.torch import load_file
    from transformers import TrainerCallback

    import toolschool.train.sft as sft

    class Killed(Exception):
        pass

    class KillAfterLogging(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003
            if state.global_step == 4 and "loss" in (logs or {}):
                raise Killed

    examples = [_example(i, i + 3) for i in range(2, 6)] + [_with_system(_example(i, 5), "S.") for i in range(6, 10)]
    train = _write(tmp_path / "train.jsonl", examples)
    settings = {"num_steps": 5, "checkpoint_interval": 3, "validation_samples": 0, "lora_dropout": 0.1}
    settings |= {"learning_rate": 1e-2, "warmup_steps": 2, "lr_scheduler": "cosine"}

    def run(out: Path, *, resume: bool = False) -> None:
        train_sft(_config(tmp_path, tiny_model_dir, train, train, **settings), out, resume=resume, progress=False)

    run(tmp_path / "straight")
    make_callbacks = sft._make_callbacks
    monkeypatch.setattr(sft, "_make_callbacks", lambda *a, **k: [*make_callbacks(*a, **k), KillAfterLogging()])
    with pytest.raises(Killed):
        run(tmp_path / "killed")
    monkeypatch.setattr(sft, "_make_callbacks", make_callbacks)
    assert sorted(p.name for p in (tmp_path / "killed" / "checkpoints").glob("checkpoint-*")) == ["checkpoint-3"]
    run(tmp_path / "killed", resume=True)

    def curve(out: Path) -> list[tuple[int, float, float]]:
        log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"], r["learning_rate"]) for r in log if "loss" in r]

    assert [s for s, _, _ in curve(tmp_path / "straight")] == [1, 2, 3, 4, 5]
    assert curve(tmp_path / "killed") == curve(tmp_path / "straight")
    want = load_file(tmp_path / "straight" / "adapter" / "adapter_model.safetensors")
    got = load_file(tmp_path / "killed" / "adapter" / "adapter_model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_examples_cut_at_max_length_are_announced_before_training() -> None:
    """The default max_length 512 cuts most calc/python rows; the count was only in the log and the summary."""
    from toolschool.train.sft import truncation_warning

    assert truncation_warning({"examples": 36, "truncated": 0}, 512) is None
    assert truncation_warning({"examples": 36, "truncated": 22, "dropped_no_assistant_after_truncation": 7}, 512) == (
        "22 of 36 training examples are longer than max_length = 512 and were cut (7 of them kept no assistant "
        "token and are left out); raise --max-length to train on them whole ([sft] max_length in the config)"
    )


def test_toolkens_on_lines_already_written_in_a_text_format_are_refused(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`--toolkens` renames tool_calls; a json/react line holds its calls as text, so no token was added and the
    run trained without toolkens, silently."""
    from typer.testing import CliRunner

    from toolschool.cli import app

    line = _example(2, 5)
    line["meta"] = {"format": "json"}
    train = _write(tmp_path / "train.jsonl", [line])
    args = ["sft", "--model", str(tiny_model_dir), "--train", str(train), "--toolkens", "--format", "json"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"--toolkens needs canonical lines, but {train}:1 is written in the json format" in " ".join(
        result.output.split()
    )
