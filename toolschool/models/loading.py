"""Load a local Hugging Face model (embedded, hub id, folder, or LoRA adapter folder) with its tokenizer."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolschool.errors import ModelLoadError
from toolschool.models.spec import ModelSpec, parse_model_spec


@dataclass
class LoadedModel:
    spec: ModelSpec
    model: Any  # transformers PreTrainedModel (or peft PeftModel)
    tokenizer: Any
    source: str  # folder or hub id the weights came from
    device: str
    dtype: Any
    load_seconds: float
    import_seconds: float = 0.0
    adapter: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def resolve_source(spec: ModelSpec) -> tuple[str, str | None]:
    """Return (base weights source, adapter folder or None) for a local-backend model spec.

    The adapter is the outermost one: an adapter trained on top of another adapter (RL started from an SFT
    adapter names that adapter as its base) has a chain, which `resolve_chain` gives in full.
    """
    source, adapters = resolve_chain(spec)
    return source, adapters[-1] if adapters else None


def resolve_chain(spec: ModelSpec) -> tuple[str, list[str]]:
    """(base weights source, adapter folders to apply in order, innermost first) for a local-backend model spec."""
    if spec.kind == "openai":
        raise ModelLoadError(
            f"model '{spec.name}' is an OpenAI-compatible endpoint, not local weights",
            hint="this command needs a local model: pass smollm2-135m, a HF id or a folder",
        )
    if spec.kind == "embedded":
        from toolschool.models.embedded import ensure_embedded

        return str(ensure_embedded(spec.path_or_id)), []
    if spec.kind == "local":
        folder = Path(spec.path_or_id)
        adapter_cfg = folder / "adapter_config.json"
        if adapter_cfg.is_file():
            try:
                base = json.loads(adapter_cfg.read_text())["base_model_name_or_path"]
            except (KeyError, json.JSONDecodeError) as exc:
                raise ModelLoadError(
                    f"adapter folder '{folder}' has an unreadable adapter_config.json ({exc})",
                    hint="re-save the adapter with peft's save_pretrained",
                ) from exc
            base_spec = _adapter_base_spec(folder, base)
            if base_spec.kind == "hub":
                check_hub_model(base, f"'{base}' (the base model of adapter '{folder}')")
            base_source, inner = resolve_chain(base_spec)
            if str(folder) in inner or len(inner) > 8:
                raise ModelLoadError(
                    f"adapter folder '{folder}' names, through base_model_name_or_path, a chain of adapters that "
                    "loops or runs deeper than 8",
                    hint="point base_model_name_or_path at the model the adapter was trained from",
                )
            return base_source, [*inner, str(folder)]
        if not (folder / "config.json").is_file():
            raise ModelLoadError(
                f"folder '{folder}' holds no config.json or adapter_config.json, so it is not a model",
                hint="pass a folder saved with save_pretrained (e.g. runs/NAME/sft/merged)",
            )
        return str(folder), []
    check_hub_model(spec.path_or_id)
    return spec.path_or_id, []


_NOT_CACHED_HINT = (
    "download it on a connected machine (huggingface-cli download ID), pass a local folder, or use --model smollm2-135m"
)


def check_hub_model(repo_id: str, label: str | None = None) -> None:
    """A hub model must be in the local Hugging Face cache or the Hub must answer: otherwise one clear line now,
    instead of a minute of huggingface_hub's retries at load time (and an output folder written meanwhile).
    `label` names it in the message (default: 'REPO_ID')."""
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # a malformed id: from_pretrained names what is wrong with it
        return
    if isinstance(cached, str):
        return
    reason = hub_unreachable()
    if reason is not None:
        raise ModelLoadError(
            f"model {label or repr(repo_id)} is not in the local Hugging Face cache and {reason}", hint=_NOT_CACHED_HINT
        )


_HUB_PROBE: dict[str, str | None] = {}


def hub_unreachable() -> str | None:
    """Why the Hugging Face Hub cannot be reached ("HF_HUB_OFFLINE=1", or its host refusing a TCP connection within
    5 s), or None. Behind a proxy nothing is probed: the proxy, not this machine, reaches the Hub. Asked once per
    process."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE=1"
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    if "answer" not in _HUB_PROBE:
        import socket
        from urllib.parse import urlsplit

        from huggingface_hub import constants

        url = urlsplit(constants.ENDPOINT)
        host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((host, port), timeout=5).close()
            _HUB_PROBE["answer"] = None
        except OSError as exc:
            _HUB_PROBE["answer"] = f"the Hub cannot be reached ({host}: {exc.strerror or type(exc).__name__})"
    return _HUB_PROBE["answer"]


def _adapter_base_spec(folder: Path, base: object) -> ModelSpec:
    """The model an adapter folder names as its base, or one error that says it is the adapter's record at fault."""
    fix = f"set base_model_name_or_path in {folder / 'adapter_config.json'} to the model the adapter was trained from"
    if not isinstance(base, str) or not base.strip():
        raise ModelLoadError(
            f"adapter folder '{folder}' names no base model (adapter_config.json base_model_name_or_path is "
            f"{json.dumps(base)})",
            hint=fix,
        )
    try:
        return parse_model_spec(base)
    except ModelLoadError as exc:
        reason = exc.message.removeprefix(f"model '{base.strip()}' ")  # the spec parser's "model 'X' is not ..."
        raise ModelLoadError(
            f"adapter folder '{folder}' names the base model '{base}' (adapter_config.json base_model_name_or_path), "
            f"which {reason}",
            hint=fix,
        ) from None


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """No transformers warnings below errors and no "Loading weights" progress bar while loading: our own line
    says what loads; both are put back after."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


def _from_pretrained(loader: Any, source: str, spec: ModelSpec, **kwargs: Any) -> Any:
    """Call a from_pretrained, local cache first; turn hub/offline failures into one clear line.

    `source` is a hub id (not a folder) for a hub model, and also for an adapter folder trained on one (then
    `spec` is the adapter's, and the message names the base it records)."""
    if spec.kind == "hub" or not Path(source).is_dir():
        name = f"'{source}'" if spec.kind == "hub" else f"'{source}' (the base model of adapter '{spec.name}')"
        try:
            return loader.from_pretrained(source, local_files_only=True, **kwargs)
        except OSError:
            if hub_unreachable() is not None:
                raise ModelLoadError(
                    f"model {name} is not in the local Hugging Face cache and {hub_unreachable()}",
                    hint=_NOT_CACHED_HINT,
                ) from None
        try:
            return loader.from_pretrained(source, **kwargs)
        except Exception as exc:
            raise ModelLoadError(
                f"could not load model {name} from the Hugging Face Hub or its local cache "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})",
                hint="check the id and your connection, pass a local folder, or use --model smollm2-135m",
            ) from exc
    try:
        return loader.from_pretrained(source, **kwargs)
    except Exception as exc:
        raise ModelLoadError(
            f"could not load model '{spec.name}' from {source} ({type(exc).__name__}: {str(exc)[:200]})",
            hint="check that the folder was written by save_pretrained and is complete",
        ) from exc


def load_tokenizer(model: str | ModelSpec) -> Any:
    from transformers import AutoTokenizer

    spec = parse_model_spec(model) if isinstance(model, str) else model
    source, adapters = resolve_chain(spec)
    # the outermost adapter saved with a tokenizer (toolkens add tokens), else the base model's
    with_tokenizer = [a for a in adapters if (Path(a) / "tokenizer_config.json").is_file()]
    tok_source = with_tokenizer[-1] if with_tokenizer else source
    tokenizer = _from_pretrained(AutoTokenizer, tok_source, spec)
    _prepare_tokenizer(tokenizer)
    return tokenizer


def _prepare_tokenizer(tokenizer: Any) -> None:
    """Make a ChatML tokenizer stop at <|im_end|> and render tools, when its own template cannot."""
    from toolschool.models.chat_template import install_chatml_tools_template, renders_tool_calls

    vocab = tokenizer.get_vocab()
    if "<|im_start|>" in vocab and "<|im_end|>" in vocab:
        ok, _ = renders_tool_calls(tokenizer)
        if not ok:
            install_chatml_tools_template(tokenizer)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"


def load_model(
    model: str | ModelSpec,
    *,
    device: str | None = None,
    dtype: str | None = "auto",
    merge_adapter: bool = False,
) -> LoadedModel:
    """Load weights and tokenizer for local inference or training."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolschool.models.device import parse_dtype, resolve_device

    spec = parse_model_spec(model) if isinstance(model, str) else model
    import_start = time.perf_counter()
    _warm_imports()
    import_seconds = time.perf_counter() - import_start
    start = time.perf_counter()
    source, adapters = resolve_chain(spec)
    adapter = adapters[-1] if adapters else None
    device = resolve_device(device)
    torch_dtype = parse_dtype(dtype, device)
    with quiet_transformers():
        tokenizer = load_tokenizer(spec)
        hf_model = _from_pretrained(AutoModelForCausalLM, source, spec, dtype=torch_dtype)
    if len(tokenizer) > hf_model.get_input_embeddings().weight.shape[0]:
        hf_model.resize_token_embeddings(len(tokenizer))
    for index, folder in enumerate(adapters):
        from peft import PeftModel

        if not any((Path(folder) / name).is_file() for name in ("adapter_model.safetensors", "adapter_model.bin")):
            raise ModelLoadError(  # PEFT would take the folder for a hub repo id and say that id is malformed
                f"could not load the adapter in '{folder}': it holds adapter_config.json but no weights "
                "(adapter_model.safetensors or adapter_model.bin)",
                hint="copy the adapter folder again, whole, or save it again with peft's save_pretrained",
            )
        try:
            hf_model = PeftModel.from_pretrained(hf_model, folder)
        except RuntimeError as exc:
            if "size mismatch" not in str(exc):
                raise _adapter_load_error(folder, exc) from exc
            raise ModelLoadError(
                f"the adapter in '{folder}' does not fit its base model '{source}' (adapter_config.json "
                "base_model_name_or_path): its weights have other shapes, so it was trained on another model",
                hint="point base_model_name_or_path at the model the adapter was trained from, or use the run's "
                "merged/ folder",
            ) from None
        except Exception as exc:  # a missing or cut-short weights file, an adapter type PEFT does not know
            raise _adapter_load_error(folder, exc) from exc
        if merge_adapter or index < len(adapters) - 1:  # an inner adapter is merged before the next goes on top
            hf_model = hf_model.merge_and_unload()
    hf_model.to(device)
    hf_model.eval()
    if tokenizer.eos_token_id is not None:
        hf_model.generation_config.eos_token_id = _end_ids(hf_model.generation_config.eos_token_id, tokenizer)
        hf_model.generation_config.pad_token_id = tokenizer.pad_token_id
    torch.set_grad_enabled(True)
    return LoadedModel(
        spec=spec,
        model=hf_model,
        tokenizer=tokenizer,
        source=source,
        device=device,
        dtype=torch_dtype,
        load_seconds=time.perf_counter() - start,
        import_seconds=import_seconds,
        adapter=adapter,
    )


def _adapter_load_error(folder: str, exc: BaseException) -> ModelLoadError:
    """PEFT's failure to read an adapter folder as one line: what it said, and what the folder must hold."""
    detail = str(exc).splitlines()[0][:200] if str(exc) else ""
    return ModelLoadError(
        f"could not load the adapter in '{folder}' ({type(exc).__name__}: {detail})",
        hint="the folder must hold what peft's save_pretrained writes, complete: adapter_config.json and "
        "adapter_model.safetensors (or adapter_model.bin)",
    )


def _end_ids(configured: int | list[int] | None, tokenizer: Any) -> int | list[int]:
    """The tokenizer's eos (the end of a chat turn) added to the end ids the checkpoint's generation config lists.

    Checkpoints list several (Qwen2.5: <|im_end|> and <|endoftext|>; Llama 3.1: <|eot_id|>, <|eom_id|> and
    <|end_of_text|>); replacing them with the tokenizer's single eos would let generation run on past the others.
    """
    ids = [configured] if isinstance(configured, int) else list(configured or [])
    ids = [int(tokenizer.eos_token_id), *(i for i in ids if i != tokenizer.eos_token_id)]
    return ids[0] if len(ids) == 1 else ids


def _warm_imports() -> None:
    """Import transformers' lazily loaded modelling modules, so load time measures reading the model.

    transformers imports most of itself (and torch.distributed) on the first from_pretrained; that costs
    ~2-3 s once per process whatever the model, and is reported separately as import time.
    """
    import transformers.activations  # noqa: F401
    import transformers.core_model_loading  # noqa: F401
    import transformers.modeling_utils  # noqa: F401
