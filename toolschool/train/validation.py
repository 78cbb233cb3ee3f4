"""Validation during training, shared by `toolschool sft` and `toolschool rl`: greedy replies to held-out prompts,
scored with the evaluation module's metrics (`toolschool.evaluate.metrics`), so a validation rate and a
`toolschool eval` rate on the same lines agree.

Each check writes `{"step": N, "validation": {rates}}` to the stage's train_log.jsonl and `validation/<rate>` to
its TensorBoard events; `toolschool report` plots the records of each stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolschool.chat.toolkens import plain_name, with_renamed_calls
from toolschool.errors import DataError
from toolschool.evaluate.items import split_at_first_assistant
from toolschool.models.backend import ContextLengthError, GenerationRequest, SamplingParams
from toolschool.run_state import read_jsonl
from toolschool.train.common import JsonlLogger


@dataclass
class ValidationItem:
    messages: list[dict[str, Any]]  # the prompt as `toolschool eval` sends it (`evaluate.runner.sent_messages`)
    prompt_tools: list[dict[str, Any]] | None  # the tools it sends beside it (None: the format's text holds them)
    prompt_ids: list[int]  # the prompt the local backend renders from those, with the format's prefill
    tools: list[dict[str, Any]] | None
    # The prompt is longer than max_length: training cuts such a sequence (from the left, losing the system prompt
    # with the tools); validation sends it whole, as `toolschool eval` does (counted in the stage's summary).
    over_max_length: bool = False
    # What evaluation scores the reply against (evaluate.items.item_from_example): the gold turn's calls and, when
    # it makes none, the expected answer (meta.expected_answer, else the conversation's last answer text).
    gold_calls: list[dict[str, Any]] = field(default_factory=list)
    gold_answer: str | None = None


def build_validation_items(
    examples: Sequence[dict[str, Any]], fmt: Any, tokenizer: Any, limit: int, max_length: int
) -> list[ValidationItem]:
    """Prompts of the first `limit` examples (their first assistant turn is what is scored), built and with the
    gold read as evaluation builds and reads them, so validation rates and `toolschool eval` rates on the same
    lines agree."""
    from toolschool.engine.local_backend import render_prompt
    from toolschool.evaluate.items import scored_turn
    from toolschool.evaluate.runner import sent_messages

    items = []
    for index, example in enumerate(examples[:limit]):
        scored = scored_turn(example, index)
        answer = scored.expected_answer if scored.expected_answer is not None else scored.gold_final
        messages, tools = sent_messages(fmt, scored, scored.messages, scored.tools)
        request = GenerationRequest(messages, tools, prefill=fmt.prefill)
        ids = render_prompt(tokenizer, request, "the model")
        items.append(
            ValidationItem(
                messages=messages,
                prompt_tools=tools,
                prompt_ids=ids,
                tools=example.get("tools"),
                over_max_length=len(ids) > max_length,
                gold_calls=list(scored.gold_calls),
                gold_answer=None if scored.gold_calls else answer,
            )
        )
    return items


def generate_replies(
    model: Any, tokenizer: Any, requests: Sequence[GenerationRequest], *, max_batch_size: int = 16
) -> list[str | ContextLengthError]:
    """Replies of the local backend `toolschool eval` generates with (`LocalBackend`: continuous batching, the
    shared system prompt and tool list prefilled once, prepacked weights), built around the model being trained;
    a prompt the model's context cannot hold gives its ContextLengthError, scored as evaluation scores it.

    The backend forwards through a view of the model that shares its parameters (`packed_weights.packed_view`, LoRA
    folded in, re-packed whenever a weight changed) and leaves the model, its modules' modes and its config as
    they are. It is built for one validation and closed after it (its worker thread ends, its KV caches and packed
    weights are freed before training goes on); an error in generation ends the validation with that error.
    """
    import asyncio

    from toolschool.engine.local_backend import LocalBackend
    from toolschool.models.loading import LoadedModel
    from toolschool.models.spec import ModelSpec

    param = next(model.parameters())
    loaded = LoadedModel(
        spec=ModelSpec(kind="local", name="validation", path_or_id=""),
        model=model,
        tokenizer=tokenizer,
        source="the model being trained",
        device=str(param.device),
        dtype=param.dtype,
        load_seconds=0.0,
    )

    async def run() -> list[str | ContextLengthError]:
        backend = LocalBackend(loaded, max_batch_size=max_batch_size)
        try:
            results = await asyncio.gather(*(backend.generate(r) for r in requests), return_exceptions=True)
        finally:
            await backend.aclose()
        replies: list[str | ContextLengthError] = []
        for result in results:
            if isinstance(result, ContextLengthError):
                replies.append(result)
            elif isinstance(result, BaseException):
                raise result
            else:
                replies.append(result[0].text)
        return replies

    return asyncio.run(run())


def validate(
    model: Any,
    tokenizer: Any,
    fmt: Any,
    items: Sequence[ValidationItem],
    *,
    max_new_tokens: int,
    batch_size: int = 16,
    toolkens: bool = False,
) -> dict[str, float]:
    """Greedy replies to the validation prompts, from the local backend as `toolschool eval` generates them (at
    most `batch_size` decoded together), scored with the evaluation module's metrics."""
    from torch.nn.parallel import DistributedDataParallel

    from toolschool.evaluate.metrics import aggregate, score_item
    from toolschool.evaluate.runner import context_full_reply

    if isinstance(model, DistributedDataParallel):  # the Trainer hands callbacks its unwrapped model; in case not
        model = model.module
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0.0, stop=list(fmt.stop))
    requests = [GenerationRequest(i.messages, i.prompt_tools, params, prefill=fmt.prefill) for i in items]
    modes = {module: module.training for module in model.modules()}
    model.eval()  # the backend's view is in eval mode anyway; this covers a model it runs unwrapped (GPU)
    try:
        replies = generate_replies(model, tokenizer, requests, max_batch_size=batch_size)
    finally:
        for module, training in modes.items():
            module.training = training
    scores = []
    for item, reply in zip(items, replies, strict=True):
        if isinstance(reply, ContextLengthError):  # as `toolschool eval` scores it: a failed reply
            parsed = context_full_reply(reply)
        else:
            parsed = fmt.parse(fmt.prefill + reply if fmt.prefill else reply, item.prompt_tools)
        gold_calls = item.gold_calls
        if toolkens:
            parsed.calls[:] = with_renamed_calls(parsed.calls, plain_name)
            gold_calls = with_renamed_calls(gold_calls, plain_name)
        scores.append(score_item(parsed, gold_calls, item.gold_answer, format_name=fmt.name))
    return aggregate(scores)


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
    return {
        record.get("step")
        for record in read_jsonl(log_path, strict=False)
        if isinstance(record, dict) and isinstance(record.get("validation"), dict)
    }


def last_validation(log_path: Path) -> dict[str, float] | None:
    """The rates of a log's last validation record (what a run ended at), or None."""
    if not log_path.is_file():
        return None
    for record in reversed(read_jsonl(log_path, strict=False)):
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
    "generate_replies",
    "last_validation",
    "load_validation_examples",
    "split_at_first_assistant",
    "validate",
    "validation_callback",
    "validation_steps",
]
