from __future__ import annotations

from pathlib import Path

import pytest

from toolschool.config import MOVED_KEYS, load_config, read_toml, stage_dir
from toolschool.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_defaults_and_file(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, '[run]\nname = "exp1"\n[model]\nname = "smollm2-135m"\n'))
    assert cfg.run.name == "exp1"
    assert cfg.model.dtype == "auto"
    assert cfg.run_dir() == Path("runs/exp1")


def test_flags_override_file(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, '[run]\nname = "exp1"\n'), {"run.name": "exp2", "run.seed": None})
    assert cfg.run.name == "exp2"
    assert cfg.run.seed == 0


def test_unknown_key_names_file_key_and_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "[run]\nnmae = 'x'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert str(path) in msg
    assert "unknown key 'run.nmae'" in msg
    assert "did you mean 'name'" in msg


def test_unknown_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'bogus'"):
        load_config(write(tmp_path, "[bogus]\nx = 1\n"))


def test_give_up_after_without_a_target_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected target_per_tool set with give_up_after") as info:
        load_config(write(tmp_path, "[explore]\ngive_up_after = 8\n"))
    assert "explore" in str(info.value)
    config = load_config(write(tmp_path, "[explore]\ngive_up_after = 8\ntarget_per_tool = 4\n"))
    assert config.explore.give_up_after == 8


@pytest.mark.parametrize("old", sorted(MOVED_KEYS))
def test_a_key_that_moved_names_its_new_place(tmp_path: Path, old: str) -> None:
    """Each setting is declared once: the student's format and toolkens in [model], the LoRA shape in [lora]. A
    config still writing one under [sft], [rl] or [eval] is refused with where it went, not as an unknown key."""
    section, _, key = old.partition(".")
    new_section, _, new_key = MOVED_KEYS[old].partition(".")
    path = write(tmp_path, f"[{section}]\n{key} = {'true' if key == 'toolkens' else 1}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"{path}: [{section}] {key} moved to [{new_section}] {new_key}" in message
    assert "unknown key" not in message
    assert ("one LoRA table for [sft] and [rl]" if new_section == "lora" else "a setting of the student") in message


def test_the_moved_keys_land_in_model_and_lora(tmp_path: Path) -> None:
    assert set(MOVED_KEYS.values()) == {
        "model.format",
        "model.toolkens",
        "lora.rank",
        "lora.alpha",
        "lora.dropout",
        "lora.target_modules",
    }
    cfg = load_config(write(tmp_path, '[model]\nformat = "react"\ntoolkens = true\n[lora]\nrank = 4\nalpha = 8\n'))
    assert (cfg.model.format, cfg.model.toolkens, cfg.lora.rank, cfg.lora.alpha) == ("react", True, 4, 8)


def test_wrong_type_names_key_and_expected(tmp_path: Path) -> None:
    path = write(tmp_path, "[run]\nseed = 'abc'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "'run.seed' = 'abc' — expected an integer" in str(info.value)


def test_out_of_range_values_say_the_bound_and_where_they_came_from(tmp_path: Path) -> None:
    path = write(tmp_path, "[sft]\nlearning_rate = -1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, {"eval.concurrency": 0, "sft.num_steps": None})
    message = str(info.value)
    assert f"{path}: 'sft.learning_rate' = -1 — expected greater than 0" in message
    assert "command-line flag: 'eval.concurrency' = 0 — expected greater than or equal to 1" in message
    assert "Input should" not in message


def test_malformed_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[run\nname = 1\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        read_toml(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_stage_dir_saves_resolved_config(tmp_path: Path) -> None:
    cfg = load_config(None, {"run.root": str(tmp_path), "run.name": "r"})
    out = stage_dir(cfg, "explore")
    assert out == tmp_path / "r" / "explore"
    saved = load_config(out / "config.toml")
    assert saved == cfg


def test_cli_reports_bad_config(tmp_path: Path) -> None:
    """The CLI path: one clear line, exit 2, no traceback (uses `toolschool config show`)."""
    from typer.testing import CliRunner

    from toolschool.cli import app

    path = write(tmp_path, "[model]\nnam = 'x'\n")
    result = CliRunner().invoke(app, ["config", "show", str(path)])
    assert result.exit_code == 2
    assert "unknown key 'model.nam'" in result.output
    assert "Traceback" not in result.output


def test_config_show_prints_toml_that_parses_back_whatever_the_line_length(tmp_path: Path) -> None:
    """`toolschool config show run.toml > resolved.toml` must give a TOML file: no line wrapped at the console width."""
    import tomllib

    from typer.testing import CliRunner

    from toolschool.cli import app

    command = "uvx mcp-server-time --local-timezone Europe/Lisbon " * 3
    path = write(tmp_path, f'[run]\nname = "{"x" * 100}"\n[tools]\nmcp = ["{command}"]\n')
    result = CliRunner().invoke(app, ["config", "show", str(path)])
    assert result.exit_code == 0, result.output
    shown = tomllib.loads(result.stdout)
    assert shown["run"]["name"] == "x" * 100 and shown["tools"]["mcp"] == [command]


def test_a_stage_folder_that_cannot_be_made_is_one_clear_error(tmp_path: Path) -> None:
    """`--out` naming a file (or a folder under one) ended every stage in a FileExistsError traceback."""
    from toolschool.config import stage_dir
    from toolschool.errors import ConfigError

    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    for out in (taken, taken / "sub"):
        with pytest.raises(ConfigError, match=f"cannot write the sft output folder '{out}'") as info:
            stage_dir(load_config(None), "sft", out)
        assert "--out" in info.value.hint
