"""The training-data contract: one conversation per JSON line, `{"messages", "tools", "meta"}`.

Every reader in toolschool goes through `validate_example`, and every bad line is reported as
`file:line: reason` — then skipped or fatal, per `on_error` — never dropped silently. Tool-call arguments
stay JSON objects (dicts), as chat templates and TRL expect; `datasets.load_dataset("json", ...)` (datasets
>= 5) stores columns whose structure differs between lines (calculator `{"expression"}` vs python `{"code"}`
arguments) with its `Json` feature, so they load back exactly, without null-filled keys from other lines
(tests/data/test_dataset.py checks the round trip).

Sources are a local path or, when online, a Hugging Face dataset id; the project never needs a fixed folder.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from toolschool.chat.formats import FORMAT_NAMES
from toolschool.chat.types import Message, ToolSchema, arguments_from_wire
from toolschool.errors import DataError
from toolschool.tools.validation import validation_error

OnError = Literal["skip", "stop"]
ON_ERROR_CHOICES = ("skip", "stop")
EXAMPLE_KEYS = ("messages", "tools", "meta")
# What a message may carry. Anything else (a `tool_call` typo, OpenAI's legacy `function_call`) is read by no chat
# template, so a call written there would silently vanish from training.
MESSAGE_KEYS = frozenset(
    {"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content", "thinking", "refusal", "weight"}
)
META_STRING_KEYS = ("tool", "source", "category", "expected_answer", "split", "id", "original_id", "format")


@dataclass
class DatasetReport:
    """What a load found: how many lines were read and kept, and each bad line as `file:line: reason`."""

    source: str
    lines: int = 0
    kept: int = 0
    errors: list[str] = field(default_factory=list)
    # the file line of each kept example, in order (a local file; blank and skipped lines make them differ)
    kept_lines: list[int] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return len(self.errors)

    def summary(self) -> str:
        return f"{self.source}: {self.lines} lines, {self.kept} kept, {self.skipped} skipped"


# Words, and the arithmetic operators as tokens of their own: "1234 * 5678" and "1234 + 5678" ask for different
# calls, so they must not normalise to the same text; sentence punctuation ("?", ",", quotes) carries no request.
_REQUEST_TOKEN = re.compile(r"\w+|[-+*/×÷^%=<>]", re.UNICODE)


def same_request_key(text: str) -> str:
    """What makes two questions, prompts or queries the same request: their words, numbers and arithmetic operators
    in order, whatever the case, spacing and sentence punctuation (NFKC: `１２` = `12`).

    The one definition of "the same request": `What is 2+3?` and `what is  2 + 3` as two records could go one to
    train and one to validation. Dataset builds and distill dedupe with it (distill's near-duplicate test compares
    its tokens), distill splits by it, and the built-in held-out set and ICL retrieval leave out an item's own
    copies by it, so a request one of them calls new is new to all of them.
    """
    return " ".join(_REQUEST_TOKEN.findall(unicodedata.normalize("NFKC", text).casefold()))


def _pydantic_reason(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "; ".join(parts)


ARROW_NULLS = (
    "a file written from an Arrow table (datasets' to_json of a Hub or parquet dataset) gives every row the keys "
    "of all rows as null; drop the null keys (toolschool.data.dataset.without_nulls), or read the Hub dataset by "
    "its id"
)


def validate_example(example: Any) -> str | None:
    """Return why `example` is not a valid dataset line, or None when it is.

    Checks the shape (messages/tools/meta), each message and tool schema against the canonical types, that
    arguments are JSON objects that fit the declared tool's parameters, that calls name a tool the line
    declares, that each call gets its tool result (matching `tool_call_id` when both carry ids) before the
    conversation goes on (it may end on a call), that a system or user message comes before the first assistant
    turn (the prompt training and validation condition on), that `meta.format` is a format training can
    render, and that the conversation ends with the assistant (what training learns from).
    """
    if not isinstance(example, dict):
        return f"a line must be a JSON object with keys {', '.join(EXAMPLE_KEYS)}, got {type(example).__name__}"
    example = with_decoded_arguments(example)
    unknown = sorted(set(example) - set(EXAMPLE_KEYS))
    if unknown:
        return f"unknown key(s) {', '.join(unknown)} (allowed: {', '.join(EXAMPLE_KEYS)}; put extras in meta)"
    messages = example.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list of chat messages"
    tools = example.get("tools", [])
    if not isinstance(tools, list):
        return f"'tools' must be a list of OpenAI function schemas, got {type(tools).__name__}"
    meta = example.get("meta", {})
    if not isinstance(meta, dict):
        return f"'meta' must be a JSON object, got {type(meta).__name__}"
    for key in META_STRING_KEYS:
        if meta.get(key) is not None and not isinstance(meta[key], str):
            return f"meta.{key} must be a string or null, got {meta[key]!r}"
    if meta.get("format") is not None and meta["format"] not in FORMAT_NAMES:
        return (
            f"meta.format {meta['format']!r} is not one of {', '.join(FORMAT_NAMES)} "
            "(the format the line's assistant text is already written in; omit it for canonical tool_calls)"
        )

    declared: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and "function" not in tool and "name" in tool:
            return (
                f'tools[{i}]: a bare function schema; write it as {{"type": "function", "function": {{"name": ..., '
                '"parameters": ...}} (the OpenAI tools form)'
            )
        try:
            function = ToolSchema.model_validate(tool).function
        except ValidationError as exc:
            return f"tools[{i}]: {_pydantic_reason(exc)}"
        properties = function.parameters.get("properties") if isinstance(function.parameters, dict) else None
        nulls = [key for key, value in properties.items() if value is None] if isinstance(properties, dict) else []
        if nulls:  # never a schema; what Arrow writes for another tool's parameter (the call would go unchecked)
            return f"tools[{i}]: parameters.properties.{nulls[0]} is null: {ARROW_NULLS}"
        declared[function.name] = function.parameters

    open_calls = 0  # calls of the last assistant message still waiting for their tool result
    call_turn = -1
    call_ids: list[str] = []
    unanswered: list[str] = []  # ids of those calls without their result yet
    for i, raw in enumerate(messages):
        if isinstance(raw, dict):
            unknown = sorted(key for key in raw if key not in MESSAGE_KEYS and raw[key] is not None)
            if unknown:
                return (
                    f"messages[{i}]: unknown key {', '.join(repr(k) for k in unknown)} "
                    f"(chat templates read {', '.join(sorted(MESSAGE_KEYS))}; calls go in 'tool_calls')"
                )
            calls = raw.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:  # another type: the model check below names it
                function = call.get("function") if isinstance(call, dict) else None
                args = function.get("arguments") if isinstance(function, dict) else None
                if isinstance(args, str):  # with_decoded_arguments left it: not the JSON text of an object
                    try:
                        arguments_from_wire(args)
                        reason = "not a JSON object"
                    except ValueError as exc:
                        reason = str(exc)
                    return (
                        f"messages[{i}]: tool-call arguments must be a JSON object or its JSON text, got the string "
                        f"{args[:60]!r} ({reason})"
                    )
        try:
            message = Message.model_validate(raw)
        except ValidationError as exc:
            return f"messages[{i}]: {_pydantic_reason(exc)}"
        if message.role != "tool" and open_calls:
            return (
                f"messages[{i}]: {open_calls} call{'s' if open_calls > 1 else ''} of messages[{call_turn}] "
                "has no tool result before this message"
            )
        if message.role == "assistant":
            if not any(m.get("role") in ("system", "user") for m in messages[:i] if isinstance(m, dict)):
                return f"messages[{i}]: the first assistant turn needs a system or user message before it"
            if message.tool_calls:
                for call in message.tool_calls:
                    problem = _call_problem(call.function.name, call.function.arguments, declared)
                    if problem is not None:
                        return f"messages[{i}]: {problem}"
                open_calls, call_turn = len(message.tool_calls), i
                call_ids = [call.id for call in message.tool_calls if call.id]
                unanswered = list(call_ids)
            elif message.content is None:
                return f"messages[{i}]: an assistant message needs 'content' or 'tool_calls'"
        elif message.role == "tool":
            if open_calls == 0:
                return f"messages[{i}]: a tool result must follow an assistant message with tool_calls"
            open_calls -= 1
            if message.tool_call_id and call_ids and message.tool_call_id not in call_ids:
                return (
                    f"messages[{i}]: tool_call_id '{message.tool_call_id}' answers no call of messages[{call_turn}] "
                    f"({', '.join(call_ids)})"
                )
            if message.tool_call_id and call_ids:
                if message.tool_call_id not in unanswered:
                    return (
                        f"messages[{i}]: tool_call_id '{message.tool_call_id}' answers a call of messages[{call_turn}] "
                        f"that already has its result (still without one: {', '.join(unanswered)})"
                    )
                unanswered.remove(message.tool_call_id)
            if message.content is None:  # OpenAI requires it; the json/react formats would show "Observation: null"
                return f"messages[{i}]: a tool message needs 'content' (the tool's result text)"
        elif message.content is None:
            return f"messages[{i}]: a {message.role} message needs 'content'"
    if messages[-1].get("role") != "assistant":
        return "the conversation must end with an assistant message (what training learns from)"
    return None


def _call_problem(name: str, arguments: dict[str, Any], declared: dict[str, dict[str, Any]]) -> str | None:
    """Why a call does not fit the line's tools: an undeclared tool, or arguments its parameters refuse.

    A schema that JSON Schema cannot apply (BFCL's `"type": "dict"`, a dangling `$ref`) gives nothing to check
    the arguments against, so the call is kept as it is.
    """
    if name not in declared:
        if not declared:
            return f"calls '{name}', but 'tools' declares no tool (add the schema of '{name}' to 'tools')"
        return f"calls '{name}', which is not in 'tools' ({', '.join(sorted(declared))})"
    return validation_error(name, declared[name], arguments)


def with_decoded_arguments(example: dict[str, Any]) -> dict[str, Any]:
    """The line with each call's `arguments` given as JSON text (OpenAI's wire form, what most public tool datasets
    hold) decoded to the object chat templates and TRL want; other values, and text that is no JSON object, are
    left as they are for the validation to name. The line itself is not changed."""
    messages = example.get("messages")
    if not isinstance(messages, list) or not any(
        isinstance(m, dict) and isinstance(m.get("tool_calls"), list) for m in messages
    ):
        return example
    decoded = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if isinstance(calls, list):
            message = {**message, "tool_calls": [_decoded_call(call) for call in calls]}
        decoded.append(message)
    return {**example, "messages": decoded}


def _decoded_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = arguments_from_wire(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def normalize_example(example: dict[str, Any]) -> dict[str, Any]:
    """Fill the optional keys so every line has the same top-level shape (call arguments as objects)."""
    example = with_decoded_arguments(example)
    return {"messages": example["messages"], "tools": example.get("tools") or [], "meta": example.get("meta") or {}}


def _check_on_error(on_error: str) -> None:
    if on_error not in ON_ERROR_CHOICES:
        raise DataError(f"on_error={on_error!r} is not valid", hint=f"use one of {', '.join(ON_ERROR_CHOICES)}")


def json_reason(exc: json.JSONDecodeError) -> str:
    """`not valid JSON (...)` for a line: the decoder's message ("Invalid control character at") plus the column."""
    return f"not valid JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})"


def _bad(report: DatasetReport, where: str, reason: str, on_error: str) -> None:
    message = f"{where}: {reason}"
    if on_error == "stop":
        hint = f"fix the line; `toolschool dataset validate {report.source}` lists every bad line"
        raise DataError(message, hint=hint)
    report.errors.append(message)


def iter_jsonl(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, text) for each non-blank line (a UTF-8 byte order mark is not part of line 1).

    Each line is decoded on its own, so a line that is not UTF-8 is named (a text-mode file decodes in blocks
    and could not say which line it was). Lines end at \\n (\\r\\n too): the only line breaks JSON Lines has.
    """
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"data file '{path}' is not UTF-8 text (line {number}: byte 0x{raw[exc.start]:02x} at column "
                    f"{exc.start + 1})",
                    hint="save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
                ) from None
            if line.strip():
                yield number, line


def _require_file(path: Path) -> None:
    if not path.exists():
        raise DataError(f"data file '{path}' does not exist", hint="check the path")
    if path.is_dir():
        raise DataError(f"data path '{path}' is a folder", hint="pass a .jsonl file")


def _refuse_json_array(path: Path) -> None:
    """A file that is one JSON array (what `json.dump(list)` writes) is not JSON Lines: say so once.

    Read line by line, each of its text lines would be a bad line of its own: hundreds of 'not valid JSON'.
    """
    with path.open("rb") as handle:
        start = handle.read(4096).decode("utf-8-sig", errors="replace").lstrip()
    if not start.startswith("["):
        return
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return  # JSON Lines whose first line is a list, or a line not UTF-8: the line check names it
    if isinstance(data, list):
        raise DataError(
            f"{path} holds one JSON array of {len(data)} items, not JSON Lines",
            hint="write one example per line (JSONL): `jq -c '.[]' FILE.json > FILE.jsonl`",
        )


def load_dataset_jsonl(
    path: str | Path, on_error: OnError | str = "skip"
) -> tuple[list[dict[str, Any]], DatasetReport]:
    """Read and validate a dataset JSONL file; bad lines go to the report (skip) or raise DataError (stop)."""
    _check_on_error(on_error)
    path = Path(path).expanduser()
    _require_file(path)
    _refuse_other_format(path)
    report = DatasetReport(source=str(path))
    examples: list[dict[str, Any]] = []
    try:
        _refuse_json_array(path)
        for number, line in iter_jsonl(path):
            report.lines += 1
            where = f"{path}:{number}"
            try:
                example = json.loads(line)
            except json.JSONDecodeError as exc:
                _bad(report, where, json_reason(exc), on_error)
                continue
            reason = validate_example(example)
            if reason is not None:
                _bad(report, where, reason, on_error)
                continue
            examples.append(normalize_example(example))
            report.kept += 1
            report.kept_lines.append(number)
    except UnicodeDecodeError:
        raise DataError(f"data file '{path}' is not UTF-8 text") from None
    return examples, report


# Data files toolschool does not read, with how to get JSON Lines from them (the Hub's own format is parquet).
OTHER_FORMATS = {
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".csv": "csv",
    ".tsv": "csv",
    ".gz": "gzip",
    ".bz2": "bz2",
    ".xz": "xz",
    ".zst": "zstd",
    ".zip": "zip",
}


def is_local_source(source: str) -> bool:
    """A source is local when it exists on disk or looks like a path (./, /, ~ or a data-file suffix).

    Anything else (`openai/gsm8k`, `cruxeval-org/cruxeval`) is taken as a Hugging Face dataset id.
    """
    if Path(source).expanduser().exists():
        return True
    return source.startswith((".", "/", "~")) or Path(source).suffix in {".jsonl", ".json", *OTHER_FORMATS}


def _refuse_other_format(path: Path) -> None:
    """A parquet/CSV/compressed file read as text lines gave 'not UTF-8 text' or a bad line per row: name it."""
    kind = OTHER_FORMATS.get(path.suffix.lower())
    if kind is None:
        return
    if kind in ("parquet", "arrow"):  # Arrow's null-filled keys go (see without_nulls), as for a Hub id
        how = (
            'convert it: python -c "import datasets; from toolschool.data.dataset import without_nulls; '
            "from toolschool.run_state import write_jsonl; "
            f"write_jsonl('{path.with_suffix('.jsonl')}', map(without_nulls, datasets.load_dataset('{kind}', "
            f"data_files='{path}', split='train')))\""
        )
    elif kind == "csv":
        how = "write it as JSON Lines: one JSON object per line"
    else:
        how = f"decompress it to a .jsonl file first (e.g. {kind} -d)" if kind != "zip" else "unzip it to a .jsonl"
    raise DataError(f"{path} is a {kind} file, not JSON Lines", hint=how)


def parse_hub_source(source: str, *, config: str | None = None, split: str = "train") -> tuple[str, str | None, str]:
    """`ID`, `ID:SPLIT` or `ID:CONFIG:SPLIT` (e.g. `openai/gsm8k:main:train`) -> (id, config, split)."""
    parts = source.split(":")
    if len(parts) == 1:
        return source, config, split
    if len(parts) == 2:
        return parts[0], config, parts[1]
    if len(parts) == 3:
        return parts[0], parts[1] or config, parts[2]
    raise DataError(f"source {source!r} is not ID, ID:SPLIT or ID:CONFIG:SPLIT", hint="e.g. openai/gsm8k:main:train")


def load_hub_rows(dataset_id: str, *, split: str, config: str | None = None) -> list[dict[str, Any]]:
    """Rows of a Hugging Face dataset (online, or from the local datasets cache); a clear error otherwise."""
    try:
        import datasets

        loaded = datasets.load_dataset(dataset_id, config, split=split)
    except Exception as exc:  # offline, unknown id, unknown split: all end in one actionable line
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
        why = "offline mode is on (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE)" if offline else type(exc).__name__
        raise DataError(
            f"could not load Hugging Face dataset '{dataset_id}' (config={config}, split={split}): {why}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}",
            hint="pass a local .jsonl/.json file instead, or go online and check the id and split",
        ) from None
    return [dict(row) for row in loaded]


def without_nulls(value: Any) -> Any:
    """`value` without the dict keys whose value is null, at any depth (list items stay as they are).

    A Hugging Face dataset is Arrow: a struct column holds every key any row has, so each row comes back with the
    others' keys as None — a calculator call's arguments as `{"expression": "2+3", "code": None}`, its schema's
    properties with `"code": None`, `tool_calls: None` on every user message. Trained as they are, the model would
    learn to write `"code": null`. A null in such a row cannot be told from an absent key, so it is read as one.
    """
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


def load_examples(
    source: str | Path, *, on_error: OnError | str = "skip", split: str = "train"
) -> tuple[list[dict[str, Any]], DatasetReport]:
    """Dataset lines from a local JSONL file or a Hugging Face dataset id, each validated."""
    _check_on_error(on_error)
    text = str(source)
    if isinstance(source, Path) or is_local_source(text):
        return load_dataset_jsonl(text, on_error)
    text, config, split = parse_hub_source(text, split=split)
    rows = load_hub_rows(text, split=split, config=config)
    report = DatasetReport(source=f"{text}[{split}]")
    examples = []
    for index, row in enumerate(rows):
        report.lines += 1
        if "messages" not in row:  # the other columns are left out below: name them, or the row looks empty
            reason = (
                f"no 'messages' column (the dataset's columns: {', '.join(row)}); toolschool reads OpenAI chat "
                "messages {role, content, tool_calls}"
            )
            _bad(report, f"{text}[{split}]:row {index}", reason, on_error)
            continue
        row = without_nulls({key: value for key, value in row.items() if key in EXAMPLE_KEYS})
        reason = validate_example(row)
        if reason is not None:
            _bad(report, f"{text}[{split}]:row {index}", reason, on_error)
            continue
        examples.append(normalize_example(row))
        report.kept += 1
    return examples, report


def read_raw_records(
    source: str | Path, *, split: str = "train", config: str | None = None, on_error: OnError | str = "skip"
) -> tuple[list[dict[str, Any]], DatasetReport]:
    """Raw source rows (GSM8K, CRUXEval, instruction data): JSONL, a JSON list, or a Hugging Face id.

    Only JSON well-formedness is checked here; each builder checks its own fields and reports per row using
    the `_where` key added to every row (`file:line`, `file:item N` or `id[split]:row N`).
    """
    _check_on_error(on_error)
    text = str(source)
    if not (isinstance(source, Path) or is_local_source(text)):
        text, config, split = parse_hub_source(text, config=config, split=split)
        rows = load_hub_rows(text, split=split, config=config)
        for index, row in enumerate(rows):
            row["_where"] = f"{text}[{split}]:row {index}"
        return rows, DatasetReport(source=f"{text}[{split}]", lines=len(rows), kept=len(rows))
    path = Path(text).expanduser()
    _require_file(path)
    _refuse_other_format(path)
    report = DatasetReport(source=str(path))
    rows: list[dict[str, Any]] = []
    try:
        if path.suffix == ".json":
            try:
                data = json.loads(path.read_text(encoding="utf-8-sig"))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})", hint="fix the file") from None
            if isinstance(data, dict):  # {"train": [...]} or column-oriented is not supported: say so
                if split in data and isinstance(data[split], list):
                    data = data[split]
                else:
                    raise DataError(
                        f"{path}: expected a JSON list of records (or an object with a '{split}' list), "
                        f"got an object with keys {', '.join(list(data)[:5])}",
                        hint="convert it to JSONL, one record per line",
                    )
            if not isinstance(data, list):
                raise DataError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
            for index, item in enumerate(data):
                report.lines += 1
                if isinstance(item, dict):
                    rows.append({**item, "_where": f"{path}:item {index}"})
                    report.kept += 1
                else:
                    _bad(report, f"{path}:item {index}", f"expected a JSON object, got {type(item).__name__}", on_error)
            return rows, report
        for number, line in iter_jsonl(path):
            report.lines += 1
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                _bad(report, f"{path}:{number}", json_reason(exc), on_error)
                continue
            if not isinstance(item, dict):
                _bad(report, f"{path}:{number}", f"expected a JSON object, got {type(item).__name__}", on_error)
                continue
            rows.append({**item, "_where": f"{path}:{number}"})
            report.kept += 1
    except UnicodeDecodeError:
        raise DataError(f"data file '{path}' is not UTF-8 text") from None
    return rows, report


def _calls_of(message: dict[str, Any], format_name: str | None) -> list[Any]:
    """A message's calls: its `tool_calls`, or, on a line already written in a text format (`meta.format` json or
    react), the calls its assistant text holds in that format."""
    if message.get("tool_calls"):
        return list(message["tool_calls"])
    if format_name in (None, "hermes") or message.get("role") != "assistant":
        return []
    from toolschool.chat.formats import get_format

    return get_format(format_name).parse(message.get("content") or "").calls


def _call_name(call: Any) -> str:
    """The tool a call names (canonical `{"function": {"name"}}`)."""
    function = call.get("function") if isinstance(call, dict) else None
    return str(function.get("name")) if isinstance(function, dict) else "?"


def _meta_label(meta: dict[str, Any], key: str) -> str:
    """A line's meta value as a stats key; lines without one (OpenAI-style data) count as `(no meta.KEY)`."""
    value = meta.get(key)
    return f"(no meta.{key})" if value is None else str(value)


def dataset_stats(examples: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts a user wants before training: per tool, per category, per source, calls and turns.

    `per_tool`, `per_category` and `per_source` count lines by their meta (what the builders record);
    `calls_per_tool` counts the calls themselves by the tool they name, which is what OpenAI-style data without
    meta has to be counted by.
    """
    per_tool: Counter[str] = Counter()
    calls_per_tool: Counter[str] = Counter()
    per_category: Counter[str] = Counter()
    per_source: Counter[str] = Counter()
    calls = 0
    turns = 0
    with_calls = 0
    for example in examples:
        meta = example.get("meta", {})
        per_tool[_meta_label(meta, "tool")] += 1
        per_category[_meta_label(meta, "category")] += 1
        per_source[_meta_label(meta, "source")] += 1
        names = [_call_name(c) for m in example["messages"] for c in _calls_of(m, meta.get("format"))]
        calls_per_tool.update(names)
        n_calls = len(names)
        calls += n_calls
        with_calls += n_calls > 0
        turns += sum(1 for m in example["messages"] if m.get("role") == "assistant")
    n = len(examples)
    return {
        "examples": n,
        "with_tool_calls": with_calls,
        "tool_calls": calls,
        "assistant_turns_mean": round(turns / n, 3) if n else 0.0,
        "calls_per_tool": dict(sorted(calls_per_tool.items())),
        "per_tool": dict(sorted(per_tool.items())),
        "per_category": dict(sorted(per_category.items())),
        "per_source": dict(sorted(per_source.items())),
    }
