"""The stage commands' config flags are generated from the config fields (`toolschool.cli.options`): each states
its field's real default, and each still lands on its config key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from toolschool.cli import app, continual_cmd, data_cmd, eval_cmd, explore_cmd, rl_cmd, run_cmd, serve_cmd, sft_cmd
from toolschool.cli.options import config_options, flag, shown_default
from toolschool.config import ToolschoolConfig

runner = CliRunner()

# command path -> the decorated function; every command taking config flags is here
COMMANDS = {
    ("run",): run_cmd.run,
    ("explore",): explore_cmd.explore,
    ("distill",): data_cmd.distill,
    ("dataset", "build-calc-python"): data_cmd.build_calc_python_cmd,
    ("sft",): sft_cmd.sft,
    ("rl",): rl_cmd.rl,
    ("eval",): eval_cmd.eval_command,
    ("continual",): continual_cmd.continual,
    ("serve",): serve_cmd.serve,
    ("generate",): serve_cmd.generate,
}
LOADS_CONFIG = [path for path in COMMANDS if path not in {("serve",), ("generate",)}]

# flag -> config key of each command as the hand-written options had them (before the flags were generated):
# scripts and docs use these, so each must still set the same key (or its new place: `--format`, `--toolkens` and
# the LoRA flags set the student's [model] and the shared [lora] keys, `config.MOVED_KEYS`)
FLAG_KEYS = {
    "run": ("--explorer=pipeline.explorer --model,-m=model.name --run=run.name"),
    "explore": (
        "--concurrency=explore.concurrency --constrained,--no-constrained=explore.constrained "
        "--episodes=explore.episodes --format=explore.format --give-up-after=explore.give_up_after "
        "--max-tokens=explore.max_tokens "
        "--max-turns=explore.max_turns --mcp=tools.mcp --model,-m=model.name --module=tools.modules "
        "--no-exec-feedback=explore.no_exec_feedback --no-ltm=explore.no_ltm --no-reflection=explore.no_reflection "
        "--no-stm=explore.no_stm --run=run.name --seed=run.seed --stm-slots=explore.stm_slots "
        "--target-per-tool=explore.target_per_tool --temperature=explore.temperature --toolbox=tools.toolbox "
        "--tools=explore.tools --trial-temperature=explore.trial_temperature"
    ),
    "distill": (
        "--chitchat-fraction=distill.chitchat_fraction --concurrency=distill.concurrency "
        "--dedupe-threshold=distill.dedupe_threshold --explorer-model=distill.explorer_model "
        "--irrelevance-fraction=distill.irrelevance_fraction --judge-model=distill.judge_model "
        "--max-paraphrases=distill.max_paraphrases "
        "--no-paraphrase-round-trip,--paraphrase-round-trip=distill.paraphrase_round_trip "
        "--no-require-grounded,--require-grounded=distill.require_grounded "
        "--no-require-solved,--require-solved=distill.require_solved --no-round-trip,--round-trip=distill.round_trip "
        "--out-of-scope-fraction=distill.out_of_scope_fraction --paraphrase-model=distill.paraphrase_model "
        "--run=run.name --seed=run.seed --target-per-tool=distill.target_per_tool --trials=distill.trials "
        "--validation-fraction=distill.validation_fraction --variants=distill.variants"
    ),
    "dataset build-calc-python": (
        "--cruxeval=dataset.cruxeval --formats=dataset.formats --gsm8k=dataset.gsm8k "
        "--instructions=dataset.instructions --max-expression-chars=dataset.max_expression_chars "
        "--ratio=dataset.ratios --run=run.name --seed=run.seed --size=dataset.size "
        "--validation-fraction=dataset.validation_fraction --workers=dataset.workers"
    ),
    "sft": (
        "--batch-size=sft.batch_size --batching=sft.batching --checkpoint-interval=sft.checkpoint_interval "
        "--format=model.format --group-by-length,--no-group-by-length=sft.group_by_length "
        "--learning-rate,--lr=sft.learning_rate --log-interval=sft.log_interval --lora-alpha=lora.alpha "
        "--lora-dropout=lora.dropout --lora-rank=lora.rank --max-length=sft.max_length --method=sft.method "
        "--model,-m=model.name --no-toolkens,--toolkens=model.toolkens --num-steps=sft.num_steps --run=run.name "
        "--seed=run.seed --target-modules=lora.target_modules --train=sft.train --validation=sft.validation "
        "--validation-interval=sft.validation_interval --validation-samples=sft.validation_samples "
        "--warmup-steps=sft.warmup_steps"
    ),
    "rl": (
        "--batch-size=rl.batch_size --beta=rl.beta --checkpoint-interval=rl.checkpoint_interval "
        "--format=model.format "
        "--learning-rate,--lr=rl.learning_rate --log-interval=rl.log_interval --max-tokens=rl.max_tokens "
        "--method=rl.method --mode=rl.mode --model,-m=model.name --no-share-prompts,--share-prompts=rl.share_prompts "
        "--no-vllm,--use-vllm=rl.use_vllm --num-generations=rl.num_generations --num-steps,--steps=rl.num_steps "
        "--ref-model=rl.ref_model --reward=rl.rewards --run=run.name --seed=run.seed --temperature=rl.temperature "
        "--train=rl.train --validation=rl.validation --validation-interval=rl.validation_interval "
        "--validation-samples=rl.validation_samples"
    ),
    "eval": (
        "--arguments=eval.arguments --benchmark,-b=eval.benchmarks --concurrency=eval.concurrency "
        "--constrained,--no-constrained=eval.constrained --data=eval.data --demos=eval.demos "
        "--execute,--no-execute=eval.execute --format=model.format --icl=eval.icl --limit,-n=eval.limit "
        "--max-tokens=eval.max_tokens --mcp=tools.mcp --module=tools.modules --retriever=eval.retriever "
        "--run=run.name --toolbox=tools.toolbox"
    ),
    "continual": (
        "--batch-size=sft.batch_size --batches=continual.batches --data=continual.data "
        "--eval-limit=continual.eval_limit --eval-max-tokens=continual.eval_max_tokens --format=model.format "
        "--general=continual.general --general-count=continual.general_count --general-ratio=continual.general_ratio "
        "--learning-rate,--lr=sft.learning_rate --max-length=sft.max_length --model,-m=model.name "
        "--no-replay,--replay=continual.replay --out=continual.out --replay-ratio=continual.replay_ratio "
        "--run=run.name --seed=run.seed --steps-per-round=continual.steps_per_round "
        "--test-fraction=continual.test_fraction"
    ),
}


def _field_default(key: str) -> Any:
    section, name = key.split(".")
    model = ToolschoolConfig.model_fields[section].annotation
    return model.model_fields[name].get_default(call_default_factory=True)


def _click_command(path: tuple[str, ...]) -> Any:
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


def _params_by_opts(path: tuple[str, ...]) -> dict[tuple[str, ...], Any]:
    return {tuple(p.opts): p for p in _click_command(path).params}


def test_every_command_with_config_flags_is_checked_here() -> None:
    decorated = set()
    for info in app.registered_commands:
        if hasattr(info.callback, "config_options"):
            decorated.add((info.name,))
    for group in app.registered_groups:
        for info in group.typer_instance.registered_commands:
            if hasattr(info.callback, "config_options"):
                decorated.add((group.name, info.name))
    assert decorated == set(COMMANDS)


@pytest.mark.parametrize("command", list(FLAG_KEYS))
def test_each_flag_sets_the_key_it_always_set(command: str) -> None:
    expected = dict(pair.split("=") for pair in FLAG_KEYS[command].split())
    generated = {
        ",".join(sorted(n for d in o.decls for n in d.split("/"))): o.key
        for o in COMMANDS[tuple(command.split())].config_options
    }
    if command == "continual":  # its --out (a folder the command also uses itself) stays hand-written
        generated["--out"] = "continual.out"
    assert generated == expected


@pytest.mark.parametrize("path", list(COMMANDS), ids=" ".join)
def test_each_generated_option_states_its_fields_real_default(path: tuple[str, ...]) -> None:
    params = _params_by_opts(path)
    for option in COMMANDS[path].config_options:
        param = params[tuple(n for d in option.decls for n in d.split("/")[:1])]
        default = _field_default(option.key)
        shown = shown_default(default)
        assert param.help, (path, option.key)
        if shown is not None:
            assert f"default: {shown})" in param.help, (path, option.key, param.help)
        # no number the help calls a default is another than the field's (a description stating a stale one)
        for claimed in re.findall(r"default:? (-?\d[\d.e-]*)", param.help):
            assert shown is not None and shown.startswith(claimed.rstrip(".")), (path, option.key, param.help)
        description = (
            ToolschoolConfig.model_fields[option.key.split(".")[0]]
            .annotation.model_fields[option.key.split(".")[1]]
            .description
        )
        assert description.split("(")[0].strip()[1:20] in param.help, (path, option.key, param.help)


@pytest.mark.parametrize("path", list(COMMANDS), ids=" ".join)
def test_option_defaults_are_none_or_the_fields(path: tuple[str, ...]) -> None:
    """A command reading a config gets None for a flag not given (the file's value stays); serve and generate,
    which read none, get the field's default itself."""
    params = _params_by_opts(path)
    for option in COMMANDS[path].config_options:
        param = params[tuple(n for d in option.decls for n in d.split("/")[:1])]
        expected = _field_default(option.key) if path not in LOADS_CONFIG else None
        assert param.default == expected, (path, option.key)


class _Loaded(Exception):
    def __init__(self, overrides: dict[str, Any]) -> None:
        self.overrides = overrides


# the words of the flags read otherwise than by their type, and the config value they give
SPECIAL = {
    "explore.tools": (["--tools", "calculator,weekday"], ["calculator", "weekday"]),
    "dataset.formats": (["--formats", "hermes,json"], ["hermes", "json"]),
    "dataset.ratios": (["--ratio", "calculator=0.5", "--ratio", "no_tool=0.5"], {"calculator": 0.5, "no_tool": 0.5}),
    "continual.replay": (["--replay"], True),  # --no-replay refuses --replay-ratio
}


def _arguments(option: Any) -> tuple[list[str], Any]:
    """Command-line words giving `option` a value (by its last name: the short or older alias), and that value."""
    if option.key in SPECIAL:
        return SPECIAL[option.key]
    _, _, secondary = option.decls[0].partition("/")
    name = secondary or option.decls[-1]
    if option.annotation is bool:
        return [name], not secondary  # `--no-x` of a pair: False; a flag alone (`--no-stm`): True
    if option.multiple:
        return [name, "a", name, "b"], ["a", "b"]
    sample = {int: ("3", 3), float: ("0.5", 0.5), str: ("text", "text")}[option.annotation]
    return [name, sample[0]], sample[1]


@pytest.mark.parametrize("path", LOADS_CONFIG, ids=" ".join)
def test_each_flag_lands_on_its_config_key(path: tuple[str, ...], monkeypatch) -> None:
    def capture(_path: Any = None, overrides: dict[str, Any] | None = None, **_: Any) -> Any:
        raise _Loaded(dict(overrides or {}))

    monkeypatch.setattr("toolschool.config.load_config", capture)
    words: list[str] = []
    expected: dict[str, Any] = {}
    for option in COMMANDS[path].config_options:
        given, value = _arguments(option)
        words += given
        expected[option.key] = value
    result = runner.invoke(app, [*path, *words])
    assert isinstance(result.exception, _Loaded), result.output
    got = result.exception.overrides
    assert {key: got[key] for key in expected} == expected
    assert set(got) - set(expected) <= {"continual.out"}  # continual's --out is its folder and a config key


def test_serve_and_generate_hand_the_model_flags_on(monkeypatch) -> None:
    """They load no config: the generated flags' values (the fields' defaults unless given) go to the backend."""

    def capture(model: str, dtype: str = "auto", device: str | None = None, **_: Any) -> Any:
        raise _Loaded({"model.name": model, "model.dtype": dtype, "model.device": device})

    monkeypatch.setattr("toolschool.engine.backends.make_backend", capture)
    monkeypatch.setattr("toolschool.serve.server.bind_socket", lambda host, port: None)
    result = runner.invoke(app, ["serve", "-m", "some/model", "--dtype", "bf16", "--device", "cpu"])
    assert isinstance(result.exception, _Loaded), result.output
    assert result.exception.overrides == {"model.name": "some/model", "model.dtype": "bf16", "model.device": "cpu"}
    result = runner.invoke(app, ["serve"])
    assert isinstance(result.exception, _Loaded), result.output
    defaults = {key: _field_default(key) for key in ("model.name", "model.dtype", "model.device")}
    assert result.exception.overrides == defaults
    result = runner.invoke(app, ["generate", "-p", "hi"])
    assert isinstance(result.exception, _Loaded), result.output
    assert result.exception.overrides["model.name"] == _field_default("model.name")


def test_no_flag_given_overrides_nothing(monkeypatch) -> None:
    seen: list[dict[str, Any]] = []

    def capture(_path: Any = None, overrides: dict[str, Any] | None = None, **_: Any) -> Any:
        seen.append(dict(overrides or {}))
        raise _Loaded({})

    monkeypatch.setattr("toolschool.config.load_config", capture)
    runner.invoke(app, ["sft"])
    assert seen and all(value is None for value in seen[0].values())
    assert set(seen[0]) == {o.key for o in sft_cmd.sft.config_options}


def test_a_flag_still_reaches_the_loaded_config(tmp_path: Path, monkeypatch) -> None:
    """End to end through the real `load_config`: `--episodes 7 --no-stm --lr`-style flags set those keys."""
    from toolschool import config as config_module

    loaded: list[ToolschoolConfig] = []
    real = config_module.load_config

    def keep(path: Any = None, overrides: dict[str, Any] | None = None, **kw: Any) -> Any:
        loaded.append(real(path, overrides, **kw))
        raise _Loaded({})

    monkeypatch.setattr("toolschool.config.load_config", keep)
    runner.invoke(app, ["explore", "--episodes", "7", "--no-stm", "--no-constrained", "--tools", "a,b", "-m", "x"])
    runner.invoke(app, ["sft", "--lr", "0.001", "--target-modules", "q_proj", "--target-modules", "v_proj"])
    runner.invoke(app, ["rl", "--steps", "9", "--no-vllm", "--reward", "tool"])
    explore, sft, rl = loaded
    assert (explore.explore.episodes, explore.explore.no_stm, explore.explore.constrained) == (7, True, False)
    assert (explore.explore.tools, explore.model.name) == (["a", "b"], "x")
    assert explore.explore.max_turns == _field_default("explore.max_turns")  # not given: the default
    assert (sft.sft.learning_rate, sft.lora.target_modules) == (0.001, ["q_proj", "v_proj"])
    assert (rl.rl.num_steps, rl.rl.use_vllm, rl.rl.rewards) == (9, False, ["tool"])


def test_a_bad_flag_value_is_named_as_a_flag(monkeypatch) -> None:
    result = runner.invoke(app, ["explore", "--episodes", "0", "--tools", "calculator"])
    assert result.exit_code == 2
    assert "command-line flag: 'explore.episodes' = 0" in result.output


# --- the error paths, when a command is defined ---


def _command(*, overrides: dict[str, Any]) -> None:
    pass


def test_a_key_naming_no_field_fails_at_definition() -> None:
    with pytest.raises(
        ValueError,
        match=r"'explore\.episods' names no config key: \[explore\] has no 'episods'.*"
        r"did you mean 'explore\.episodes'",
    ):
        config_options("explore.episods")(_command)


def test_a_key_naming_no_section_fails_at_definition() -> None:
    with pytest.raises(ValueError, match=r"'explor\.episodes' names no config key.*did you mean \[explore\]"):
        config_options("explor.episodes")


def test_a_field_without_description_fails_at_definition() -> None:
    class Section(BaseModel):
        plain: int = 1
        described: int = Field(2, description="a number")

    class Schema(BaseModel):
        part: Section = Field(default_factory=Section)

    assert config_options("part.described", schema=Schema)
    with pytest.raises(ValueError, match=r"'part\.plain' has no description"):
        config_options("part.plain", schema=Schema)


def test_a_field_of_no_flag_type_needs_a_parse() -> None:
    with pytest.raises(ValueError, match=r"'dataset\.ratios': no flag type"):
        config_options("dataset.ratios")
    with pytest.raises(ValueError, match="type= needs parse="):
        config_options(flag("dataset.ratios", type=list[str]))


def test_a_flag_given_twice_or_clashing_with_the_commands_own_fails() -> None:
    with pytest.raises(ValueError, match="config key explore.episodes given twice"):
        config_options("explore.episodes", flag("explore.episodes", "--rounds"))
    with pytest.raises(ValueError, match="flag --lr given twice"):
        config_options(flag("sft.learning_rate", "--lr"), flag("rl.learning_rate", "--lr"))

    def own(episodes: int = typer.Option(None), *, overrides: dict[str, Any]) -> None:
        pass

    with pytest.raises(ValueError, match="clash with its own: --episodes"):
        config_options("explore.episodes")(own)


def test_a_command_without_overrides_fails() -> None:
    def plain(seed: int = typer.Option(None)) -> None:
        pass

    with pytest.raises(TypeError, match="needs a parameter 'overrides'"):
        config_options("explore.episodes")(plain)
