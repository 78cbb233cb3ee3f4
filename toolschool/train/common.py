"""What the SFT and RL stages share: their inputs, logs, LoRA settings, checkpoints, the base-model identity, final
saving."""

from __future__ import annotations

import json
import logging
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolschool.errors import ConfigError, ToolschoolError
from toolschool.run_state import (
    CONFIG_FILE,
    StageState,
    append_jsonl,
    check_resume,
    read_jsonl,
    read_lines,
    write_jsonl,
    write_text_atomic,
)


@dataclass(frozen=True)
class TrainingInputs:
    """What a training stage (`run_sft`, `run_rl`) is handed, besides its settings: the model it starts from, the
    file it trains on and the one it validates on (None: no validation during training).

    `validation_optional`: the validation file was not named but picked by default (a run's distill split), so one
    holding no examples validates nothing instead of being refused. Who hands them over resolves them:
    `toolschool.pipeline.training_inputs` for `toolschool run` and the `sft` / `rl` commands."""

    start_model: str
    train: Path
    validation: Path | None = None
    validation_optional: bool = False

    def check_files(self, train_hint: str) -> None:
        """The training and validation files exist (before any slow import or model load)."""
        check_training_file(self.train, train_hint)
        if self.validation is not None and not self.validation.is_file():
            state = "is not a file" if self.validation.exists() else "does not exist"
            raise ConfigError(f"validation data '{self.validation}' {state}", hint="check --validation PATH")

    def recorded(self, config: Any, section: str, *, validates: bool = True) -> Any:
        """The config the stage saves as its config.toml: `config` with these inputs under the keys its command reads
        them from (`[model] name`, `[SECTION] train` / `validation`). `validates`: the validation file held examples
        (as the stage loaded it); an optional one that held none is not recorded, since named it would be refused
        and `toolschool STAGE config.toml` must redo the stage."""
        from toolschool.config import recorded

        keep = self.validation is not None and (validates or not self.validation_optional)
        values = {"model.name": self.start_model, f"{section}.train": str(self.train)}
        return recorded(config, {**values, f"{section}.validation": str(self.validation) if keep else None})


def check_training_file(path: Path, hint: str) -> None:
    """A training stage's training file exists (`hint`: the stage's ways to give one)."""
    if not path.is_file():
        raise ConfigError(f"training data '{path}' does not exist", hint=hint)


class JsonlLogger:
    """Append-only JSONL log of training and validation metrics (one object per line)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            append_jsonl(handle, record)


def lora_config(settings: Any, *, modules_to_save: list[str] | None = None) -> Any:
    """peft LoraConfig from the [lora] section (`LoraSection`: rank, alpha, dropout, target_modules)."""
    from peft import LoraConfig

    targets: str | list[str] = (
        "all-linear" if list(settings.target_modules) == ["all-linear"] else list(settings.target_modules)
    )
    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
        modules_to_save=modules_to_save,
    )


def check_lora_targets(model: Any, target_modules: list[str]) -> None:
    """Refuse a LoRA target that names no module of `model`, before training starts.

    PEFT matches each name against the end of the modules' dotted names and fails (with a traceback) only when
    no name matches at all: a misspelt name beside a good one ("q_proj", "vproj") silently leaves that layer
    untrained. "all-linear" is PEFT's keyword for every linear layer and only works on its own.
    """
    from toolschool.errors import ConfigError

    if list(target_modules) == ["all-linear"]:
        return
    import torch

    names = [name for name, _ in model.named_modules() if name]
    missing = [t for t in target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ConfigError(
            f"lora.target_modules: {', '.join(repr(t) for t in missing)} names no module of the model",
            hint=f'use ["all-linear"] on its own, or names of its linear layers: {", ".join(linear)}',
        )


def check_scheduler(name: str, section: str) -> None:
    """Refuse a learning-rate scheduler name transformers does not know, before the model loads."""
    from transformers import SchedulerType

    from toolschool.errors import ConfigError

    known = [s.value for s in SchedulerType]
    if name not in known:
        raise ConfigError(
            f"{section}.lr_scheduler = '{name}' is not a transformers scheduler", hint=f"use one of {', '.join(known)}"
        )


def checkpoint_step(checkpoint: Path) -> int:
    """N of a `checkpoint-N` folder: the training step it saved."""
    return int(checkpoint.name.split("-")[-1])


# The file the Trainer writes last into a checkpoint folder (after the weights, optimizer, scheduler and RNG state).
CHECKPOINT_COMPLETE_FILE = "trainer_state.json"
_TOLD_INCOMPLETE: set[Path] = set()  # the incomplete checkpoints this process has named already


def checkpoint_folders(out_dir: Path) -> list[Path]:
    """Every `checkpoints/checkpoint-N` folder of a stage, complete or not, by step: what an earlier run left."""
    return sorted(
        (p for p in (out_dir / "checkpoints").glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()),
        key=checkpoint_step,
    )


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The highest-step complete `checkpoints/checkpoint-N` folder of a stage, if any.

    A run killed while the Trainer saved a checkpoint leaves its folder without `trainer_state.json`, the file it
    writes last: resuming from it stopped with a FileNotFoundError traceback. It is passed over (with a line
    saying so) for the one before; the resumed run trains those steps again and saves that checkpoint over it.
    """
    found = checkpoint_folders(out_dir)
    while found and not (found[-1] / CHECKPOINT_COMPLETE_FILE).is_file():
        torn = found.pop()
        if main_process() and torn not in _TOLD_INCOMPLETE:  # once, though a run looks several times
            _TOLD_INCOMPLETE.add(torn)
            instead = f"{found[-1].name} is the last complete one" if found else "there is no complete one before it"
            logging.getLogger(__name__).warning(
                "%s is incomplete (no %s: the run stopped while saving it) and is passed over: %s",
                torn,
                CHECKPOINT_COMPLETE_FILE,
                instead,
            )
    return found[-1] if found else None


def main_process() -> bool:
    """True outside `accelerate launch` and on its main process (RANK 0), before the trainer exists to ask."""
    import os

    return os.environ.get("RANK", "0") == "0"


def drop_log_records_after(log_path: Path, step: int) -> None:
    """Remove the log records of steps after `step`, the checkpoint a run resumes from.

    An interrupted run logged the steps it trained after its last checkpoint; the resumed run trains those steps
    again and logs them again, so without this the log (and the report's curves) would hold two records for each.
    Starting at step 0, a validation record at step 0 (of the start model) goes too: the run validates it again.
    Only the main process rewrites the file (under `accelerate launch` every process runs this code).
    """
    if not main_process() or not log_path.is_file():
        return
    lines = [line for line in read_lines(log_path) if line.strip()]
    kept = []
    for record in read_jsonl(log_path, strict=False):  # the last line of a run killed while writing it goes
        if not isinstance(record, dict) or record.get("step", 0) > step:
            continue
        if step == 0 and record.get("step", 0) == 0 and "validation" in record:
            continue  # the start model's validation (RL's step 0) belongs to the run that starts at step 0 now
        kept.append(record)
    if len(kept) != len(lines):
        write_jsonl(log_path, kept)


def base_identity(loaded: Any, name: str | None = None) -> dict[str, Any]:
    """What must match for a checkpoint to be resumed on a model: architecture and vocabulary."""
    config = loaded.model.config
    return {
        "model": name or loaded.spec.name,
        "source": loaded.source,
        "model_type": getattr(config, "model_type", None),
        "hidden_size": getattr(config, "hidden_size", None),
        "num_hidden_layers": getattr(config, "num_hidden_layers", None),
        "vocab_size": len(loaded.tokenizer),
        "weights": weights_fingerprint(loaded.model),
    }


def restart_log_at(log_path: Path, checkpoint: Path | None) -> None:
    """Training starts at the checkpoint's step, or at 0 (a fresh run, or --resume before any checkpoint): no
    step logged after it, by an interrupted run or an earlier one that died before its first checkpoint, survives."""
    drop_log_records_after(log_path, checkpoint_step(checkpoint) if checkpoint else 0)


def sha256_file(path: Path) -> str:
    """The file's sha256, read in 1 MiB chunks."""
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def weights_fingerprint(model: Any, per_tensor: int = 256) -> str:
    """A short hash of the model's weights, so a model of the same architecture but other weights (another
    fine-tune of the same base, a re-initialised copy) is not taken for the base a checkpoint was trained on.

    It hashes the first `per_tensor` values of every parameter rounded to bf16, so loading the same model in
    fp32 or bf16 gives the same fingerprint; this reads a few KB per tensor, not the whole model.
    """
    import hashlib

    import torch

    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            values = param.detach().reshape(-1)[:per_tensor].to("cpu", torch.bfloat16).view(torch.int16)
            digest.update(name.encode())
            digest.update(values.numpy().tobytes())
    return digest.hexdigest()[:16]


# What a checkpoint's base model is, as `base_identity` records it: another one cannot continue its training.
BASE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "weights")


def checkpoint_state(
    base: dict[str, Any], settings: dict[str, Any] | None = None, train_sha256: str | None = None
) -> StageState:
    """What a training stage's checkpoints depend on: the base model they were trained from (its architecture,
    vocabulary and weights: the same path can hold other weights, a start model trained again in place), and, for a
    checkpoint to continue, the settings it and the data order depend on and the training file's sha256 (resuming
    replays the data order and skips the batches already seen: that only holds for the same data)."""
    state = StageState(dict(settings or {}), {f"base model {key}": base.get(key) for key in BASE_KEYS})
    if train_sha256 is not None:
        state.inputs["training file"] = train_sha256
    return state


def check_checkpoints(out_dir: Path, saved: StageState, now: StageState, *, base_model: Any) -> None:
    """Refuse to continue the checkpoints in `out_dir` with other settings or inputs (`run_state.check_resume`)."""
    check_resume(
        f"the checkpoints in {out_dir} (trained from '{base_model}')",
        saved,
        now,
        keep=f"the settings and inputs they were trained with (see {out_dir / CONFIG_FILE})",
        fresh="train into a new --out folder",
    )


def adapter_base(model_name: str) -> str | None:
    """What a LoRA trained on `model_name` must name as its base in adapter_config.json, where PEFT's own record
    would not load again: the embedded or hub name as the user wrote it (PEFT writes a cache path another machine
    lacks), or the start adapter's folder (PEFT records the bare base it wrapped, with that adapter merged in;
    our loader applies such a chain of adapters in order). None: PEFT's record is right."""
    from toolschool.models.spec import parse_model_spec

    spec = parse_model_spec(model_name)
    if spec.kind in ("embedded", "hub"):
        return model_name
    if spec.kind == "local" and (Path(spec.path_or_id) / "adapter_config.json").is_file():
        return str(Path(spec.path_or_id).resolve())
    return None


def fix_adapter_base(adapter_dir: Path, model_name: str) -> None:
    """Record `adapter_base(model_name)` as the base of the adapter saved in `adapter_dir`."""
    base = adapter_base(model_name)
    cfg_path = adapter_dir / "adapter_config.json"
    if base is None or not cfg_path.is_file():
        return
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = base
    write_text_atomic(cfg_path, json.dumps(cfg, indent=2))  # runs after trainer_state.json: never half a config


def adapter_base_callback(model_name: str) -> Any:
    """A trainer callback: every checkpoint's adapter names its base as `fix_adapter_base` does for `adapter/`,
    so `evaluate checkpoints/checkpoint-N` loads what was trained."""
    from transformers import TrainerCallback

    class AdapterBase(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):  # noqa: ANN001
            if state.is_world_process_zero:
                fix_adapter_base(Path(args.output_dir) / f"checkpoint-{state.global_step}", model_name)

    return AdapterBase()


def save_final(
    trainer: Any, tokenizer: Any, out_dir: Path, *, method: str, merge: bool, model_name: str
) -> tuple[Path | None, Path | None]:
    """Write `adapter/` (LoRA) and `merged/` (Hugging Face format) on the main process; returns both paths."""
    adapter_dir: Path | None = None
    merged_dir: Path | None = None
    if not trainer.is_world_process_zero():
        return None, None
    final = trainer.model
    if method == "lora":
        adapter_dir = out_dir / "adapter"
        final.save_pretrained(adapter_dir)
        tokenizer.save_pretrained(adapter_dir)
        fix_adapter_base(adapter_dir, model_name)
        if merge:
            merged_dir = out_dir / "merged"
            final.merge_and_unload().save_pretrained(merged_dir, safe_serialization=True)
            tokenizer.save_pretrained(merged_dir)
    else:
        merged_dir = out_dir / "merged"
        final.save_pretrained(merged_dir, safe_serialization=True)
        tokenizer.save_pretrained(merged_dir)
    return adapter_dir, merged_dir


def training_lock(out_dir: Path, stage: str) -> AbstractContextManager[None]:
    """The output folder's lock for one training run (its main process only: the other processes of an
    `accelerate launch` write into the same folder as part of the same run)."""
    from toolschool.run_state import folder_lock

    if not main_process():
        return nullcontext()
    return folder_lock(
        out_dir,
        ToolschoolError(
            f"{out_dir} is being trained into by another running {stage}",
            hint="wait for it to finish (or stop it: --resume then continues it), or train into another --out folder",
        ),
    )


def refuse_existing_checkpoints(out_dir: Path) -> None:
    if checkpoint_folders(out_dir):  # an incomplete one too: a run started there, and a fresh one would mix with it
        raise ToolschoolError(
            f"{out_dir} already holds checkpoints from an earlier run",
            hint="pass --resume to continue it, or choose another --out / run name",
        )


def log_callbacks(
    logger: JsonlLogger,
    tb_dir: Path,
    start_info: dict[str, Any],
    flatten: Any = None,
) -> list[Any]:
    """Trainer callbacks writing every log to the JSONL log (main process) and TensorBoard."""
    import time

    from torch.utils.tensorboard import SummaryWriter
    from transformers import TrainerCallback
    from transformers.integrations import TensorBoardCallback

    class LogCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001
            if state.is_world_process_zero:
                logger.write({"event": "start", "step": state.global_step, "time": time.time(), **start_info})

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            if state.is_world_process_zero and logs:
                record = flatten(logs) if flatten is not None else {"epoch": state.epoch, **logs}
                logger.write({"step": state.global_step, **record})

    return [LogCallback(), TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(tb_dir)))]


RUN_META_FILES = ("toolschool_sft.json", "toolschool_rl.json")


def trained_format(model: str | Path) -> tuple[str, Path] | None:
    """(the tool-call format, the metadata file saying so) of the SFT/RL run that wrote the model folder `model`
    (the file sits in the stage folder: above `merged/`, `adapter/` and `checkpoints/checkpoint-N/`), or None for
    any other model (embedded names, hub ids, endpoints, folders outside such a run)."""
    path = Path(model)
    if not path.is_dir():
        return None
    resolved = path.resolve()
    for folder in [resolved, *resolved.parents][:3]:
        for name in RUN_META_FILES:
            meta = folder / name
            if meta.is_file():
                try:
                    value = json.loads(meta.read_text(encoding="utf-8")).get("format")
                except (OSError, json.JSONDecodeError, AttributeError):
                    return None
                return (value, meta) if isinstance(value, str) else None
    return None
