"""Scenario: a user who drives every stage from one run TOML plus flags.

What is checked end to end: a bad value in the TOML is refused by `toolschool config show` and by `toolschool run`
before the first stage runs, with one line naming the file, the key and the value; TOML values keep their types
(no silent coercion); settings that must agree between stages do.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.config import load_config
from toolschool.errors import ConfigError

runner = CliRunner()


def _write(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _refused(args: list[str]) -> str:
    """The one error line of a refused command (exit 2, no traceback)."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


# ------------------------------------------------------------------------------------------------ choice keys

CHOICES = [
    ("model", "format", "xml", "hermes, json, react"),
    ("explore", "format", "chatml", "hermes, json, react"),
    ("sft", "method", "qlora", "lora, full"),
    ("rl", "method", "qlora", "lora, full"),
    ("sft", "dtype", "fp16", "fp32, bf16"),
    ("rl", "dtype", "fp16", "fp32, bf16"),
    ("model", "dtype", "fp8", "auto, bf16, fp16, fp32"),
    ("eval", "arguments", "fuzzy", "exact, semantic"),
    ("eval", "retriever", "tfidf", "bm25, dense"),
]


@pytest.mark.parametrize(("section", "key", "value", "expected"), CHOICES)
def test_config_show_refuses_a_value_no_stage_accepts(tmp_path, section, key, value, expected) -> None:
    """`config show` said these were fine; `toolschool run` then explored and distilled before the stage refused."""
    path = _write(tmp_path, f'[{section}]\n{key} = "{value}"\n')
    line = _refused(["config", "show", str(path)])
    assert f"{path}: '{section}.{key}' = '{value}'" in line
    assert expected in line


def test_config_show_refuses_an_unknown_pipeline_stage(tmp_path) -> None:
    path = _write(tmp_path, '[pipeline]\nstages = ["explore", "train"]\n')
    line = _refused(["config", "show", str(path)])
    assert "unknown stage(s) train" in line and "explore, distill, sft, rl, eval, report" in line


def test_choice_keys_accept_any_case_and_store_the_canonical_name(tmp_path) -> None:
    text = '[model]\nformat = "JSON"\n[sft]\nmethod = "LoRA"\n[eval]\narguments = "Exact"\n'
    config = load_config(_write(tmp_path, text))
    assert (config.model.format, config.sft.method, config.eval.arguments) == ("json", "lora", "exact")


def test_a_bad_flag_value_is_named_as_a_flag(tmp_path) -> None:
    with pytest.raises(ConfigError, match="command-line flag: 'sft.method' = 'qlora' — expected one of: lora, full"):
        load_config(None, {"sft.method": "qlora"})


# ------------------------------------------------------------------------------------------------ types


@pytest.mark.parametrize(
    ("line", "key", "expected"),
    [
        ("[sft]\nbatch_size = true\n", "sft.batch_size", "an integer"),
        ('[sft]\nbatch_size = "8"\n', "sft.batch_size", "an integer"),
        ("[lora]\nrank = 3.0\n", "lora.rank", "an integer"),
        ('[model]\ntoolkens = "yes"\n', "model.toolkens", "true or false"),
        ("[explore]\nforce_call = 1\n", "explore.force_call", "true or false"),
        ('[rl]\nlearning_rate = "1e-5"\n', "rl.learning_rate", "a number"),
    ],
)
def test_toml_values_of_the_wrong_type_are_refused_not_coerced(tmp_path, line, key, expected) -> None:
    """`batch_size = true` trained with batches of 1 and `toolkens = "yes"` turned toolkens on, silently."""
    path = _write(tmp_path, line)
    message = _refused(["config", "show", str(path)])
    assert f"{path}: '{key}'" in message and f"expected {expected}" in message


def test_an_integer_for_a_float_key_is_still_a_number(tmp_path) -> None:
    config = load_config(_write(tmp_path, "[sft]\nlearning_rate = 1\n[distill]\ndedupe_threshold = 1\n"))
    assert config.sft.learning_rate == 1.0 and config.distill.dedupe_threshold == 1.0


# ------------------------------------------------------------------------------------------------ --help


def _help(args: list[str]) -> str:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "section"), [(["distill"], "[distill]"), (["dataset", "build-calc-python"], "[dataset]")]
)
def test_help_names_the_toml_section_the_command_reads(args, section) -> None:
    """Rich read "[distill]" in the help text as a style tag and printed "Run TOML ()"."""
    assert f"Run TOML ({section}); flags override it." in _help(args)


def _readme_command_examples() -> list[tuple[list[str], str]]:
    """(command path, example line) for each command line of docs/pipeline.md's "## Every command, by example"."""
    import re
    import shlex

    page = (Path(__file__).resolve().parents[2] / "docs" / "pipeline.md").read_text(encoding="utf-8")
    block = page.split("## Every command, by example", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    examples = []
    for line in block.splitlines():
        for command in line.split("; "):
            command = re.sub(r"\s+#.*$", "", command).strip()
            words = shlex.split(command)
            if len(words) < 2 or words[1].startswith("-"):
                continue  # `toolschool --version`
            path = words[1:3] if words[1] in ("dataset", "tools", "models", "config") else words[1:2]
            examples.append((path, command))
    return examples


@pytest.mark.parametrize(
    ("path", "example"), _readme_command_examples(), ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_every_command_help_shows_the_readme_example(path, example) -> None:
    """`toolschool sft --help` (and every other command's) listed flags without one example of using them."""
    shown = _help(path)
    assert "Examples" in shown
    assert " ".join(example.split()) in shown


# ------------------------------------------------------------------------------------------------ input files

MISSING_INPUTS = [
    ("distill", "trials", "[distill] trials"),
    ("sft", "train", "[sft] train"),
    ("sft", "validation", "[sft] validation"),
    ("rl", "train", "[rl] train"),
    ("pipeline", "eval_data", "[pipeline] eval_data"),
]


@pytest.mark.parametrize(("section", "key", "named"), MISSING_INPUTS)
def test_an_input_file_that_does_not_exist_is_refused_before_the_first_stage(tmp_path, section, key, named) -> None:
    """`[pipeline] eval_data` (or `[sft] train`, ...) naming no file was found only when its stage started: after
    exploring, distilling and training, hours into a run on a CPU."""
    from toolschool.pipeline import run_pipeline

    missing = tmp_path / "nowhere" / "data.jsonl"
    path = _write(tmp_path, f'[run]\nroot = "{tmp_path / "runs"}"\n[{section}]\n{key} = "{missing}"\n')
    line = _refused(["config", "show", str(path)])
    assert f"{named} = '{missing}' does not exist" in line
    with pytest.raises(ConfigError, match="does not exist"):
        run_pipeline(load_config(path))
    assert not (tmp_path / "runs").exists()  # no stage ran


def test_icl_without_demonstrations_is_refused_before_the_first_stage(tmp_path) -> None:
    path = _write(tmp_path, "[eval]\nicl = 3\n")
    assert "[eval] icl = 3 needs [eval] demos" in _refused(["config", "show", str(path)])


def test_input_files_an_earlier_stage_writes_or_a_stage_that_does_not_run_are_not_required(tmp_path) -> None:
    from toolschool.pipeline import check_input_files

    inside = tmp_path / "runs" / "default" / "distill" / "train.jsonl"  # distill writes it during the run
    config = load_config(
        _write(tmp_path, f'[run]\nroot = "{tmp_path / "runs"}"\n[rl]\ntrain = "{inside}"\n[sft]\ntrain = "/no/such"\n')
    )
    check_input_files(config, ["explore", "distill", "rl"])  # sft is not run
    with pytest.raises(ConfigError, match="sft"):
        check_input_files(config, ["sft"])
    check_input_files(load_config(_write(tmp_path, '[pipeline]\neval_data = "builtin"\n')), ["eval"])


# ------------------------------------------------------------------------------------------------ toolkens


def test_run_eval_stage_shows_a_toolken_sft_model_its_toolkens(tmp_path, tiny_model_dir) -> None:
    """`[model] toolkens = true` in a run: `toolschool eval` showed the SFT model `<tool_calculator>` as it was
    trained, but the run's own eval stage offered it plain names, so its calls could never match."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolschool.pipeline import _stage_eval

    run = tmp_path / "runs" / "default"
    merged = run / "sft" / "merged"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.add_tokens(["<tool_calculator>"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(merged)
    tokenizer.save_pretrained(merged)
    call = {"id": "c0", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "6 * 7"}}}
    line = {
        "messages": [
            {"role": "user", "content": "What is 6 * 7?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": "42"},
            {"role": "assistant", "content": "42."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "calculator",
                    "description": "Evaluate arithmetic.",
                    "parameters": {
                        "type": "object",
                        "properties": {"expression": {"type": "string"}},
                        "required": ["expression"],
                    },
                },
            }
        ],
    }
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps(line) + "\n", encoding="utf-8")
    config = load_config(
        _write(
            tmp_path,
            f'[run]\nroot = "{tmp_path / "runs"}"\n[model]\nname = "{tiny_model_dir}"\ntoolkens = true\n'
            f'[pipeline]\nstages = ["sft", "eval"]\neval_data = "{data}"\nexecute = false\n[eval]\nmax_tokens = 4\n',
        )
    )
    _stage_eval(config, None)
    seen = {
        path.parent.name: json.loads(path.read_text(encoding="utf-8").splitlines()[0])["tools"]
        for path in (run / "eval").rglob("data.items.jsonl")
    }
    assert sorted(seen.values()) == [["<tool_calculator>"], ["calculator"]]  # the SFT model / the base model


# ------------------------------------------------------------------------------------------------ flag names


@pytest.mark.parametrize(
    "args",
    [
        ["sft", "--learning-rate", "1e-3", "--lr", "1e-3"],
        ["rl", "--learning-rate", "1e-6", "--num-steps", "2"],
        ["rl", "--lr", "1e-6", "--steps", "2"],
        ["continual", "--learning-rate", "1e-3", "--batches", "/no/batches.json"],
    ],
)
def test_flags_are_spelt_as_their_toml_keys_too(tmp_path, args) -> None:
    """The TOML says `learning_rate` / `num_steps` (as TRL and the HF Trainer do); the flags were only `--lr` and,
    for RL, `--steps` (`sft` says `--num-steps`): `--learning-rate` was "No such option"."""
    missing = tmp_path / "missing.jsonl"
    line = _refused([*args, "--data" if args[0] == "continual" else "--train", str(missing), "--run", "x"])
    assert "No such option" not in line and "does not exist" in line


# ------------------------------------------------------------------------------------------------ [eval] in a run


def test_the_run_evaluates_on_eval_data_and_executes_as_the_eval_section_says(tmp_path) -> None:
    """`[eval] data = "test.jsonl"` and `[eval] execute = false` were silently ignored by `toolschool run`, whose
    eval stage read only `[pipeline] eval_data` / `execute`: it scored the distill split, running the calls."""
    test = tmp_path / "test.jsonl"
    test.touch()
    config = load_config(_write(tmp_path, f'[eval]\ndata = "{test}"\nexecute = false\n'))
    assert (config.pipeline.eval_data, config.pipeline.execute) == (str(test), False)
    result = runner.invoke(app, ["config", "show", str(tmp_path / "run.toml")])
    assert f'eval_data = "{test}"' in result.stdout.split("[pipeline]")[1]  # what the run will use, as it will
    # the [pipeline] keys, when set, are the run's; the [eval] ones stay for `toolschool eval`
    own = load_config(
        _write(tmp_path, f'[eval]\ndata = "{test}"\nexecute = false\n[pipeline]\neval_data = "builtin"\n')
    )
    assert (own.pipeline.eval_data, own.pipeline.execute, own.eval.data) == ("builtin", False, str(test))
    both = load_config(_write(tmp_path, "[eval]\nexecute = false\n[pipeline]\nexecute = true\n"))
    assert (both.pipeline.execute, both.eval.execute) == (True, False)
    assert load_config(None).pipeline.execute is True  # the run executes by default, `toolschool eval` does not


@pytest.mark.parametrize("name", ["", "  ", ".", "./"])
def test_a_run_name_that_is_no_folder_under_the_root_is_refused(name) -> None:
    """`--run "$NAME"` with NAME unset wrote runs/sft, runs/eval ... straight into the root, beside the other runs."""
    with pytest.raises(ConfigError, match="'run.name' = .* — expected a folder name under run.root"):
        load_config(None, {"run.name": name})
    assert load_config(None, {"run.name": "group/exp-1"}).run_dir() == Path("runs/group/exp-1")


def _readme_command_lines() -> list[list[str]]:
    import re
    import shlex

    root = Path(__file__).resolve().parents[2]
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]  # the README and the reference it points to
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for command in line.split("; "):
                match = re.search(r"(?:^|\s)toolschool\s+(.*)$", re.sub(r"\s+#.*$", "", command).strip())
                if match and not match.group(1).startswith("--version"):
                    found.append(shlex.split(match.group(1)))
    return found


def test_every_readme_command_line_names_flags_that_exist() -> None:
    """Each `toolschool ...` line of the README and docs/, with --help appended: a flag it names that the command
    lacks (or a command that does not exist) is a usage error instead of the help."""
    lines = _readme_command_lines()
    assert len(lines) > 40
    for args in lines:
        result = runner.invoke(app, [*args, "--help"])
        assert result.exit_code == 0, (args, result.output[-400:])


# ------------------------------------------------------------------------------------------------ misplaced keys


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("batching = 'padded'\n[sft]\nnum_steps = 5\n", "'batching' is a key of [sft]"),  # above its header
        ("rank = 8\n[lora]\nalpha = 16\n", "'rank' is a key of [lora]"),
        ("[model]\nname = 'x'\nlearning_rate = 1e-4\n", "'learning_rate' is a key of [sft], [rl]"),
        ("[run]\nepisodes = 2\n", "'episodes' is a key of [explore]"),
    ],
)
def test_a_key_under_the_wrong_header_names_the_section_it_belongs_to(tmp_path, text, where) -> None:
    """A key written above its header (or under the one before) was "unknown" with the wrong section's key list."""
    line = _refused(["config", "show", str(_write(tmp_path, text))])
    assert where in line


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[model]\nname = "./no/such/model"\n', "[model] name = './no/such/model'"),
        ('[pipeline]\nexplorer = "openai:http://127.0.0.1:8000/v1"\n', "[pipeline] explorer = "),
        ('[distill]\njudge_model = "/no/judge"\n', "[distill] judge_model = '/no/judge'"),
        ('[rl]\nref_model = "~/no/ref"\nbeta = 0.1\n', "[rl] ref_model = '~/no/ref'"),
    ],
)
def test_a_model_that_cannot_be_found_is_refused_before_the_first_stage(tmp_path, text, named) -> None:
    """With an endpoint exploring, a mistyped `[model] name` folder was found only when SFT loaded it, after the
    whole exploration; a judge, after it."""
    line = _refused(["config", "show", str(_write(tmp_path, text))])
    assert named in line
    assert "not an existing folder" in line or "without the served model name" in line


def test_a_model_folder_that_holds_no_model_is_refused_before_the_first_stage(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    line = _refused(["config", "show", str(_write(tmp_path, f'[model]\nname = "{tmp_path / "empty"}"\n'))])
    assert "[model] name" in line and "holds no config.json" in line


def test_config_show_prints_the_batching_the_older_padding_free_key_means(tmp_path) -> None:
    """`[sft] padding_free = true` trains padding-free, but `config show` printed `batching = "shared_prefix"`."""
    import tomllib

    from toolschool.train.sft import resolve_batching

    for value, batching in (("true", "padding_free"), ("false", "padded")):
        path = _write(tmp_path, f"[sft]\npadding_free = {value}\n")
        result = runner.invoke(app, ["config", "show", str(path)])
        assert result.exit_code == 0, result.output
        assert tomllib.loads(result.stdout)["sft"]["batching"] == batching
        assert resolve_batching(load_config(path).sft) == batching
    contradiction = _write(tmp_path, '[sft]\npadding_free = true\nbatching = "padded"\n')
    assert "contradicts" in _refused(["config", "show", str(contradiction)])


SFT_FLAGS = {  # flag -> its [sft] key, or the dotted key of one in the student's [model] or the shared [lora]
    "--format": "model.format",
    "--method": "method",
    "--lora-rank": "lora.rank",
    "--lora-alpha": "lora.alpha",
    "--lora-dropout": "lora.dropout",
    "--batch-size": "batch_size",
    "--num-steps": "num_steps",
    "--max-length": "max_length",
    "--learning-rate": "learning_rate",
    "--warmup-steps": "warmup_steps",
    "--checkpoint-interval": "checkpoint_interval",
    "--log-interval": "log_interval",
    "--validation-interval": "validation_interval",
    "--validation-samples": "validation_samples",
}


def test_sft_help_states_the_defaults_the_config_has() -> None:
    """`toolschool sft --help` listed `--lora-rank <int>` and a dozen more with no word on what they default to
    (issue 7 names them: rank 32, batch 8, 800 steps, max_length 512, intervals 200 / 50 / 200, 50 samples)."""
    import re

    from toolschool.config import ToolschoolConfig

    result = runner.invoke(app, ["sft", "--help"], env={"COLUMNS": "240", "TERMINAL_WIDTH": "240"})
    rows = {}
    for line in result.output.splitlines():
        match = re.match(r"\W*(--[a-z-]+)", line)
        if match:
            rows[match.group(1)] = line
    for flag, key in SFT_FLAGS.items():
        section, _, name = key.rpartition(".")
        default = ToolschoolConfig.model_fields[section or "sft"].annotation.model_fields[name].default
        assert f"default {default}" in rows[flag] or f"default: {default}" in rows[flag], (flag, rows[flag])


RL_FLAGS = {
    "--num-steps": "num_steps",
    "--batch-size": "batch_size",
    "--num-generations": "num_generations",
    "--max-tokens": "max_tokens",
    "--temperature": "temperature",
    "--beta": "beta",
    "--learning-rate": "learning_rate",
    "--log-interval": "log_interval",
    "--checkpoint-interval": "checkpoint_interval",
}


def test_rl_help_states_the_defaults_the_config_has() -> None:
    """Issue 9's defaults (lr 1e-5, batch 8, 500 steps, 128 tokens, temperature 1.0, intervals 10 / 100) were in
    the config but not in `toolschool rl --help`."""
    import re

    from toolschool.config import RLSection

    result = runner.invoke(app, ["rl", "--help"], env={"COLUMNS": "240", "TERMINAL_WIDTH": "240"})
    rows = {}
    for line in result.output.splitlines():
        match = re.match(r"\W*(--[a-z-]+)", line)
        if match:
            rows[match.group(1)] = line
    for flag, key in RL_FLAGS.items():
        assert f"(default: {RLSection.model_fields[key].default})" in rows[flag], (flag, rows[flag])


def test_a_toml_saved_with_a_byte_order_mark_is_read() -> None:
    """Editors on Windows save UTF-8 with a BOM; the file was "not valid TOML ... at line 1, column 1"."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run.toml"
        path.write_bytes('\ufeff[run]\nname = "bom"\n'.encode())
        assert load_config(path).run.name == "bom"
