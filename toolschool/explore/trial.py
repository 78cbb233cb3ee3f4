"""One trial of exploration as typed records: a `Trial`, its `Step`s (one per model turn of the attempt) and their
`Call`s. `to_json` gives the trial's line of the log (`trials.jsonl`, written by `explore.log.TrialLog`) and
`from_json` reads one back, so exploration writes, and resume, the summary and distillation read, one definition.

Fields of one line (version 1), in the order a line holds them:

- `tool`, `episode`, `slot`: which tool was explored, in which episode and short-term-memory slot (required);
- `status`: "ok", "empty_query" (the explorer imagined nothing usable; no attempt was made) or "context_full"
  (the conversation outgrew the model's context: the trial stopped there, its episode ended; `error` says why);
- `query` (cleaned imagined query), `query_raw` (the model's text);
- imagine = "values_first" only (else null): `imagined_values` (the argument values the request was written from),
  `intent_matched` (the call read from the request has them), `set_aside` {values: [{values, problem}], requests:
  [{request, problem}], calls: [{calls: [{name, arguments}], problem}], answers: [text]} (draws not used: values
  the tool refused or that repeat those tried, requests that leave a value out, calls the tool refused or that
  returned nothing — they ran, their results were not shown —, final answers that do not state the call's result);
- `steps`: one per model turn of the attempt (`Step`): `raw` (the full model text), `calls` (`Call`: `id`, `name`,
  `arguments`, `observation` {text, value, is_error, error_kind} and `shown`, the text the model saw: the
  observation text, cut at `max_observation_chars`), `final`, `parse_error`, `error` (a parse error or any failed
  call), `executed` (false for a reply written after the budget ran out), `finish_reason`, `completion_tokens`;
  `closed_at_limit` (only when true: the backend ended the reply's open call in its last tokens, so its last value
  is cut short: `toolschool.engine.local_backend.WRAP_UP_WINDOW`); then `feedback` (only after a parse error: what
  the model was told) or `skipped_calls` (only when a reply held more calls than the budget of `max_turns` calls
  had left: each a `Call` without `observation`, `shown` being the "not run" notice the model got);
- `final_answer`: the final answer or null; `reflection` (the model's text or null) and `solved`
  (true / false / null when reflection was off or unclear);
- `messages`: the canonical conversation this trial added (imagination prompt without long-term memory, the
  query, the attempt, the reflection) — replayed on resume; `tools`: the OpenAI schemas offered;
- `tokens` {prompt, completion}, `model`, `format`, `decoding` ("constrained": every reply of the attempt was
  grammar-constrained, so a call parses, names an offered tool and fits its schema; "free"), `ablations`
  {no_exec_feedback, no_stm, no_ltm, no_reflection},
  `settings` (what shaped the trial: stm_slots, max_turns, temperature, max_tokens, reflection_max_tokens,
  demonstrations, force_call, constrained, max_observation_chars, ltm_max_queries, prompts_sha256, seed), `started_at`,
  `finished_at` (ISO 8601 UTC), `seconds`; `error` (only when the trial stopped on one); `v`: 1.

Why `steps` and `messages` are both kept: they are not one conversation written twice. `messages` is what the
explorer saw (the rendered imagine/trial/answer/reflect prompts, parse-error feedback, results cut for the
context) and is replayed on resume; `steps` is what happened (the raw text, every call's whole observation, finish
reasons, token counts) and is what the summary counts and distillation builds its clean conversation from (the
query alone as the user turn, only the calls that ran clean). Neither can be rebuilt from the other.

A line of another shape is a `DataError` naming the field (`steps[1].calls[0].observation must be ...`). Keys this
version does not know are kept (`extra`) and written back after the known ones, so a log read and written again
loses nothing; a line missing optional fields (a log written by hand) reads with their defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from toolschool.errors import DataError

LOG_VERSION = 1


def _kind(value: Any) -> str:
    return {dict: "JSON object", list: "list", str: "str", type(None): "null"}.get(type(value), type(value).__name__)


# what each kind of field accepts, and how a message names it ("str?": the message says "or null" too)
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "number": (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
    "any": (lambda v: True, "anything"),
}


def _fields(
    record: type, data: Any, path: str, spec: dict[str, str], required: tuple[str, ...] = ()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the known fields of one JSON object of a line, checked against `spec`; the unknown ones). `path` names the
    object in messages (`steps[1].calls[0]`). A null is accepted only in a field that may hold one ("str?", or a
    default of None), and in a list (read as an empty one): elsewhere it would read back as another value (a null
    `executed` as true), so it is refused with the field's name."""
    if not isinstance(data, dict):
        raise DataError(f"{path} must be a JSON object, got {_kind(data)}")
    missing = [name for name in required if name not in data]
    if missing and path:
        raise DataError(f"{path}.{missing[0]} is missing")
    if missing:
        needs = " and ".join([", ".join(required[:-1]), required[-1]] if len(required) > 1 else required)
        raise DataError(f"not a {record.__name__.lower()} record (needs {needs}): {missing[0]} is missing")
    defaults = {f.name: f.default for f in fields(record)}
    known: dict[str, Any] = {}
    for name, value in data.items():
        if name not in spec:
            continue
        if value is None and (spec[name].endswith("?") or defaults[name] is None):
            known[name] = None
            continue
        if value is None and spec[name] == "list":  # no list written: an empty one
            continue
        kind = spec[name].rstrip("?")
        accepts, described = _KINDS[kind]
        if not accepts(value):
            described += " or null" if spec[name].endswith("?") else ""
            raise DataError(f"{f'{path}.' if path else ''}{name} must be {described}, got {_kind(value)}")
        known[name] = value
    return known, {name: value for name, value in data.items() if name not in spec}


_CALL = {"id": "str?", "name": "str", "arguments": "any", "observation": "object?", "shown": "str"}


@dataclass
class Call:
    """One call of a reply: run (`observation` holds the tool's result) or past the call budget (None: not run)."""

    name: str
    arguments: Any = None  # the arguments as the model wrote them (a JSON object when they parse as one)
    id: str | None = None
    observation: dict[str, Any] | None = None  # {text, value, is_error, error_kind} (`tools.base.Observation`)
    shown: str = ""  # what the model saw in reply
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """The tool refused or failed the call (an error observation)."""
        return bool((self.observation or {}).get("is_error", False))

    def to_json(self) -> dict[str, Any]:
        line: dict[str, Any] = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.observation is not None:
            line["observation"] = self.observation
        return {**line, "shown": self.shown, **self.extra}

    @classmethod
    def from_json(cls, data: Any, path: str = "call") -> Call:
        known, extra = _fields(cls, data, path, _CALL, required=("name",))
        return cls(**known, extra=extra)


_STEP = {
    "raw": "str?",
    "calls": "list",
    "final": "str?",
    "parse_error": "str?",
    "error": "bool",
    "executed": "bool",
    "finish_reason": "str?",
    "completion_tokens": "int",
    "closed_at_limit": "bool",
    "feedback": "str?",
    "skipped_calls": "list",
}


@dataclass
class Step:
    """One model turn of the attempt: a reply with calls, a final answer, or text that did not parse."""

    raw: str | None = ""
    calls: list[Call] = field(default_factory=list)
    final: str | None = None
    parse_error: str | None = None
    error: bool = False
    executed: bool = True  # False: written after the call budget ran out, so not run
    finish_reason: str | None = None
    completion_tokens: int = 0
    closed_at_limit: bool = False  # the backend ended the reply's open call in its last tokens (a value cut short)
    feedback: str | None = None  # after a parse error: what the model was told
    skipped_calls: list[Call] = field(default_factory=list)  # calls past the budget, answered "not run"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        line: dict[str, Any] = {
            "raw": self.raw,
            "calls": [call.to_json() for call in self.calls],
            "final": self.final,
            "parse_error": self.parse_error,
            "error": self.error,
            "executed": self.executed,
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
        }
        if self.closed_at_limit:
            line["closed_at_limit"] = True
        if self.feedback is not None:
            line["feedback"] = self.feedback
        if self.skipped_calls:
            line["skipped_calls"] = [call.to_json() for call in self.skipped_calls]
        return {**line, **self.extra}

    @classmethod
    def from_json(cls, data: Any, path: str = "step") -> Step:
        known, extra = _fields(cls, data, path, _STEP)
        for key in ("calls", "skipped_calls"):
            if key in known:
                known[key] = [Call.from_json(c, f"{path}.{key}[{j}]") for j, c in enumerate(known[key])]
        return cls(**known, extra=extra)


_TRIAL = {
    "tool": "str",
    "episode": "int",
    "slot": "int",
    "status": "str?",
    "query": "str?",
    "query_raw": "str?",
    "imagined_values": "object",
    "intent_matched": "bool",
    "set_aside": "object",
    "steps": "list",
    "final_answer": "str?",
    "reflection": "str?",
    "solved": "bool",
    "messages": "list",
    "tools": "list",
    "tokens": "object",
    "model": "str?",
    "format": "str?",
    "decoding": "str?",
    "ablations": "object",
    "settings": "object",
    "started_at": "str?",
    "finished_at": "str?",
    "seconds": "number",
    "error": "str?",
    "v": "int",
}


@dataclass
class Trial:
    """One line of the exploration log: imagine, try and reflect once (fields: see the module's docstring)."""

    tool: str
    episode: int
    slot: int
    status: str | None = "ok"
    query: str | None = ""
    query_raw: str | None = ""
    imagined_values: dict[str, Any] | None = None
    intent_matched: bool | None = None
    set_aside: dict[str, Any] | None = None
    steps: list[Step] = field(default_factory=list)
    final_answer: str | None = None
    reflection: str | None = None
    solved: bool | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    tokens: dict[str, int] | None = None
    model: str | None = None
    format: str | None = None
    decoding: str | None = None
    ablations: dict[str, bool] | None = None
    settings: dict[str, Any] | None = None
    started_at: str | None = None
    finished_at: str | None = None
    seconds: float | None = None
    error: str | None = None  # why the trial stopped (status "context_full"); written only when there is one
    v: int = LOG_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """`tool/eEPISODE/sSLOT`: the trial's name in messages and the id of what distillation makes of it."""
        return f"{self.tool}/e{self.episode}/s{self.slot}"

    @property
    def calls(self) -> list[Call]:
        """Every call that ran, in order."""
        return [call for step in self.steps for call in step.calls]

    def to_json(self) -> dict[str, Any]:
        """The trial's log line: the fields in the order the log has always written them."""
        line: dict[str, Any] = {}
        for name in _TRIAL:
            if name in ("error", "v"):
                continue
            value = getattr(self, name)
            line[name] = [step.to_json() for step in value] if name == "steps" else value
        if self.error is not None:
            line["error"] = self.error
        return {**line, **self.extra, "v": self.v}

    @classmethod
    def from_json(cls, data: Any) -> Trial:
        """A trial from its log line; a line of another shape is a DataError naming the field."""
        if not isinstance(data, dict):
            raise DataError(f"a trial must be a JSON object, got {_kind(data)}")
        known, extra = _fields(cls, data, "", _TRIAL, required=("tool", "episode", "slot"))
        if "steps" in known:
            known["steps"] = [Step.from_json(s, f"steps[{i}]") for i, s in enumerate(known["steps"])]
        return cls(**known, extra=extra)
