"""One STE episode: a conversation (short-term memory) holding `stm_slots` trials for one tool.

Each trial (Wang et al., 2024, "LLMs in the Imaginarium"):
1. imagine: the explorer writes a user query for the tool. It is shown the long-term memory (queries already
   explored for this tool, solved or not) in this request only; the conversation keeps the prompt without it.
   Trials after the first in a conversation use the follow-up prompt ("explore further, building on what you
   discovered").
2. try: up to `max_turns` tool calls (several in one reply count one each; those past the budget are answered
   with a "not run" notice), in at most `max_turns` replies; each call is executed for real and its observation
   (or the parse/execution error) is fed back; then the model gives a final answer. As in the paper, a reply
   that is still a call when the budget is spent is recorded but not executed.
3. reflect: "did you fulfil the query?" Yes/No.

The canonical conversation (toolschool.chat.types dicts) is kept here; the format turns it into what the
model sees (`fmt.to_messages`) and parses what the model writes (`fmt.parse`).
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from toolschool.chat.constraints import Constraint
from toolschool.chat.formats.base import decode_json_prefix
from toolschool.chat.types import ParsedReply, tool_call
from toolschool.config import ExploreSection
from toolschool.explore.log import TrialLog
from toolschool.explore.memory import LongTermMemory, MemoryEntry
from toolschool.explore.templates import PromptSet, program_argument, takes_code
from toolschool.explore.trial import Call, Step, Trial
from toolschool.models.backend import Backend, Completion, ContextLengthError, GenerationRequest, SamplingParams
from toolschool.tools.base import Observation, valid_unicode

# Imagination must end with the query: cut where a model starts solving it instead.
IMAGINE_STOP = ["Thought:", "Action:", "<tool_call>", "Final Answer:"]
_QUERY_PREFIX = re.compile(r"^\s*(?:\*\*)?(?:user\s+)?(?:request|query)(?:\*\*)?\s*:\s*(?:\*\*)?", re.IGNORECASE)
# A line of its own that starts with the label the imagination prompt ends with.
_QUERY_LABEL_LINE = re.compile(r"(?m)^[ \t]*(?:\*\*)?(?:user\s+)?(?:request|query)(?:\*\*)?\s*:", re.IGNORECASE)
# How the long-term memory lists a query (prompts/*/memory.jinja); a query echoing the list is cut here.
MEMORY_ECHO = "| solved:"


class ChatFormat(Protocol):
    """What exploration needs from a format (toolschool.chat.formats)."""

    name: str
    stop: list[str]
    prefill: str

    def to_messages(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]: ...

    def parse(self, text: str, tools: list[Any] | None = None) -> ParsedReply: ...

    def call_prefix(self, name: str) -> str: ...


class ToolCaller(Protocol):
    """What exploration needs from a tool registry (toolschool.tools.registry.ToolRegistry)."""

    async def acall(self, name: str, args: dict[str, Any]) -> Observation: ...


class BackendFailure(RuntimeError):
    """The backend answered with an error completion; the episode stops and is logged as failed."""


@dataclass(frozen=True)
class Ablations:
    no_exec_feedback: bool = False
    no_stm: bool = False
    no_ltm: bool = False
    no_reflection: bool = False

    def to_dict(self) -> dict[str, bool]:
        return asdict(self)


@dataclass(frozen=True)
class ExploreSettings:
    episodes: int = 15
    target_per_tool: int = 0  # explore a tool until this many verified trials (0: every episode)
    give_up_after: int = 0  # with target_per_tool: trials a tool may take with none verified (0: no limit)
    stm_slots: int = 3
    max_turns: int = 4
    temperature: float = 0.7
    trial_temperature: float | None = None  # the attempt's (`attempt_temperature`); None: `temperature`
    max_tokens: int = 256
    reflection_max_tokens: int = 16
    demonstrations: int = 2
    imagine: str = "direct"  # "direct" | "values_first" (see imagine_request)
    force_call: bool = False
    constrained: bool = True  # trial replies grammar-constrained (`decoding`), where the backend can
    max_observation_chars: int = 2000
    ltm_max_queries: int = 0
    prompts_sha256: str | None = None  # PromptSet.fingerprint: the templates and worked examples in use
    seed: int = 0
    ablations: Ablations = field(default_factory=Ablations)

    def trial_shape(self) -> dict[str, Any]:
        """The settings that shape every trial, logged with it: a resumed run must not change them.

        `episodes`, `target_per_tool` and `give_up_after` are left out on purpose: raising them on resume explores
        further in the same experiment.
        """
        shape = asdict(self)
        for key in ("episodes", "target_per_tool", "give_up_after", "ablations"):  # ablations are checked on their own
            del shape[key]
        shape["trial_temperature"] = self.attempt_temperature  # the effective one (a log without it: `temperature`)
        return shape

    @property
    def attempt_temperature(self) -> float:
        """The temperature of the attempt: its calls, its answer and the reflection."""
        return self.temperature if self.trial_temperature is None else self.trial_temperature

    @classmethod
    def from_section(cls, section: ExploreSection, seed: int = 0, prompts_sha256: str | None = None) -> ExploreSettings:
        return cls(
            episodes=section.episodes,
            target_per_tool=section.target_per_tool,
            give_up_after=section.give_up_after,
            stm_slots=section.stm_slots,
            max_turns=section.max_turns,
            temperature=section.temperature,
            trial_temperature=section.trial_temperature,
            max_tokens=section.max_tokens,
            demonstrations=section.demonstrations,
            imagine=section.imagine,
            force_call=section.force_call,
            constrained=section.constrained,
            max_observation_chars=section.max_observation_chars,
            ltm_max_queries=section.ltm_max_queries,
            prompts_sha256=prompts_sha256,
            seed=seed,
            ablations=Ablations(
                no_exec_feedback=section.no_exec_feedback,
                no_stm=section.no_stm,
                no_ltm=section.no_ltm,
                no_reflection=section.no_reflection,
            ),
        )


@dataclass
class ExploreContext:
    """Everything the episodes of one run share."""

    backend: Backend
    fmt: ChatFormat
    registry: ToolCaller
    prompts: PromptSet
    memory: LongTermMemory
    log: TrialLog
    settings: ExploreSettings
    tool_schemas: list[dict[str, Any]]
    model_name: str
    on_trial: Callable[[Trial], None] | None = None

    @property
    def decoding(self) -> str:
        """How trial replies are generated: "constrained" (a call always parses, names an offered tool and fits its
        schema) when asked and the backend can, else "free"."""
        return "constrained" if self.settings.constrained and self.backend.constrains else "free"

    def trial_constraint(self, tool: str, turn: int, calls_left: int | None = None) -> Constraint | None:
        """What a trial's reply may be: with `force_call`, the first one is a call to the explored tool (a named
        tool_choice); once the trial's calls are spent (`calls_left` 0), an answer without a call (a call could
        not run, and a small explorer otherwise repeats the call it just made); otherwise free
        text or a valid call to an offered tool (auto): calling stays the explorer's choice. None when decoding
        is free."""
        if self.decoding != "constrained":
            return None
        if self.settings.force_call and turn == 0:
            choice = tool
        elif calls_left is not None and calls_left <= 0:
            # the answer: in hermes, plain text that holds no JSON object either; in json and react their final
            # answer is a form of their own, which tool_choice "none" leaves
            if self.fmt.name == "hermes":
                return Constraint.answer()
            choice = "none"
        else:
            choice = "auto"
        return Constraint.for_tools(self.fmt.name, self.tool_schemas, choice)

    def reflect_constraint(self) -> Constraint | None:
        """The self-reflection, when decoding is constrained: "Yes" or "No" (a small explorer otherwise answers
        with a call object or a paragraph); None when decoding is free."""
        return Constraint.one_of("Yes", "No") if self.decoding == "constrained" else None

    def values_constraint(self, tool: str, pinned: dict[str, str] | None = None) -> Constraint | None:
        """What imagined argument values may be (imagine = "values_first"): a JSON object that fits the tool's
        schema, when decoding is constrained; None when decoding is free. `pinned`: text arguments held to one
        value each (the choices a trial's situation offers, `PromptSet.situation_choices`)."""
        if self.decoding != "constrained":
            return None
        parameters = self.schema_of(tool).get("parameters") or {"type": "object"}
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        if pinned and isinstance(properties, dict):
            held = {
                name: {**spec, "enum": [pinned[name]]}
                for name, spec in properties.items()
                if name in pinned and isinstance(spec, dict)
            }
            parameters = {**parameters, "properties": {**properties, **held}}
        return Constraint.for_response_format(
            {"type": "json_schema", "json_schema": {"name": tool, "schema": parameters}}
        )

    def imagine_constraint(self) -> Constraint | None:
        """What an imagined request may be, when decoding is constrained: prose (`Constraint.prose`), never a call
        or a JSON object; None when decoding is free."""
        return Constraint.prose() if self.decoding == "constrained" else None

    def constraints(self, tools: list[str]) -> list[Constraint]:
        """Every constraint the trials of `tools` can be generated under (none when decoding is free), so that a run
        checks them all before its first request (`check_constraints`)."""
        found = [self.imagine_constraint(), self.reflect_constraint()]
        for tool in tools:
            found += [self.trial_constraint(tool, 0), self.trial_constraint(tool, 1), self.trial_constraint(tool, 1, 0)]
            if self.settings.imagine == "values_first":
                found.append(self.values_constraint(tool))
        unique: dict[str, Constraint] = {}
        for constraint in found:
            if constraint is not None:
                unique.setdefault(constraint.key(), constraint)
        return list(unique.values())

    def check_constraints(self, tools: list[str]) -> None:
        """A schema the grammar library cannot compile ends the run here, in one line naming the tool and the
        construct, before anything is generated (not one failed episode after another)."""
        for constraint in self.constraints(tools):
            self.backend.check_constraint(constraint)

    def schema_of(self, tool: str) -> dict[str, Any]:
        for schema in self.tool_schemas:
            if schema["function"]["name"] == tool:
                return schema["function"]
        raise KeyError(tool)


def clean_query(text: str) -> str:
    """The imagined query without a 'User request:' label, wrapping quotes, or the start of a solution.

    Small explorers also wander: chatter before a 'User request:' line of their own (the query is what follows
    the last such label), or an echo of the long-term memory's list ("- query | solved: No"), cut at its marker.
    """
    for marker in IMAGINE_STOP:
        text = text.split(marker, 1)[0]
    text = text.split(MEMORY_ECHO, 1)[0]
    labelled = list(_QUERY_LABEL_LINE.finditer(text))
    if labelled and labelled[-1].start() > 0:
        text = text[labelled[-1].start() :]
    text = _QUERY_PREFIX.sub("", text.strip()).strip()
    text = text.removeprefix("- ").strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
        text = text[1:-1].strip()
    return text


def parse_reflection(text: str) -> bool | None:
    """The first yes/no word decides (the paper checks for "No"); neither: None (counted as not solved)."""
    for word in re.findall(r"[a-z]+", text.lower()):
        if word in ("yes", "yeah", "yep"):
            return True
        if word in ("no", "not", "nope"):
            return False
    return None


VERBATIM_KEY = "verbatim"
_VERBATIM_MARK = "@@toolschool-verbatim-{}@@"


def model_view(
    fmt: ChatFormat, conversation: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """What the model sees: `fmt.to_messages`, except that assistant messages marked `verbatim` keep their text.

    Why: a text format (react, json) renders every plain assistant message as a final answer ("Final Answer:
    ..."), but in exploration some assistant turns are not answers: the imagined query, the Yes/No reflection,
    an unparsable reply. Each is swapped for a marker before conversion and restored after, so the format
    still renders calls, results and answers its own way.
    """
    originals: dict[str, str] = {}
    prepared: list[dict[str, Any]] = []
    for message in conversation:
        if message.get(VERBATIM_KEY):
            marker = _VERBATIM_MARK.format(len(originals))
            originals[marker] = message.get("content") or ""
            message = {"role": message["role"], "content": marker}
        prepared.append(message)
    messages, out_tools = fmt.to_messages(prepared, tools)
    if originals:
        restored = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, str):
                hit = next((p for p in originals if p in content), None)
                if hit is not None:
                    message = {**message, "content": originals[hit]}
            restored.append(message)
        messages = restored
    return messages, out_tools


def _verbatim(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text, VERBATIM_KEY: True}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class _Trial:
    """State of one trial while it runs: the messages it adds, its steps and its token counts."""

    def __init__(self, ctx: ExploreContext, tool: str, episode: int, slot: int) -> None:
        self.ctx = ctx
        self.tool = tool
        self.episode = episode
        self.slot = slot
        self.messages: list[dict[str, Any]] = []
        self.steps: list[Step] = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.final_answer: str | None = None
        self.set_aside_answers: list[str] = []  # values first: answers written again (`answer_misses_result`)
        self.set_aside_calls: list[dict[str, Any]] = []  # values first: calls drawn again (`calls_problem`)
        self._generations = 0

    async def generate(
        self,
        conversation: list[dict[str, Any]],
        *,
        stop: list[str],
        prefill: str,
        max_tokens: int,
        constraint: Constraint | None = None,
        with_tools: bool = True,
        temperature: float | None = None,
    ) -> Completion:
        """One reply to `conversation`; `with_tools` False: the offered tools are not rendered (a side conversation
        that needs no tools, e.g. values-first imagination, skips prefilling their schemas)."""
        ctx = self.ctx
        key = f"{ctx.settings.seed}/{self.tool}/{self.episode}/{self.slot}/{self._generations}"
        self._generations += 1
        messages, tools = model_view(ctx.fmt, conversation, ctx.tool_schemas if with_tools else [])
        params = SamplingParams(
            n=1,
            temperature=ctx.settings.temperature if temperature is None else temperature,
            max_tokens=max_tokens,
            stop=list(stop),
            seed=zlib.crc32(key.encode()),
        )
        completions = await ctx.backend.generate(
            GenerationRequest(messages=messages, tools=tools, params=params, prefill=prefill, constraint=constraint)
        )
        if not completions:
            raise BackendFailure(f"backend returned no completion for {self.tool} episode {self.episode}")
        completion = completions[0]
        if completion.finish_reason == "error":
            raise BackendFailure(f"backend error: {completion.text.strip()[:300]}")
        self.prompt_tokens += completion.prompt_tokens
        self.completion_tokens += completion.num_tokens
        return completion


async def _execute(ctx: ExploreContext, name: str, args: dict[str, Any]) -> Observation:
    """Run one call; whatever goes wrong becomes an error observation so the episode goes on."""
    try:
        # a call that hangs comes back as a timeout observation; one that breaks the Tool contract as an error one
        return await ctx.registry.acall(name, args)
    except Exception as exc:  # a registry/tool bug must not stop exploration; the model sees the error
        return Observation(f"Error: the tool '{name}' failed: {exc}", None, is_error=True, error_kind="execution")


async def _run_calls(
    ctx: ExploreContext, trial: _Trial, parsed: ParsedReply, turn: int, calls_left: int
) -> tuple[list[Call], list[Call], list[dict[str, Any]]]:
    """Execute the calls of one reply, at most `calls_left` of them (`max_turns` counts calls, not replies).

    Returns (the calls run, the calls past the budget, tool messages for the conversation).
    A call past the budget is not run but still answered, with the `call_limit` notice: an assistant message
    whose tool_call ids are not all answered is refused by OpenAI-compatible endpoints.
    """
    records: list[Call] = []
    skipped: list[Call] = []
    tool_messages: list[dict[str, Any]] = []
    calls = []
    for index, call in enumerate(parsed.calls):
        call = valid_unicode(json.loads(json.dumps(call, default=str)))  # own copy; the conversation keeps it
        call.setdefault("type", "function")
        if not call.get("id"):
            call["id"] = f"call_{trial.slot}_{turn}_{index}"
        calls.append(call)
    parsed.calls = calls
    notice = ctx.prompts.render("call_limit", max_turns=ctx.settings.max_turns, tool=trial.tool)
    for call in calls[max(calls_left, 0) :]:
        function = call["function"]
        skipped.append(Call(function["name"], function.get("arguments"), call["id"], shown=notice))
    for call in calls[: max(calls_left, 0)]:
        name = call["function"]["name"]
        args = call["function"].get("arguments") or {}
        observation = await _execute(ctx, name, args if isinstance(args, dict) else {"value": args})
        if ctx.settings.ablations.no_exec_feedback:
            shown = ctx.prompts.render("no_feedback")
        else:
            shown = cut_observation(observation.text, ctx.settings.max_observation_chars)
        records.append(Call(name, args, call["id"], observation.to_dict(), shown))
        tool_messages.append({"role": "tool", "tool_call_id": call["id"], "name": name, "content": shown})
    tool_messages += [{"role": "tool", "tool_call_id": c.id, "name": c.name, "content": c.shown} for c in skipped]
    return records, skipped, tool_messages


def cut_observation(text: str, limit: int) -> str:
    """What the explorer is shown of a tool result: at most `limit` characters (0: all), saying how many were left
    out. Why: one call that dumps a table or a web page (or the python sandbox's 20 kB of output) would push the
    conversation past the model's context, and the episode would stop on that error again at every resume; the
    log keeps the whole result.
    """
    text = str(text)
    if limit <= 0 or len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} more characters not shown]"


def _step(completion: Completion, raw: str, parsed: ParsedReply, *, executed: bool) -> Step:
    return Step(
        raw=raw,
        final=parsed.final if not parsed.calls else None,
        parse_error=parsed.error,
        error=parsed.error is not None,
        executed=executed,
        finish_reason=completion.finish_reason,
        completion_tokens=completion.num_tokens,
        closed_at_limit=completion.closed_at_limit,
    )


async def run_trial(
    ctx: ExploreContext, tool: str, episode: int, slot: int, conversation: list[dict[str, Any]], *, first: bool
) -> Trial:
    """Imagine, try and reflect once; write the trial's log line and return it.

    `first`: the conversation holds no trial yet (only the system message and worked examples), so the trial
    uses the first-query prompts that describe the tool rather than the follow-up ones.
    """
    settings = ctx.settings
    ablations = settings.ablations
    started, clock = _now(), time.perf_counter()
    trial = _Trial(ctx, tool, episode, slot)
    schema = ctx.schema_of(tool)
    variables = {
        "tool": tool,
        "description": schema.get("description", ""),
        "parameters": json.dumps(schema.get("parameters", {}), ensure_ascii=False),
        "tool_names": [s["function"]["name"] for s in ctx.tool_schemas],
        "max_turns": settings.max_turns,
        "code": takes_code(tool, schema.get("parameters")),
    }
    persona = ctx.prompts.persona(settings.seed, tool, episode, slot)
    # 1. imagine — the long-term memory goes into this request only
    imagine = "imagine" if first else "imagine_followup"
    memory = [] if ablations.no_ltm else ctx.memory.shown(tool, with_outcome=not ablations.no_reflection)
    shown_prompt = ctx.prompts.render(imagine, memory=memory, persona=persona, **variables)
    kept_prompt = ctx.prompts.render(imagine, memory=[], persona=persona, **variables)
    query_raw = query = ""
    entry: MemoryEntry | None = None
    reflection: str | None = None
    solved: bool | None = None
    context_error: str | None = None
    imagined_values: dict[str, Any] | None = None
    set_aside: dict[str, list[dict[str, Any]]] | None = None
    try:
        if settings.imagine == "values_first":
            imagined_values, query_raw, set_aside = await _imagine_from_values(ctx, trial, memory, persona, variables)
            query = clean_query(query_raw)
            if query:
                values_text = json.dumps(imagined_values, ensure_ascii=False)
                entry = ctx.memory.add(tool, query, pending=True, values=values_text)
            # the trial's conversation holds the request only, as a user would send it: the values it was written
            # from stay out, so the call that follows is read from the request
        else:
            completion = await trial.generate(
                [*conversation, {"role": "user", "content": shown_prompt}],
                stop=IMAGINE_STOP,
                prefill="",
                max_tokens=settings.max_tokens,
                constraint=ctx.imagine_constraint(),
            )
            query_raw = completion.text
            query = clean_query(query_raw)
            trial.messages += [{"role": "user", "content": kept_prompt}, _verbatim(query)]
            entry = ctx.memory.add(tool, query, pending=True) if query else None
        reflection, solved = await _attempt(ctx, trial, conversation, query, first, variables)
    except ContextLengthError as exc:
        # The conversation no longer fits the model: this trial ends here and is logged as it stands (the
        # episode ends too, see run_episode). Raised as a failure, --resume would hit the same wall forever.
        context_error = str(exc)
    except BaseException:
        if entry is not None:
            ctx.memory.discard(tool, entry)
        raise
    if entry is not None:
        ctx.memory.resolve(entry, solved)

    status = "context_full" if context_error is not None else "ok" if query else "empty_query"
    intent_matched = None if imagined_values is None else _intent_matched(tool, imagined_values, trial.steps)
    record = Trial(
        tool=tool,
        episode=episode,
        slot=slot,
        status=status,
        query=query,
        query_raw=query_raw,
        imagined_values=imagined_values,
        intent_matched=intent_matched,
        set_aside=None
        if set_aside is None
        else {**set_aside, "calls": trial.set_aside_calls, "answers": trial.set_aside_answers},
        steps=trial.steps,
        final_answer=trial.final_answer,
        reflection=reflection,
        solved=solved,
        messages=trial.messages,
        tools=ctx.tool_schemas,
        tokens={"prompt": trial.prompt_tokens, "completion": trial.completion_tokens},
        model=ctx.model_name,
        format=ctx.fmt.name,
        decoding=ctx.decoding,
        ablations=ablations.to_dict(),
        settings=settings.trial_shape(),
        started_at=started,
        finished_at=_now(),
        seconds=round(time.perf_counter() - clock, 3),
        error=context_error,
    )
    ctx.log.write(record)
    if ctx.on_trial is not None:
        ctx.on_trial(record)
    return record


def parse_values(text: str) -> dict[str, Any] | None:
    """Imagined argument values: the first JSON object of the reply (constrained, the whole reply is one);
    None when there is none."""
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decode_json_prefix(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        return value if isinstance(value, dict) else None
    return None


# Values first, a tool whose only argument is a program (`program_argument`) is asked for it in a fenced block: the
# prefill opens the fence and the closing fence stops the reply.
PROGRAM_FENCE = "```python\n"
PROGRAM_FENCE_CLOSE = "```"
_COMMENT_LINE = re.compile(r"^[ \t]*#.*(?:\n|$)", re.M)


def program_values(argument: str, completion: Completion) -> tuple[dict[str, Any] | None, str | None]:
    """The values of a program written in a fenced block (`PROGRAM_FENCE`): {argument: the program}, its comment
    lines dropped (a student learns to write them, and they spend its tokens), or (None, why). A reply cut off at
    `max_tokens` is no program: its last line, at least, is unfinished."""
    text = completion.text.split(PROGRAM_FENCE_CLOSE, 1)[0]
    if completion.finish_reason == "length" and PROGRAM_FENCE_CLOSE not in completion.text:
        return None, "the program was cut off (max_tokens)"
    program = textwrap.dedent(_COMMENT_LINE.sub("", text)).strip("\n").rstrip()
    if not program.strip():
        return None, "no program"
    return {argument: program}, None


def program_call(tool: str, argument: str, completion: Completion) -> ParsedReply:
    """A trial's call to a program tool redrawn as a fenced program (`PROGRAM_FENCE`, as values first writes one):
    the call {argument: the program}, or a reply with the reason there is none as its error.

    Why: the 0.5B squeezes a program into a JSON string on one line, and a call that failed that way (a function
    defined and never called, "the tool returned nothing"; `return` outside a function) came back the same when
    drawn again in the format with the problem shown: 6 of the 22 python trials of a demo run ended so, and 3 of
    22 verified. In a ```python block it writes the lines that print the answer, and the trial records the call
    as the format renders it, so the student learns the call, not the block."""
    values, problem = program_values(argument, completion)
    text = PROGRAM_FENCE + completion.text
    if values is None:
        return ParsedReply(text=text, error=problem)
    return ParsedReply(text=text, calls=[tool_call(tool, values)])


def _intent_matched(tool: str, values: dict[str, Any], steps: list[Step]) -> bool:
    """imagine = "values_first": whether the first call to the explored tool, read from the request alone, has
    the values the request was written from (equal by the metrics' semantic rules). A request that leads back to
    its own values states them plainly; one that does not is vague, or the explorer misread it."""
    from toolschool.evaluate.metrics import arguments_match

    calls = [c for step in steps for c in step.calls if c.name == tool]
    if not calls:
        return False
    if arguments_match(tool, calls[0].arguments, values, mode="semantic"):
        return True
    if len(values) == 1 and len(calls[0].arguments) == 1 and set(values) == set(calls[0].arguments):
        (key,) = values
        first, second = values[key], calls[0].arguments[key]
        if isinstance(first, str) and isinstance(second, str) and "print" in first and "print" in second:
            return programs_agree(first, second)
    return False


# True or False, or a line that answers yes or no ("Yes, 580 is divisible by 2."): the same truth printed otherwise
_PRINTED_TRUTH = re.compile(r"\b(True|False)\b|^\s*(?i:(yes)|no)\b", re.MULTILINE)


def _key(value: float) -> float:
    return float(f"{value:.12g}")  # one number however it is printed ("3" and "3.0"), not a rounding of it


def printed_results(text: str, echoed: set[float] | None = None) -> tuple[list[float], list[str]]:
    """The numbers (sorted; read as the data filters read a request: `numbers_in`, so "5,436" is one) and the
    True/False words of a program's output, a line that starts with yes or no read as True or False; with
    `echoed`, leaving out the numbers among them (literals both programs were written with, which they print back:
    "380 is prime: False")."""
    from toolschool.data.filters import numbers_in

    numbers = sorted(_key(n) for n in numbers_in(text))
    truths = [m[1] or ("True" if m[2] else "False") for m in _PRINTED_TRUTH.finditer(text)]
    return [n for n in numbers if n not in (echoed or set())], truths


def _literals(program: str) -> set[float]:
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError):
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            try:
                found.add(_key(float(node.value)))
            except OverflowError:  # an integer past a float's range is not among the printed numbers either
                continue
    return found


def programs_agree(first: str, second: str) -> bool:
    """Whether two programs, both run, print the same result: the same text; or, worded otherwise, the same numbers
    and True/False words, a yes or no answering as one ("The largest is 5436 and the smallest 6." and "5436\\n6";
    "Yes, 580 is divisible by 2." and "True"); or the same once the literals
    both programs were written with are left out of what they print, when something is left ("380 is prime: False"
    and "False"; a program on other data, `n = 67` for `n = 61`, keeps its own literal and does not agree).
    Exploration's check of a program tool's trial (`_intent_matched`), looser than the metrics' (the same text): the
    program written from the request and the trial's call are two readings of one question, and the 0.5B words what
    it prints anew each time. A call answering half the question ("5436" alone) does not agree, unless the half it
    leaves out is one of the shared literals. A program that cannot be run here (no sandbox) agrees with nothing."""
    from toolschool.tools.sandbox import run_python

    try:
        runs = [run_python(first), run_python(second)]
    except Exception:  # noqa: BLE001 - the trial stays unverified; the episode goes on
        return False
    if not all(r.exit_code == 0 and not r.timed_out and r.limit is None for r in runs):
        return False
    texts = [r.stdout.strip() for r in runs]
    if texts[0] == texts[1]:
        return bool(texts[0])
    full = [printed_results(text) for text in texts]
    if full[0] == full[1] and (full[0][0] or full[0][1]):
        return True
    shared = _literals(first) & _literals(second)
    bare = [printed_results(text, shared) for text in texts]
    return bare[0] == bare[1] and bool(bare[0][0] or bare[0][1])


# Values-first imagination draws again (hotter) when the values repeat every short text value already tried, or the
# tool refuses them; the request is written again when it does not state every value, the answer when it does not
# state the call's result.
VALUES_ATTEMPTS = 4
REQUEST_ATTEMPTS = 3
ANSWER_ATTEMPTS = 3
VALUES_TEMPERATURE_STEP = 0.15
_SHORT_TEXT = 40


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _seen_number(value: float) -> str:
    return f"#{abs(value):g}"  # a number's entry among the texts: its size, either sign ("-1406" repeats "1406")


def seen_values(memory: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per argument, the short text values (units, names, dates...) and the sizes of the numbers (`_seen_number`)
    of the values already tried (the long-term memory's `values`)."""
    seen: dict[str, set[str]] = {}
    for item in memory:
        values = parse_values(item.get("values") or "")
        for key, value in (values or {}).items():
            if isinstance(value, str) and len(value) <= _SHORT_TEXT:
                seen.setdefault(key, set()).add(value.strip().casefold())
            elif (number := _number(value)) is not None:
                seen.setdefault(key, set()).add(_seen_number(number))
    return seen


def repeats_seen_texts(values: dict[str, Any], seen: dict[str, set[str]]) -> bool:
    """Whether every short text value of `values` was already tried for its argument (and there is at least one)."""
    texts = [(k, v) for k, v in values.items() if isinstance(v, str) and len(v) <= _SHORT_TEXT]
    return bool(texts) and all(v.strip().casefold() in seen.get(k, set()) for k, v in texts)


def repeats_seen_values(values: dict[str, Any], seen: dict[str, set[str]]) -> bool:
    """Whether `values` repeats what was already tried: every short text value was tried for its argument (and
    there is at least one), or a number other than 0 was, in either sign. A small explorer given the memory
    copies it: it picked the description's example units again and again ("km" to "mile"), and a number it sees
    there as well (date_add: 1406 days in 5 of 25 trials; once 1 was let repeat, -1 day in 9 of 24), so a student
    learns that number as the tool's default rather than reading it from the request. When every draw repeats (an
    argument with few values, all tried), the first draw with new texts is used (`_imagine_from_values`): an argument
    whose values are mostly small counts pays those draws."""
    if repeats_seen_texts(values, seen):
        return True
    return any(
        (number := _number(v)) is not None and number != 0 and _seen_number(number) in seen.get(k, set())
        for k, v in values.items()
    )


def _unpinned(values: dict[str, Any], pinned: dict[str, str]) -> dict[str, Any]:
    """The values the explorer chose itself: those of `values` not held to the situation's choices."""
    return {key: value for key, value in values.items() if key not in pinned}


def request_examples(ctx: ExploreContext) -> list[dict[str, Any]]:
    """The worked examples (made-up tools, `demonstrations.json`) as earlier turns of the request-writing step:
    their values and the request written from them. All of them, whatever `demonstrations` is: they show a small
    explorer what a person's request sounds like, and their tools are not the explored ones, so there is no
    sentence to copy."""
    messages: list[dict[str, Any]] = []
    for example in ctx.prompts.demonstrations():
        program = program_argument(example["tool"], example["parameters"])
        prompt = ctx.prompts.render(
            "imagine_request",
            persona="a user",
            description=example["description"],
            values=json.dumps(example["arguments"], ensure_ascii=False),
            code=takes_code(example["tool"], example["parameters"]),
            program=str(example["arguments"][program]) if program else "",
        )
        messages += [{"role": "user", "content": prompt}, _verbatim(json.dumps(example["query"], ensure_ascii=False))]
    return messages


def answer_misses_result(parsed: ParsedReply, steps: list[Step]) -> bool:
    """Whether `parsed` is a final answer that does not state the result of the last call that ran clean, when that
    result is short enough to state (`result_to_state`): what distill's `require_answer` drops."""
    from toolschool.evaluate.metrics import answer_matches, result_to_state

    if parsed.final is None or parsed.calls or parsed.error is not None:
        return False
    clean = [c for step in steps for c in step.calls if not c.failed]
    if not clean:
        return False
    observation = clean[-1].observation or {}
    expected = result_to_state(observation.get("text"), observation.get("value"))
    return expected is not None and not answer_matches(parsed.final, expected)


def result_problem(observation: dict[str, Any]) -> str | None:
    """Why a tool's result (an observation's dict form) can end no verified trial, or None: the tool refused the
    call (an error: its last line, where a traceback names the error), or it returned nothing (a program that
    prints nothing)."""
    if observation.get("is_error"):
        lines = str(observation.get("text")).strip().splitlines() or [""]
        named = [line for line in lines if re.match(r"^\w*(Error|Exception)\b", line.strip())]
        return f"the tool refused them: {(named[-1] if named else lines[0]).strip()[:200]}"
    value = observation.get("value")
    output = value["stdout"] if isinstance(value, dict) and "stdout" in value else observation.get("text")
    if not str(output if output is not None else "").strip():
        return "the tool returned nothing"
    return None


async def values_problem(ctx: ExploreContext, tool: str, values: dict[str, Any]) -> str | None:
    """Why the tool's own run on imagined values rules them out, or None (`result_problem`). Why: no request
    written from such values can become a verified trial (the call read from it fails too, or shows no result to
    answer with), and a small explorer proposes many (km to m/s, "784!", a program without print()); a run costs
    far less than the request and the trial. A program that only prints a calculation while a calculator is offered
    is ruled out before it runs (`data.filters.calculation_program`: distill drops it, it teaches the student to send
    arithmetic to the program tool)."""
    from toolschool.data.filters import calculation_program, inert_program

    expression = calculation_program(tool, values, ctx.tool_schemas)
    if expression is not None:
        return f"a program that only prints a calculation ({expression[:80]}), which the offered calculator does"
    if inert_program(tool, values, ctx.tool_schemas):
        return "a program that computes nothing (it prints what it was written with)"
    return result_problem((await _execute(ctx, tool, values)).to_dict())


def calls_problem(tool: str, calls: list[Call]) -> str | None:
    """Why the calls a trial's reply ran (`_run_calls`) are drawn again, or None: a call to the explored
    tool failed or returned nothing (`result_problem`). Values first, the values already ran clean, so such a call
    is the explorer's slip, not the request's (a program without `print`, a name error; free decoding, the 0.5B's
    `print(3)}`, which the code grammar refuses when constrained), and a trial spent on it is one distill drops."""
    for call in calls:
        if call.name == tool:
            problem = result_problem(call.observation or {})
            if problem is not None:
                return problem
    return None


def request_problem(ctx: ExploreContext, tool: str, values: dict[str, Any], request: str) -> str | None:
    """Why a request written from `values` does not do: it is empty, a value is not stated in it (distill's
    grounding rules: numbers in any spelling, units as the tool reads them...), or it states a number the values
    do not use (`unused_numbers`: an answer, "... is 11 days", or a detail the call ignores), or it writes a span
    of time with a sign (`signed_span_problem`: "add -125 days") or a direction its value's sign contradicts
    (`span_direction_problem`: "45 days after" for -45). The first asks for something else, so the call read from
    it cannot have the values (a small explorer drops one a time in three); the others teach a student to leave
    numbers out or to read a count's sign at random, and distill drops them."""
    from toolschool.data import filters

    if not request:
        return "no request"
    problem = filters.call_grounding(tool, values, ctx.tool_schemas, filters.Sources(request))
    problem = problem or filters.request_excess_problem(request, [(tool, values)], ctx.tool_schemas)
    return None if problem is None else f"{problem.reason}: {problem.detail}"


async def _imagine_from_values(
    ctx: ExploreContext, trial: _Trial, memory: list[dict[str, str]], persona: str, variables: dict[str, Any]
) -> tuple[dict[str, Any] | None, str, dict[str, list[dict[str, Any]]]]:
    """imagine = "values_first": the explorer picks argument values for the tool (held to its schema when
    decoding is constrained), then writes the request a person with those values would send, in a fresh
    conversation of its own. Why: a small explorer asked for a request with values writes vague or
    developer-style ones ("Write a function to..."), but fills a schema with concrete values well and turns values
    into a question well.

    Values are drawn again (hotter) while they repeat the values already tried or the tool refuses them
    (`values_problem`), and the request is written again while it leaves a value out (`request_problem`): a cheap
    check at each step rather than a trial spent on what distill would drop. Returns (values, raw request, what was
    drawn and set aside with why); values the tool refuses at every draw: (None, "", ...)."""
    system = {"role": "system", "content": ctx.prompts.render("system", tool=trial.tool)}
    parameters = ctx.schema_of(trial.tool).get("parameters")
    where = (ctx.settings.seed, trial.tool, trial.episode, trial.slot, parameters)
    situation = ctx.prompts.situation(*where)
    program = program_argument(trial.tool, parameters)
    if program is not None:
        return await _imagine_program_request(ctx, trial, memory, persona, situation, program)
    prompt = ctx.prompts.render(
        "imagine_values", memory=memory, persona=persona, situation=situation, fenced=program is not None, **variables
    )
    seen = seen_values(memory)
    # the situation's choices hold where decoding is constrained, and are then no repeat of the explorer's own
    pinned = ctx.prompts.situation_choices(*where) if ctx.decoding == "constrained" else {}
    set_aside: dict[str, list[dict[str, Any]]] = {"values": [], "requests": []}
    values = repeated = None
    for attempt in range(VALUES_ATTEMPTS):
        completion = await trial.generate(
            [system, {"role": "user", "content": prompt}],
            stop=[PROGRAM_FENCE_CLOSE] if program else [],
            prefill=PROGRAM_FENCE if program else "",
            max_tokens=ctx.settings.max_tokens,
            constraint=None if program else ctx.values_constraint(trial.tool, pinned),
            with_tools=False,
            temperature=ctx.settings.temperature + VALUES_TEMPERATURE_STEP * attempt,
        )
        drawn, problem = program_values(program, completion) if program else (parse_values(completion.text), None)
        if drawn is None:
            problem = problem or "no JSON object"
        elif repeats_seen_values(_unpinned(drawn, pinned), seen):
            if repeated is None or (
                repeats_seen_texts(_unpinned(repeated, pinned), seen)
                and not repeats_seen_texts(_unpinned(drawn, pinned), seen)
            ):
                repeated = drawn  # used if nothing new comes (and the tool takes it): new texts first
            problem = "repeats values already tried"
        else:
            problem = await values_problem(ctx, trial.tool, drawn)  # the tool runs only for values that may be used
        if problem is None:
            values = drawn
            break
        set_aside["values"].append({"values": drawn, "problem": problem})
    if values is None and repeated is not None and await values_problem(ctx, trial.tool, repeated) is None:
        values = repeated
    if values is None:
        return None, "", set_aside
    request_prompt = ctx.prompts.render(
        "imagine_request",
        persona=persona,
        description=variables["description"],
        values=json.dumps(values, ensure_ascii=False),
        code=variables["code"],
        program=str(values[program]) if program else "",
    )
    text = ""
    for attempt in range(REQUEST_ATTEMPTS):
        completion = await trial.generate(
            [system, *request_examples(ctx), {"role": "user", "content": request_prompt}],
            stop=IMAGINE_STOP + ["\n"],
            prefill="",
            max_tokens=ctx.settings.max_tokens,
            constraint=ctx.imagine_constraint(),
            with_tools=False,
            temperature=ctx.settings.temperature + VALUES_TEMPERATURE_STEP * attempt,
        )
        text = completion.text
        problem = request_problem(ctx, trial.tool, values, clean_query(text))
        if problem is None:
            break
        set_aside["requests"].append({"request": clean_query(text), "problem": problem})
    return values, text, set_aside


PROGRAM_ATTEMPTS = 2


def program_request_examples(ctx: ExploreContext) -> list[dict[str, Any]]:
    """The worked examples of the request-first step (`PromptSet.program_requests`) as earlier turns: each its
    situation's prompt and the request written for it."""
    messages: list[dict[str, Any]] = []
    for situation, request in ctx.prompts.program_requests():
        prompt = ctx.prompts.render("imagine_task", memory=[], persona="a user", situation=situation)
        messages += [{"role": "user", "content": prompt}, _verbatim(request)]
    return messages


# A request imagined first for a program tool is one question: past its first "?" the 0.5B goes on asking ("How many
# parcels weigh 230, 9, and 9182? What is the total number of items in this list passing the test? ..."), often
# the questions of the long-term memory's list, until max_tokens; a program then answers one of them and the
# trial's call another. One question is also what it is asked for, so it needs no more tokens than this.
PROGRAM_REQUEST_TOKENS = 96


def first_question(text: str) -> str:
    """`text` up to and including its first question mark: where a request of one question ends, as if the model
    had stopped there (without the opening quote whose closing one was cut off); a text without one is returned
    whole."""
    end = text.find("?")
    if end < 0:
        return text
    question = text[: end + 1]
    if question[0] in "\"'`" and question.count(question[0]) == 1:
        question = question[1:].lstrip()
    return question


# a call, a definition, an import statement (not the word: "If I import 300 crates...")
_CODE_IN_REQUEST = re.compile(r"\bprint\s*\(|\bdef \w+\s*\(|^\s*(?:from [\w.]+ )?import \w", re.MULTILINE)


def task_problem(ctx: ExploreContext, request: str, memory: list[dict[str, str]]) -> str | None:
    """Why a request imagined first for a program tool is written again, or None: it is empty, it holds code (a
    person asks a question; the program is the assistant's), a sentence of it comes twice (the 0.5B, past its
    question, writes it again and again), or it repeats a worked example's request or one already tried
    (casefolded)."""
    if not request:
        return "no request"
    if "```" in request or _CODE_IN_REQUEST.search(request):
        return "the request holds code"
    sentences = [part.strip().casefold() for part in re.split(r"(?<=[.?!])\s+", request) if part.strip()]
    if len(set(sentences)) < len(sentences):
        return "the request repeats itself"
    said = {item.get("query", "").strip().casefold() for item in memory}
    said |= {example.casefold() for _situation, example in ctx.prompts.program_requests()}
    if request.strip().casefold() in said:
        return "repeats a request already tried or shown"
    return None


async def _imagine_program_request(
    ctx: ExploreContext,
    trial: _Trial,
    memory: list[dict[str, str]],
    persona: str,
    situation: str,
    program: str,
) -> tuple[dict[str, Any] | None, str, dict[str, list[dict[str, Any]]]]:
    """imagine = "values_first" on a tool whose only argument is a program (`program_argument`): the request first,
    then its values, the program that answers it, written from the request alone in a fresh conversation. The trial
    that follows reads another call from the same request, and is verified when both programs print the same
    (`_intent_matched`: the metrics' semantic rule for programs): two independent readings agreeing.

    Why not values first here: a program is not values a person has. Shown one, the 0.5B wrote requests that leave
    its data out ("Can you help me determine if a number is prime?") and then called a different program; 0 of 24
    python trials verified in two demo runs, and the student never saw the tool used. Asked for a question with its
    data written out (after worked examples, `program_request_examples`), it writes "Is 61 a prime number?"; asked
    for a program that works one thing out, "Can you write a short program to check if 380 is prime?" (a person
    who wants code run says so, and the student learns to send such requests to the program tool).

    A request is written again while it holds code or repeats one tried (`task_problem`); each request gets up to
    `PROGRAM_ATTEMPTS` programs, each ruled out like imagined values (`values_problem`: it must run clean and print,
    and not be a bare calculation beside a calculator) and like a values-first request (`request_problem`: the
    program's literals stated in the request, the request's numbers used by it). Returns (program values, raw
    request, what was set aside with why); no request with a program that passes: (None, "", ...)."""
    system = {"role": "system", "content": ctx.prompts.render("system", tool=trial.tool)}
    task_prompt = ctx.prompts.render("imagine_task", memory=memory, persona=persona, situation=situation)
    examples = program_request_examples(ctx)
    set_aside: dict[str, list[dict[str, Any]]] = {"values": [], "requests": []}
    for attempt in range(REQUEST_ATTEMPTS):
        completion = await trial.generate(
            [system, *examples, {"role": "user", "content": task_prompt}],
            stop=IMAGINE_STOP + ["\n"],
            prefill="",
            max_tokens=min(ctx.settings.max_tokens, PROGRAM_REQUEST_TOKENS),
            constraint=ctx.imagine_constraint(),
            with_tools=False,
            temperature=ctx.settings.temperature + VALUES_TEMPERATURE_STEP * attempt,
        )
        cleaned = clean_query(completion.text)
        request = first_question(cleaned)
        # the text the trial records as written: the model's own, or the question it was cut to
        text = completion.text if request == cleaned else request
        problem = task_problem(ctx, request, memory)
        if problem is not None:
            set_aside["requests"].append({"request": request, "problem": problem})
            continue
        program_prompt = ctx.prompts.render("imagine_program", query=request)
        for draw in range(PROGRAM_ATTEMPTS):
            completion = await trial.generate(
                [system, {"role": "user", "content": program_prompt}],
                stop=[PROGRAM_FENCE_CLOSE],
                prefill=PROGRAM_FENCE,
                max_tokens=ctx.settings.max_tokens,
                constraint=None,
                with_tools=False,
                temperature=ctx.settings.attempt_temperature + VALUES_TEMPERATURE_STEP * draw,
            )
            values, problem = program_values(program, completion)
            if values is not None:
                problem = await values_problem(ctx, trial.tool, values) or request_problem(
                    ctx, trial.tool, values, request
                )
            if problem is None:
                return values, text, set_aside
            set_aside["values"].append({"values": values, "problem": problem, "request": request})
        set_aside["requests"].append({"request": request, "problem": "no program written from it passed"})
    return None, "", set_aside


async def _attempt(
    ctx: ExploreContext,
    trial: _Trial,
    conversation: list[dict[str, Any]],
    query: str,
    first: bool,
    variables: dict[str, Any],
) -> tuple[str | None, bool | None]:
    """Steps 2 and 3: try to fulfil the query (the final answer goes to `trial.final_answer`, kept even when the
    reflection no longer fits the context), then reflect. Returns (reflection, solved)."""
    settings = ctx.settings
    ablations = settings.ablations
    reflection: str | None = None
    solved: bool | None = None
    if query:
        # 2. try
        trial_prompt = ctx.prompts.render("trial" if first else "trial_followup", query=query, **variables)
        trial.messages.append({"role": "user", "content": trial_prompt})
        fmt = ctx.fmt
        calls_left = settings.max_turns
        parameters = ctx.schema_of(trial.tool).get("parameters")
        program = program_argument(trial.tool, parameters) if settings.imagine == "values_first" else None
        for turn in range(settings.max_turns + 1):
            # force_call: the first reply is a call to the explored tool (a named tool_choice), so a model too weak
            # to decide to call a tool still writes arguments and learns from their execution. Constrained, that
            # and every other call is valid by construction; free (a backend that cannot constrain), the reply
            # starts with the format's call opener and the model writes the arguments as it will.
            budget_left = calls_left if turn < settings.max_turns else 0
            if turn > 0 and budget_left <= 0:
                # the calls are spent: say so, and ask for the answer (a small explorer shown a result otherwise
                # calls again, or stops without a word)
                results = [m["content"] for m in trial.messages if m.get("role") == "tool"]
                prompt = ctx.prompts.render("answer", result=results[-1] if results else "", **variables)
                trial.messages.append({"role": "user", "content": prompt})
            constraint = ctx.trial_constraint(trial.tool, turn, budget_left)
            forced = settings.force_call and turn == 0 and constraint is None
            prefill = fmt.call_prefix(trial.tool).rstrip() if forced else fmt.prefill
            last = turn == settings.max_turns or calls_left <= 0
            ran: tuple[list[Call], list[Call], list[dict[str, Any]]] | None = None
            retry: list[dict[str, Any]] = []  # the call set aside last and why, shown to its redraw
            for attempt in range(ANSWER_ATTEMPTS):
                ran = None
                if retry and program is not None:
                    # a program tool's call is redrawn as a fenced program (`program_call`)
                    completion = await trial.generate(
                        [*conversation, *trial.messages, *retry],
                        stop=[PROGRAM_FENCE_CLOSE],
                        prefill=PROGRAM_FENCE,
                        max_tokens=settings.max_tokens,
                        constraint=None,
                        temperature=settings.attempt_temperature + VALUES_TEMPERATURE_STEP * attempt,
                    )
                    raw = PROGRAM_FENCE + completion.text
                    parsed = program_call(trial.tool, program, completion)
                    if parsed.error is not None and attempt < ANSWER_ATTEMPTS - 1:
                        continue  # no program in the block: drawn again, shown the same call and problem
                else:
                    completion = await trial.generate(
                        [*conversation, *trial.messages, *retry],
                        stop=fmt.stop,
                        prefill=prefill,
                        max_tokens=settings.max_tokens,
                        constraint=constraint,
                        temperature=settings.attempt_temperature + VALUES_TEMPERATURE_STEP * attempt,
                    )
                    raw = prefill + completion.text
                    parsed = fmt.parse(raw, ctx.tool_schemas)
                if settings.imagine != "values_first":
                    break
                final_attempt = attempt == ANSWER_ATTEMPTS - 1
                if parsed.calls and parsed.error is None and not last:
                    # values first, a call the tool refuses or that returns nothing is drawn again: distill drops it
                    ran = await _run_calls(ctx, trial, parsed, turn, calls_left)
                    problem = calls_problem(trial.tool, ran[0])
                    if problem is None or final_attempt:
                        break
                    calls = [{"name": c.name, "arguments": c.arguments} for c in ran[0]]
                    trial.set_aside_calls.append({"calls": calls, "problem": problem})
                    if not ablations.no_exec_feedback:
                        # trial and error: the redraw sees the call and what went wrong with it (a program that
                        # defines a function and never calls it, "the tool returned nothing"); only the call that
                        # works stays in the trial, as it will be taught
                        feedback = ctx.prompts.render(
                            "call_retry", error=problem, fenced=program is not None, **variables
                        )
                        retry = [_verbatim(raw), {"role": "user", "content": feedback}]
                    continue
                # an answer that does not state the call's result is written again: distill drops it
                if not answer_misses_result(parsed, trial.steps) or final_attempt:
                    break
                trial.set_aside_answers.append(str(parsed.final))
            if parsed.final is not None and not parsed.calls and parsed.error is None:
                trial.steps.append(_step(completion, raw, parsed, executed=False))
                trial.messages.append(parsed.as_message())
                trial.final_answer = parsed.final
                break
            if last:  # the call (or reply) budget is spent: record the reply, do not execute it (as in the paper)
                trial.steps.append(_step(completion, raw, parsed, executed=False))
                trial.messages.append(_verbatim(raw))  # plain text: a call without a result breaks endpoints
                break
            step = _step(completion, raw, parsed, executed=parsed.error is None)
            if parsed.error is not None:
                if ablations.no_exec_feedback:
                    feedback = ctx.prompts.render("no_feedback")
                else:
                    feedback = ctx.prompts.render("parse_error", error=parsed.error, **variables)
                step.feedback = feedback
                trial.messages += [_verbatim(raw), {"role": "user", "content": feedback}]
            else:
                if ran is None:
                    ran = await _run_calls(ctx, trial, parsed, turn, calls_left)
                step.calls, step.skipped_calls, tool_messages = ran
                calls_left -= len(step.calls)
                step.error = any(c.failed for c in step.calls)
                trial.messages += [parsed.as_message(), *tool_messages]
            trial.steps.append(step)
        # 3. reflect (values first, the intent check judges the trial instead: no Yes/No is asked)
        if not ablations.no_reflection and settings.imagine != "values_first":
            trial.messages.append({"role": "user", "content": ctx.prompts.render("reflect", **variables)})
            completion = await trial.generate(
                [*conversation, *trial.messages],
                stop=[],
                prefill="",
                max_tokens=min(settings.reflection_max_tokens, settings.max_tokens),
                constraint=ctx.reflect_constraint(),
                temperature=settings.attempt_temperature,
            )
            reflection = completion.text.strip()
            solved = parse_reflection(reflection)
            trial.messages.append(_verbatim(reflection))
    return reflection, solved


def demonstration_messages(ctx: ExploreContext) -> list[dict[str, Any]]:
    """The worked examples as earlier turns: the imagine prompt and its query, the trial prompt, a call, its
    result and the answer — rendered with the same templates as the real trials, so the model sees the exact
    shape of what it is asked to do. The examples' tools are made up (see prompts/demonstrations.json)."""
    count = ctx.settings.demonstrations
    if count <= 0:
        return []
    messages: list[dict[str, Any]] = []
    for index, example in enumerate(ctx.prompts.demonstrations()[:count]):
        variables = {
            "tool": example["tool"],
            "description": example["description"],
            "parameters": json.dumps(example["parameters"], ensure_ascii=False),
            "tool_names": [example["tool"]],
            "max_turns": ctx.settings.max_turns,
            "code": takes_code(example["tool"], example["parameters"]),
        }
        call_id = f"demo_{index}"
        messages += [
            {"role": "user", "content": ctx.prompts.render("imagine", memory=[], persona="a user", **variables)},
            _verbatim(example["query"]),
            {"role": "user", "content": ctx.prompts.render("trial", query=example["query"], **variables)},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [tool_call(example["tool"], example["arguments"], call_id)],
            },
            {"role": "tool", "tool_call_id": call_id, "name": example["tool"], "content": example["result"]},
            {"role": "assistant", "content": example["answer"]},
        ]
    return messages


def ends_episode(trial: Trial, *, no_stm: bool) -> bool:
    """A trial that outgrew the model's context ends its episode: the short-term memory only grows, so every
    later trial of the conversation would too. Without short-term memory each trial starts afresh."""
    return trial.status == "context_full" and not no_stm


def episode_finished(slots: dict[int, Trial], stm_slots: int, *, no_stm: bool) -> bool:
    """Every slot of the episode is logged, or a logged trial ended it (`ends_episode`)."""
    return len(slots) >= stm_slots or any(ends_episode(r, no_stm=no_stm) for r in slots.values())


async def run_episode(ctx: ExploreContext, tool: str, episode: int, done: dict[int, Trial]) -> int:
    """Run the slots of one episode not in `done` (slot -> logged trial); return how many trials ran.

    Resume replays the logged trials' messages into the conversation, so a resumed episode continues exactly
    where its short-term memory stopped (with `no_stm`, every trial starts from the system message anyway).
    A trial that no longer fits the model's context ends the episode (`ends_episode`).
    """
    system = {"role": "system", "content": ctx.prompts.render("system", tool=tool)}
    preamble = [system, *demonstration_messages(ctx)]
    conversation: list[dict[str, Any]] = list(preamble)
    ablations = ctx.settings.ablations
    ran = 0
    for slot in range(ctx.settings.stm_slots):
        if ablations.no_stm:
            conversation = list(preamble)
        if slot in done:
            if ends_episode(done[slot], no_stm=ablations.no_stm):
                break
            conversation += done[slot].messages
            continue
        # The worked examples hold assistant turns too: "first" means no trial of this tool in the conversation.
        record = await run_trial(ctx, tool, episode, slot, conversation, first=len(conversation) == len(preamble))
        conversation += record.messages
        ran += 1
        if ends_episode(record, no_stm=ablations.no_stm):
            break
    return ran
