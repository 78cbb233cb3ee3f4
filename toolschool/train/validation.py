"""Validation during training, shared by `toolschool sft` and `toolschool rl`: greedy replies to held-out prompts,
scored with the evaluation module's metrics (`toolschool.evaluate.metrics`), so a validation rate and a
`toolschool eval` rate on the same lines agree.

Each check writes `{"step": N, "validation": {rates}}` to the stage's train_log.jsonl and `validation/<rate>` to
its TensorBoard events; `toolschool report` plots the records of each stage.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolschool.chat.toolkens import plain_name, with_renamed_calls
from toolschool.errors import ConfigError, DataError
from toolschool.files import read_lines
from toolschool.train.common import JsonlLogger


def split_at_first_assistant(messages: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(prompt messages, first assistant message) — the unit validation and evaluation score."""
    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            return list(messages[:index]), message
    raise DataError("conversation has no assistant turn")


@dataclass
class ValidationItem:
    prompt_ids: list[int]
    gold: dict[str, Any]
    tools: list[dict[str, Any]] | None
    truncated: bool = False  # the prompt was longer than max_length and lost its start (system prompt, tools)
    # What evaluation scores the reply against (evaluate.items.item_from_example): the gold turn's calls and, when
    # it makes none, the expected answer (meta.expected_answer, else the conversation's last answer text).
    gold_calls: list[dict[str, Any]] = field(default_factory=list)
    gold_answer: str | None = None


def build_validation_items(
    examples: Sequence[dict[str, Any]], fmt: Any, tokenizer: Any, limit: int, max_length: int
) -> list[ValidationItem]:
    """Prompts of the first `limit` examples (their first assistant turn is what is scored), with the gold read
    as evaluation reads it, so validation rates and `toolschool eval` rates on the same lines agree."""
    from toolschool.evaluate.items import item_from_example

    items = []
    for index, example in enumerate(examples[:limit]):
        prompt, gold = split_at_first_assistant(example["messages"])
        scored = item_from_example(example, index)
        assert scored is not None  # split_at_first_assistant found the assistant turn
        answer = scored.expected_answer if scored.expected_answer is not None else scored.gold_final
        pre = (example.get("meta") or {}).get("format")
        if pre and pre != "hermes":  # already converted to a text format (see render_example)
            messages, tools = prompt, None
        else:
            messages, tools = fmt.to_messages(prompt, example.get("tools") or None)
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text + fmt.prefill, add_special_tokens=False)["input_ids"]
        items.append(
            ValidationItem(
                prompt_ids=ids[-max_length:],
                gold=gold,
                tools=example.get("tools"),
                truncated=len(ids) > max_length,
                gold_calls=list(scored.gold_calls),
                gold_answer=None if scored.gold_calls else answer,
            )
        )
    return items


def generate_batch(
    model: Any, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int, stop: list[str]
) -> list[str]:
    """Greedy generation for a batch of token prompts (left padded); stops at end of turn and stop strings.

    It ends a reply where evaluation's local backend does (any end-of-turn token: <|im_end|>, the tokenizer's and
    the model's eos) and decodes it the same way, so validation scores the replies `toolschool eval` would see.
    """
    import torch

    from toolschool.models.backends.local import end_of_turn_ids

    ends = sorted(end_of_turn_ids(tokenizer, model))
    pad = tokenizer.pad_token_id
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
        attention[row, width - len(prompt) :] = 1
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=ends,
            stop_strings=stop or None,
            tokenizer=tokenizer if stop else None,
        )
    texts = []
    for row in range(len(prompts)):
        new = out[row, width:].tolist()
        end = next((i for i, token in enumerate(new) if token in ends), len(new))
        text = tokenizer.decode(new[:end], skip_special_tokens=False)
        for s in stop:
            if s in text:
                text = text[: text.index(s)]
        texts.append(text)
    return texts


def validate(
    model: Any,
    tokenizer: Any,
    fmt: Any,
    items: Sequence[ValidationItem],
    *,
    max_new_tokens: int,
    batch_size: int = 8,
    toolkens: bool = False,
) -> dict[str, float]:
    """Generate on validation prompts and score with the evaluation module's metrics."""
    from toolschool.evaluate.metrics import aggregate, score_item

    was_training = model.training
    model.eval()
    scores = []
    try:
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            texts = generate_batch(model, tokenizer, [i.prompt_ids for i in chunk], max_new_tokens, fmt.stop)
            for item, text in zip(chunk, texts, strict=True):
                parsed = fmt.parse(fmt.prefill + text if fmt.prefill else text)
                gold_calls = item.gold_calls
                if toolkens:
                    parsed.calls[:] = with_renamed_calls(parsed.calls, plain_name)
                    gold_calls = with_renamed_calls(gold_calls, plain_name)
                scores.append(score_item(parsed, gold_calls, item.gold_answer, format_name=fmt.name))
    finally:
        if was_training:
            model.train()
    return aggregate(scores)


def resolve_validation_path(explicit: str | None, *, train_explicit: bool, run_dir: Path, flag: str) -> Path | None:
    """The validation file of a training stage: `explicit` (which must exist), else the run's
    distill/validation.jsonl when the stage trains on the run's distill/train.jsonl (a training file given
    explicitly gets no validation from the run's split: it may come from elsewhere), else None."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            state = "is not a file" if path.exists() else "does not exist"
            raise ConfigError(f"validation data '{path}' {state}", hint=f"check {flag} PATH")
        return path
    candidate = run_dir / "distill" / "validation.jsonl"
    return candidate if candidate.is_file() and not train_explicit else None


def load_validation_examples(path: Path | None, *, required: bool) -> tuple[list[dict[str, Any]], list[int]]:
    """The examples of a validation file (and their file lines), each with an assistant turn to score. `required`
    (the file was named by the user): one holding no example is refused rather than validating nothing."""
    from toolschool.data.dataset import load_dataset_jsonl
    from toolschool.train.sft import check_has_assistant

    if path is None:
        return [], []
    examples, report = load_dataset_jsonl(path, on_error="stop")
    if required and not examples:
        raise DataError(
            f"validation data '{path}' holds no examples", hint="point --validation at a JSONL of conversations"
        )
    check_has_assistant(examples, str(path))
    return examples, list(report.kept_lines)


def validation_steps(log_path: Path) -> set[int]:
    """The steps a log already holds a validation record for (a resumed run does not validate them again)."""
    if not log_path.is_file():
        return set()
    steps = set()
    for line in read_lines(log_path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("validation"), dict):
            steps.add(record.get("step"))
    return steps


def last_validation(log_path: Path) -> dict[str, float] | None:
    """The rates of a log's last validation record (what a run ended at), or None."""
    if not log_path.is_file():
        return None
    for line in reversed(read_lines(log_path)):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("validation"), dict):
            return record["validation"]
    return None


def validation_callback(
    logger: JsonlLogger,
    tb_dir: Path,
    tokenizer: Any,
    fmt: Any,
    items: Sequence[ValidationItem],
    *,
    interval: int,
    max_new_tokens: int,
    toolkens: bool = False,
    at_start: bool = False,
) -> Any:
    """A trainer callback validating every `interval` steps and at the end of training (and, `at_start`, before
    the first step: the model training starts from). Steps the log already holds a validation record for (a run
    resumed at a checkpoint the interrupted run had validated) are not validated again."""
    from torch.utils.tensorboard import SummaryWriter
    from transformers import TrainerCallback

    done = validation_steps(logger.path)

    class ValidationCallback(TrainerCallback):
        def __init__(self) -> None:
            self.writer: Any = None

        def _run(self, state, model) -> None:  # noqa: ANN001
            if not items or not state.is_world_process_zero or state.global_step in done:
                return
            metrics = validate(model, tokenizer, fmt, items, max_new_tokens=max_new_tokens, toolkens=toolkens)
            logger.write({"step": state.global_step, "validation": metrics})
            done.add(state.global_step)
            if self.writer is None:
                self.writer = SummaryWriter(log_dir=str(tb_dir))
            for key, value in metrics.items():
                if isinstance(value, int | float):
                    self.writer.add_scalar(f"validation/{key}", value, state.global_step)
            self.writer.flush()

        def on_train_begin(self, args, state, control, model=None, **kwargs):  # noqa: ANN001
            if at_start and state.global_step == 0:
                self._run(state, model)

        def on_step_end(self, args, state, control, model=None, **kwargs):  # noqa: ANN001
            if state.global_step % interval == 0 and state.global_step < state.max_steps:
                self._run(state, model)

        def on_train_end(self, args, state, control, model=None, **kwargs):  # noqa: ANN001
            self._run(state, model)

    return ValidationCallback()


__all__ = [
    "ValidationItem",
    "build_validation_items",
    "generate_batch",
    "last_validation",
    "load_validation_examples",
    "resolve_validation_path",
    "split_at_first_assistant",
    "validate",
    "validation_callback",
    "validation_steps",
]
