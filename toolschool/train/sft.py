"""Supervised fine-tuning (LoRA or full) on tool-use conversations, with TRL's SFTTrainer.

What this module adds on top of TRL:
- examples are rendered by our chat format (`fmt.render`), so the loss weights (assistant tokens only,
  including each assistant turn's end-of-turn token) are defined in one place for training and inference;
- sequences longer than `max_length` are truncated and counted (validation prompts are counted and sent whole,
  as `toolschool eval` sends them), examples without an assistant turn are refused with the file and line;
- validation during training generates on validation samples through evaluation's local backend and logs the
  evaluation module's metrics (`toolschool.train.validation`, shared with RL);
- logs as JSONL (`train_log.jsonl`) and TensorBoard events; checkpoints every `checkpoint_interval` steps;
  `resume` continues at the same step with the same data order (the HF Trainer restores optimizer, scheduler,
  RNG and skips the batches already seen; we drop the log records written after that checkpoint, restore the
  token totals, refuse another base model or another training file, and only save the final model when the
  checkpoint is at num_steps);
- at the end a LoRA adapter (`adapter/`) and a merged model (`merged/`) in Hugging Face format.

Batching (`sft.batching`, see bench/sft.py for the measured figures):
- `shared_prefix` (default): batches group examples with the same rendered system block (system prompt + tool
  schemas); that block runs once per batch and only the rows' own tokens run on top of its keys/values
  (`toolschool.engine.shared_prefix_sft`; exact loss and gradients);
- `padding_free` (TRL `padding_free`): each batch is one concatenated sequence with per-example position ids;
  transformers builds a block-diagonal attention mask from them, so no compute is spent on padding;
- `padded`: TRL's default collator, each batch padded to its longest row.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from toolschool.chat.toolkens import rename_tools_and_calls, toolken
from toolschool.config import TRAIN_DTYPES, SFTSection, ToolschoolConfig, dump_toml
from toolschool.errors import ConfigError, DataError
from toolschool.run_state import write_text_atomic
from toolschool.train.common import (
    JsonlLogger,
    TrainingInputs,
    adapter_base_callback,
    base_identity,
    check_checkpoints,
    check_lora_targets,
    check_scheduler,
    checkpoint_state,
    checkpoint_step,
    latest_checkpoint,
    log_callbacks,
    lora_config,
    main_process,
    refuse_existing_checkpoints,
    restart_log_at,
    save_final,
    sha256_file,
    training_lock,
)
from toolschool.train.validation import (  # noqa: F401  (build_validation_items, validate: also imported from here)
    ValidationItem,
    build_validation_items,
    last_validation,
    load_validation_examples,
    split_at_first_assistant,
    validate,
    validation_callback,
)

META_FILE = "toolschool_sft.json"
log = logging.getLogger(__name__)


@dataclass
class PreparedData:
    rows: list[dict[str, Any]]
    examples: int = 0
    truncated: int = 0
    dropped_no_assistant_after_truncation: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    max_seen_length: int = 0

    def stats(self) -> dict[str, int]:
        data = asdict(self)
        data.pop("rows")
        return data


def check_has_assistant(examples: Sequence[dict[str, Any]], source: str) -> None:
    bad = [i for i, ex in enumerate(examples, 1) if not any(m.get("role") == "assistant" for m in ex["messages"])]
    if bad:
        shown = ", ".join(f"{source}:{i}" for i in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise DataError(
            f"{len(bad)} example(s) have no assistant turn, so there is nothing to learn: {shown}{more}",
            hint="every line needs at least one assistant message (a tool call or a final answer)",
        )


def prepare_examples(examples: Sequence[dict[str, Any]], fmt: Any, tokenizer: Any, max_length: int) -> PreparedData:
    """Render with the chat format into input_ids + labels (-100 where the loss weight is 0), truncating.

    Each row also records `prefix_length`: how many leading tokens are its rendered system block (system prompt +
    tool schemas), the part shared-prefix batching runs once per batch. It never reaches a learned token.
    """
    from toolschool.engine.shared_prefix_sft import PrefixFinder, prefix_length

    finder = PrefixFinder(tokenizer)
    data = PreparedData(rows=[])
    for example in examples:
        rendered = render_example(example, fmt, tokenizer)
        ids = list(rendered.input_ids)
        weights = list(rendered.loss_weights)
        data.examples += 1
        data.max_seen_length = max(data.max_seen_length, len(ids))
        if len(ids) > max_length:
            data.truncated += 1
            ids, weights = ids[:max_length], weights[:max_length]
        if not any(w > 0 for w in weights):
            data.dropped_no_assistant_after_truncation += 1
            continue
        labels = [tok if w > 0 else -100 for tok, w in zip(ids, weights, strict=True)]
        block = _system_block(example, fmt, finder)
        data.rows.append({"input_ids": ids, "labels": labels, "prefix_length": prefix_length(ids, labels, block)})
        data.tokens += len(ids)
        data.loss_tokens += sum(1 for w in weights if w > 0)
    return data


def render_example(example: dict[str, Any], fmt: Any, tokenizer: Any, **kwargs: Any) -> Any:
    """Render one dataset line with the chat format.

    Lines written already converted to a text format (`meta.format` = json/react: tool calls as text, no
    `tools`) are rendered as they are; converting them again would duplicate the format's instructions.
    """
    from toolschool.chat.formats import get_format

    pre = (example.get("meta") or {}).get("format")
    if pre and pre != "hermes":
        if pre != fmt.name:
            raise DataError(
                f"this dataset is already written in the '{pre}' format but training uses '{fmt.name}'",
                hint=f"pass --format {pre}, or use the dataset's hermes (canonical) files",
            )
        return get_format("hermes").render(example["messages"], None, tokenizer, **kwargs)
    return fmt.render(example["messages"], example.get("tools") or None, tokenizer, **kwargs)


def _system_block(example: dict[str, Any], fmt: Any, finder: Any) -> list[int]:
    """The tokens of an example's rendered leading system block, rendered the way `render_example` renders it."""
    from toolschool.chat.formats import get_format

    pre = (example.get("meta") or {}).get("format")
    if pre and pre != "hermes":
        messages, tools = get_format("hermes").to_messages(example["messages"], None)
    else:
        messages, tools = fmt.to_messages(example["messages"], example.get("tools") or None)
    return finder.system_block(messages, tools)


def _check_canonical_for_toolkens(examples: Sequence[dict[str, Any]], path: Path, lines: Sequence[int]) -> None:
    """Toolkens rename the calls of `tool_calls`; a line already written in a text format holds its calls as text,
    so no toolken would be added and the run would train without them. `lines`: each example's file line."""
    for number, example in zip(lines, examples, strict=True):
        written = (example.get("meta") or {}).get("format")
        if written not in (None, "hermes"):
            raise DataError(
                f"--toolkens needs canonical lines, but {path}:{number} is written in the {written} format "
                "(meta.format)",
                hint="train toolkens on the dataset's canonical (hermes) file with --format json/react if wanted",
            )


def apply_toolkens(examples: Sequence[dict[str, Any]]) -> list[str]:
    """STE "toolkens": the tool names, each to be added as one new token `<tool_NAME>`.

    The rendered calls keep the plain name inside the JSON; the tokenizer then encodes the name through the
    added token where it appears as `<tool_NAME>` — so we rewrite each call's name to its toolken form and
    each tool schema's name likewise, making the tool choice a single-token decision.
    """
    names: set[str] = set()
    for example in examples:
        for tool in example.get("tools") or []:
            names.add(tool["function"]["name"])
        for message in example["messages"]:
            for call in message.get("tool_calls") or []:
                names.add(call["function"]["name"])
    for example in examples:
        rename_tools_and_calls(example.get("tools") or [], example["messages"], toolken)
    return sorted(names)


def _make_callbacks(
    logger: JsonlLogger,
    tokenizer: Any,
    fmt: Any,
    items: list[ValidationItem],
    settings: SFTSection,
    stats: dict[str, int],
    tb_dir: Path,
    toolkens: bool,
) -> list[Any]:
    validation = validation_callback(
        logger,
        tb_dir,
        tokenizer,
        fmt,
        items,
        interval=settings.validation_interval,
        max_new_tokens=settings.validation_max_tokens,
        toolkens=toolkens,
    )
    return [*log_callbacks(logger, tb_dir, stats), validation]


@dataclass
class SFTResult:
    out_dir: Path
    adapter_dir: Path | None
    merged_dir: Path | None
    steps: int
    seconds: float
    stats: dict[str, int] = field(default_factory=dict)
    final_validation: dict[str, float] | None = None
    precision: str = "fp32"  # what `[sft] dtype` resolved to here (`models.device.train_precision`): fp32 | bf16
    # False on the other processes of an `accelerate launch` run: they save nothing and report nothing
    main_process: bool = True


# What SFT is handed: the model it starts from, its training and validation files (`common.TrainingInputs`).
SFTInputs = TrainingInputs

TRAIN_HINT = "pass --train PATH (a JSONL of conversations) or run `toolschool distill` first"


def resume_settings(config: ToolschoolConfig, batching: str) -> dict[str, Any]:
    """The settings a checkpoint and the run's data order depend on, as `sft.KEY` / `model.KEY` / `lora.KEY` /
    `run.seed` -> value.

    A resumed run must keep them: another LoRA shape, method or toolkens setting cannot load the checkpoint, and
    another batch size, rendering (format, max_length) or batching makes the batches it skips other batches than
    the ones the checkpoint trained on. Others (num_steps, learning rate, intervals, validation) may change.
    """
    settings, adapter = config.sft, config.lora
    lora = settings.method == "lora"
    grouped = batching in ("shared_prefix", "padded")  # padding_free ignores group_by_length
    return {
        "sft.method": settings.method,
        "lora.rank": adapter.rank if lora else None,
        "lora.alpha": adapter.alpha if lora else None,
        "lora.target_modules": list(adapter.target_modules) if lora else None,
        "model.toolkens": config.model.toolkens,
        "model.format": config.model.format,
        "sft.max_length": settings.max_length,
        "sft.batching": batching,
        "sft.group_by_length": settings.group_by_length if grouped else None,
        "sft.batch_size": settings.batch_size,
        "sft.gradient_accumulation": settings.gradient_accumulation,
        "run.seed": config.run.seed,
    }


def run_sft(
    config: ToolschoolConfig, inputs: SFTInputs, out_dir: Path, *, resume: bool = False, progress: bool = True
) -> SFTResult:
    """Train `inputs.start_model` on `inputs.train` with the config's settings into `out_dir`; returns where the
    adapter and merged model were written. It reads no other file than its inputs (and `out_dir`)."""
    with ExitStack() as held:  # the folder's lock, from when the run first looks into the folder
        return _run_sft(config, inputs, out_dir, resume=resume, progress=progress, held=held)


def _run_sft(
    config: ToolschoolConfig, inputs: SFTInputs, out_dir: Path, *, resume: bool, progress: bool, held: ExitStack
) -> SFTResult:
    inputs.check_files(TRAIN_HINT)  # a missing file: before the slow imports and model
    train_path, validation_path, start_model = inputs.train, inputs.validation, inputs.start_model
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from toolschool.chat.formats import get_format
    from toolschool.data.dataset import load_dataset_jsonl
    from toolschool.engine.shared_prefix_sft import (
        SharedPrefixCollator,
        check_prefixes_shareable,
        shared_prefix_trainer,
        with_resumable_token_counts,
    )
    from toolschool.models.device import resolve_device, train_precision
    from toolschool.models.loading import load_model
    from toolschool.train.whole_run import WholeRunTotals, checkpoint_seconds

    settings = config.sft
    if settings.method not in ("lora", "full"):
        raise ConfigError(f"sft.method = '{settings.method}' is not supported", hint="use lora or full")
    if settings.dtype not in TRAIN_DTYPES:
        raise ConfigError(f"sft.dtype = '{settings.dtype}' is not supported", hint=f"use {', '.join(TRAIN_DTYPES)}")
    precision = train_precision(settings.dtype, resolve_device(config.model.device))
    check_scheduler(settings.lr_scheduler, "sft")
    batching = resolve_batching(settings)
    fmt = get_format(config.model.format)

    train_examples, train_report = load_dataset_jsonl(train_path, on_error="stop")
    if not train_examples:
        raise DataError(f"training data '{train_path}' holds no examples")
    check_has_assistant(train_examples, str(train_path))
    if config.model.toolkens:
        _check_canonical_for_toolkens(train_examples, train_path, train_report.kept_lines)
    validation_examples, _ = load_validation_examples(validation_path, required=not inputs.validation_optional)

    started = time.perf_counter()
    # A start model that is a LoRA adapter is merged in: a new LoRA trains on top (its adapter/ and checkpoints
    # name the start adapter as base, see common.adapter_base) or full training updates the merged weights.
    # bf16 is mixed precision (`bf16=` below autocasts the products): the weights stay fp32, since a bf16 weight drops
    # an update under ~1/256 of its size (most of them at fine-tuning rates), and so do a LoRA run's base (merged/
    # is then the fp32 sum) and its toolken embeddings (PEFT's modules_to_save keep the base's dtype)
    loaded = load_model(start_model, device=config.model.device, dtype="fp32", merge_adapter=True)
    model, tokenizer = loaded.model, loaded.tokenizer
    if settings.method == "full":
        model.requires_grad_(True)  # PEFT left the merged weights frozen as it loaded them
    else:
        check_lora_targets(model, config.lora.target_modules)
    identity = base_identity(loaded)

    held.enter_context(training_lock(out_dir, "sft"))  # a second run at once would write the same files
    checkpoint = latest_checkpoint(out_dir) if resume else None
    train_sha256 = sha256_file(train_path)
    settings_now = resume_settings(config, batching)
    if resume and (out_dir / META_FILE).is_file():
        meta = json.loads((out_dir / META_FILE).read_text())
        continued = checkpoint is not None  # a checkpoint to continue: its settings and data too, not only its base
        saved = checkpoint_state(
            meta["base"],
            meta.get("resume_settings") if continued else None,
            meta.get("train_sha256") if continued else None,
        )
        now = checkpoint_state(identity, settings_now if continued else None, train_sha256 if continued else None)
        check_checkpoints(out_dir, saved, now, base_model=meta["base"].get("model"))
    elif not resume:
        refuse_existing_checkpoints(out_dir)
    restart_log_at(out_dir / "train_log.jsonl", checkpoint)

    toolkens: list[str] = []
    if config.model.toolkens:
        toolkens = apply_toolkens(train_examples)
        apply_toolkens(validation_examples)
        added = tokenizer.add_tokens([toolken(n) for n in toolkens], special_tokens=False)
        if added:
            model.resize_token_embeddings(len(tokenizer))

    prepared = prepare_examples(train_examples, fmt, tokenizer, settings.max_length)
    if not prepared.rows:
        raise DataError(
            f"no training example keeps an assistant token within max_length={settings.max_length}",
            hint="raise --max-length ([sft] max_length in the config)",
        )
    stats = prepared.stats()
    if (warning := truncation_warning(stats, settings.max_length)) and main_process():
        log.warning("sft: %s", warning)  # before training: the count is also in the log and the summary
    items = build_validation_items(
        validation_examples, fmt, tokenizer, settings.validation_samples, settings.max_length
    )
    # Such a prompt would be cut in training; validation sends it whole, as `toolschool eval` does: counted.
    stats["validation_prompts_over_max_length"] = sum(item.over_max_length for item in items)

    out_dir.mkdir(parents=True, exist_ok=True)
    # the settings this run trains with; every process of an `accelerate launch` writes them, so atomically
    write_text_atomic(
        out_dir / "config.toml", dump_toml(inputs.recorded(config, "sft", validates=bool(validation_examples)))
    )
    write_text_atomic(
        out_dir / META_FILE,
        json.dumps(
            {
                "base": identity,
                "format": fmt.name,
                "method": settings.method,
                "batching": batching,
                "toolkens": toolkens,
                "train_sha256": train_sha256,
                "resume_settings": settings_now,
                "data": stats,
            },
            indent=2,
        ),
    )
    logger = JsonlLogger(out_dir / "train_log.jsonl")
    # the run's seconds and loss across resumes, not only this session's
    totals = WholeRunTotals(out_dir / "train_log.jsonl", checkpoint_seconds(checkpoint), started)
    peft_config = None
    if settings.method == "lora":
        peft_config = lora_config(config.lora, modules_to_save=["embed_tokens", "lm_head"] if toolkens else None)
    use_cpu = loaded.device == "cpu"
    args = SFTConfig(
        output_dir=str(out_dir / "checkpoints"),
        max_steps=settings.num_steps,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.gradient_accumulation,
        learning_rate=settings.learning_rate,
        warmup_steps=settings.warmup_steps,
        weight_decay=settings.weight_decay,
        lr_scheduler_type=settings.lr_scheduler,
        logging_steps=settings.log_interval,
        save_strategy="steps",
        save_steps=settings.checkpoint_interval,
        seed=config.run.seed,
        data_seed=config.run.seed,
        # Examples are already truncated (and counted) by prepare_examples.
        max_length=settings.max_length if batching == "padded" else None,
        padding_free=batching == "padding_free",
        train_sampling_strategy="group_by_length" if settings.group_by_length and batching == "padded" else "random",
        # The shared-prefix collator reads each row's `prefix_length` column, which TRL would drop.
        remove_unused_columns=batching != "shared_prefix",
        report_to="none",
        use_cpu=use_cpu,
        bf16=precision == "bf16",
        dataloader_num_workers=0,
        # TRL turns activation checkpointing on by default; on a 135M model it only costs ~1/3 more compute.
        activation_checkpointing=settings.gradient_checkpointing,  # transformers 5 name; the old one warns
        disable_tqdm=not progress,
        save_only_model=False,
    )
    trainer_class: type = SFTTrainer
    extra: dict[str, Any] = {}
    if batching == "shared_prefix":
        check_prefixes_shareable(prepared.rows)
        keys = [tuple(row["input_ids"][: row["prefix_length"]]) for row in prepared.rows]
        lengths = [len(row["input_ids"]) - row["prefix_length"] for row in prepared.rows]
        trainer_class = shared_prefix_trainer(keys, lengths if settings.group_by_length else None)
        extra["data_collator"] = SharedPrefixCollator(tokenizer.pad_token_id)
        rows = prepared.rows
    else:
        rows = [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in prepared.rows]
    dataset = Dataset.from_list(rows)
    trainer = with_resumable_token_counts(trainer_class)(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[
            totals,  # first: it rewrites the final figures before the log callback writes them
            *_make_callbacks(
                logger, tokenizer, fmt, items, settings, stats, out_dir / "tensorboard", config.model.toolkens
            ),
            *([adapter_base_callback(start_model)] if settings.method == "lora" else []),
        ],
        **extra,
    )
    if checkpoint is not None and checkpoint_step(checkpoint) >= settings.num_steps:
        # Nothing left to train (a finished run, or one stopped while saving its final model): the HF Trainer
        # would still run one more step when the checkpoint is not at an epoch end, so load it and only save.
        from transformers.trainer_callback import TrainerState

        trainer._load_from_checkpoint(str(checkpoint))
        trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
        if trainer.is_world_process_zero():  # the log still says this run resumed here, like a training start
            logger.write(
                {"event": "start", "step": trainer.state.global_step, "time": time.time(), **stats, "trained": False}
            )
    else:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)

    adapter_dir, merged_dir = save_final(
        trainer, tokenizer, out_dir, method=settings.method, merge=settings.merge, model_name=start_model
    )
    final_validation = last_validation(out_dir / "train_log.jsonl")
    seconds = totals.seconds()
    if trainer.is_world_process_zero():  # every process of an `accelerate launch` run gets here
        logger.write({"event": "end", "step": trainer.state.global_step, "seconds": round(seconds, 1)})
    return SFTResult(
        out_dir=out_dir,
        adapter_dir=adapter_dir,
        merged_dir=merged_dir,
        steps=trainer.state.global_step,
        seconds=seconds,
        stats=stats,
        final_validation=final_validation,
        precision=precision,
        main_process=trainer.is_world_process_zero(),
    )


def truncation_warning(stats: dict[str, int], max_length: int) -> str | None:
    """What to tell the user when training examples were cut at `max_length` (None when none were)."""
    cut = stats.get("truncated", 0)
    if not cut:
        return None
    dropped = stats.get("dropped_no_assistant_after_truncation", 0)
    left_out = f" ({dropped} of them kept no assistant token and are left out)" if dropped else ""
    return (
        f"{cut} of {stats.get('examples', 0)} training examples are longer than max_length = {max_length} and were "
        f"cut{left_out}; raise --max-length to train on them whole ([sft] max_length in the config)"
    )


def resolve_batching(settings: SFTSection) -> str:
    """`sft.batching`, honouring the older `sft.padding_free` flag (true = padding_free, false = padded)."""
    from toolschool.engine.shared_prefix_sft import BATCHING_MODES

    if settings.batching not in BATCHING_MODES:
        raise ConfigError(
            f"sft.batching = '{settings.batching}' is not supported", hint=f"use one of {', '.join(BATCHING_MODES)}"
        )
    if settings.padding_free is None:
        batching = settings.batching
    else:
        implied = "padding_free" if settings.padding_free else "padded"
        if "batching" in settings.model_fields_set and settings.batching != implied:
            raise ConfigError(
                f"sft.padding_free = {str(settings.padding_free).lower()} contradicts "
                f"sft.batching = '{settings.batching}'",
                hint="remove sft.padding_free (superseded by sft.batching) and keep only sft.batching",
            )
        batching = implied
    if batching == "shared_prefix" and settings.gradient_checkpointing:
        raise ConfigError(
            "sft.gradient_checkpointing does not work with sft.batching = 'shared_prefix' (the shared prefix's "
            "keys and values must stay cached for the rows)",
            hint="set sft.batching = 'padding_free' to recompute activations, or turn gradient_checkpointing off",
        )
    return batching


__all__ = [
    "PreparedData",
    "SFTInputs",
    "SFTResult",
    "apply_toolkens",
    "build_validation_items",
    "check_has_assistant",
    "latest_checkpoint",
    "prepare_examples",
    "resolve_batching",
    "run_sft",
    "split_at_first_assistant",
    "validate",
]
