"""`toolschool distill`: exploration trials -> a training dataset (filter, judge, dedupe, paraphrase, split).

Steps, each counted per tool in `summary.json` and the dataset card (`README.md`) next to the data; the filters'
yield (how many entered each, how many it removed and why, in order) is `summary["yield"]`, a table of the card,
and printed by `toolschool distill`:

1. **rules** — keep a trial whose final answer follows a call that executed without error, and in which the
   explored tool itself was called successfully, unless the explorer's own reflection said it did not fulfil the
   request (`require_solved`: unless it said it did), and (`require_answer`) whose final answer states a short tool
   result as eval's answer accuracy reads it, and whose request does not already state it; a trial imagined values
   first (`[explore] imagine`) is judged instead by whether the call read from the request had the values the
   request was written from. The training conversation is the clean path: the query, the steps whose calls all
   executed, the final answer (failed attempts are not taught).
2. **grounding** (`require_grounded`) — every argument value of every call is stated in, or derivable from, the
   request (or an earlier result of the same conversation): numbers, dates in any spelling, units, names, a
   calculator expression's numbers, a python program's literals (`toolschool.data.filters`).
3. **echo** — a request that copies a sentence of the exploration prompts, a worked example, or a tool's
   description is not a user's request (`toolschool.data.filters`).
4. **judge** (optional, any backend) — Yes/No with a reason on three criteria (the answer addresses the
   query informatively; it is faithful to the execution results; the tools were used appropriately). Every
   judgment, kept or not, goes to `judgments.jsonl`; kept lines carry theirs in `meta.judge`.
5. **round trip** (`round_trip`, with an explorer model: `explorer_model`, else the run's explorer, else the
   judge) — that model, given only the request and the tools in a fresh context, writes an equivalent first call
   (`toolschool.data.round_trip`).
6. **dedupe** — near-identical queries per tool (the tokens of `dataset.same_request_key`: case-folded words,
   numbers and arithmetic operators; the same key, or token-set Jaccard >= threshold with the same numbers and
   operators in the same order).
7. **paraphrase** (optional, any backend) — up to `target_per_tool` per tool, at most `max_paraphrases` per
   original; a paraphrase is rejected when it is empty, the original again (`same_request_key`), repeats the
   paraphrasing prompt's instructions, states the answer (the final answer or the last tool result) instead of
   asking, drops a number, date, unit, name or quoted value the call arguments take from the query (or the month
   of a date the query names), adds a number neither the query nor the call has (it would ask for another call),
   puts a unit or name next to another number than in the query ("5 miles in km" for "5 km in miles"), is cut off
   at `paraphrase_max_tokens`, or repeats a query or paraphrase of the tool (of any original). With a judge, each
   paraphrase that passes is judged too (the same request? Yes/No + reason, `paraphrase_judgments.jsonl`) and kept
   only on Yes. Every rejection is counted with its reason in `summary.json` and the card.
8. **split** — train / validation by original query, so an original and its paraphrases stay together (and
   originals sharing a query text across tools too: no query is in both splits).
9. **no-tool lines** (`toolschool.data.irrelevance`) — `irrelevance_fraction` of the tool lines again with the
   tools that fit taken away, answered "no offered tool fits" (in their request's split), and, with an explorer
   model, `chitchat_fraction` of them as chit-chat it imagines and answers without tools; `out_of_scope_fraction`
   of them as requests for a service no offered tool gives (a fixed list of tasks), answered that none can.

Grounding and echo details and each round trip's reply go to `filtered.jsonl`.

Judge and paraphraser replies are cached append-only (`cache.jsonl`), so an interrupted run resumes
without asking the model again; a rerun whose paraphrase plan changed (more trials, another target) reuses the
cached paraphrases and asks only for the samples it lacks.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolschool.chat.types import tool_call
from toolschool.data.cache import ReplyCache
from toolschool.data.dataset import same_request_key, validate_example, write_jsonl
from toolschool.data.filters import (
    EchoSource,
    echo_problem,
    exploration_echo_sources,
    grounding_problem,
    tool_description_sources,
)
from toolschool.data.irrelevance import (
    ChitchatOptions,
    build_chitchat,
    build_irrelevance,
    build_out_of_scope,
    lines_wanted,
)
from toolschool.data.round_trip import run_round_trips
from toolschool.errors import DataError
from toolschool.evaluate.metrics import EXPECTED_ANSWER_MAX_CHARS, answer_matches, result_to_state
from toolschool.models.backend import Backend, Completion, GenerationRequest, SamplingParams

STEPS = (
    "trials",
    "rules",
    "grounded",
    "no_echo",
    "judge",
    "round_trip",
    "dedupe",
    "paraphrases",
    "irrelevance",
    "chitchat",
    "out_of_scope",
    "final",
    "train",
    "validation",
)
# The filters in the order they run: (name in `dropped` and the yield, the step of `STEPS` counting what it kept).
FILTERS = (
    ("rules", "rules"),
    ("grounding", "grounded"),
    ("echo", "no_echo"),
    ("judge", "judge"),
    ("round_trip", "round_trip"),
    ("dedupe", "dedupe"),
)
NO_TOOL = "(no tool)"  # the per-tool row of the lines that answer without a call


# ---------------------------------------------------------------------------------------------- rules


@dataclass
class Candidate:
    """One kept trial, as a training conversation plus what later steps need."""

    id: str
    tool: str
    query: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    calls: list[dict[str, Any]]
    final_answer: str
    meta: dict[str, Any] = field(default_factory=dict)

    def example(self, query: str | None = None, **meta: Any) -> dict[str, Any]:
        messages = [dict(m) for m in self.messages]
        if query is not None:
            messages[0] = {**messages[0], "content": query}
        return {"messages": messages, "tools": self.tools, "meta": {**self.meta, **meta}}


def _call_ok(call: dict[str, Any]) -> bool:
    observation = call.get("observation") or {}
    return call.get("executed", True) is not False and not observation.get("is_error", False)


def _kind(value: Any) -> str:
    return {dict: "JSON object", list: "list", str: "str"}.get(type(value), type(value).__name__)


def trial_problem(trial: Any) -> str | None:
    """Why a trial record does not have the trial log's shape (see `toolschool.explore.log`), or None.

    This is the line being malformed, not the trial failing a rule: it stops distillation with the line named,
    instead of an AttributeError deep in the rules.
    """
    if not isinstance(trial, dict):
        return f"a trial must be a JSON object, got {_kind(trial)}"
    for key in ("query", "final_answer", "status"):
        if trial.get(key) is not None and not isinstance(trial[key], str):
            return f"{key} must be a string or null, got {_kind(trial[key])}"
    for key in ("steps", "tools"):
        if trial.get(key) is not None and not isinstance(trial[key], list):
            return f"{key} must be a list, got {_kind(trial[key])}"
    for i, step in enumerate(trial.get("steps") or []):
        if not isinstance(step, dict):
            return f"steps[{i}] must be a JSON object, got {_kind(step)}"
        calls = step.get("calls")
        if calls is not None and not isinstance(calls, list):
            return f"steps[{i}].calls must be a list, got {_kind(calls)}"
        for j, call in enumerate(calls or []):
            if not isinstance(call, dict):
                return f"steps[{i}].calls[{j}] must be a JSON object, got {_kind(call)}"
            observation = call.get("observation")
            if observation is not None and not isinstance(observation, dict):
                return f"steps[{i}].calls[{j}].observation must be a JSON object or null, got {_kind(observation)}"
    return None


def read_trial_log(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The trials of a log, each with `_where` = `file:line`, and a note when a torn last line was ignored.

    Unlike `toolschool.explore.log.read_trials` (which serves resuming, where a last line without its newline is
    redone), a complete last trial without a newline is kept: a log written by hand or by another tool often
    ends that way, and distilling must not drop its last trial silently. A last line that is not complete JSON
    (an exploration still writing, or interrupted mid-line) is ignored and reported; a bad line elsewhere stops.
    """
    from toolschool.explore.log import TRIALS_FILE

    if path.is_dir():
        path = path / TRIALS_FILE
    if not path.is_file():
        raise DataError(f"trial log '{path}' does not exist", hint="run `toolschool explore` first")
    lines = path.read_bytes().split(b"\n")
    records: list[dict[str, Any]] = []
    note = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if number == len(lines):
                note = f"{path}:{number}: incomplete last line ignored (an exploration still writing, or interrupted)"
                break
            raise DataError(
                f"{path}:{number}: not valid JSON ({exc})", hint="restore the trial log or move the bad line away"
            ) from None
        if not isinstance(record, dict) or not {"tool", "episode", "slot"} <= record.keys():
            raise DataError(f"{path}:{number}: not a trial record (needs tool, episode and slot)")
        records.append({**record, "_where": f"{path}:{number}"})
    return records, note


def trial_to_candidate(
    trial: dict[str, Any], *, require_solved: bool = False, require_answer: bool = False
) -> tuple[Candidate | None, str | None]:
    """The clean conversation of a trial, or the rule it fails. `require_answer`: a short tool result (a number,
    a date, a word) must be what the final answer states, as the metrics' answer accuracy reads it, and not what
    the request already states (unless a call argument holds it too, e.g. a string a program prints)."""
    tool = str(trial.get("tool"))
    if trial.get("status", "ok") != "ok":
        return None, f"status {trial.get('status')}"
    query = (trial.get("query") or "").strip()
    if not query:
        return None, "empty query"
    final = trial.get("final_answer")
    if not isinstance(final, str) or not final.strip():
        return None, "no final answer"
    if require_solved and trial.get("solved") is not True:
        return None, "not self-reported as solved"
    intent = trial.get("intent_matched")
    if intent is False:
        return None, "the call read from the request lacks the values it was written from"
    if intent is None and trial.get("solved") is False:
        # values-first trials are judged by that check instead: a small explorer's Yes/No is near chance
        return None, "the explorer's reflection said it was not solved"
    steps = trial.get("steps") or []
    if any(s.get("skipped_calls") for s in steps):  # answered "not run": the clean path cannot show that
        return None, "calls past the call budget were not run"
    call_steps = [s for s in steps if s.get("calls")]
    if not call_steps:
        return None, "no tool call"
    last = call_steps[-1]
    if last.get("executed") is False or not all(_call_ok(c) for c in last["calls"]) or last.get("parse_error"):
        return None, "last call before the final answer failed"
    messages: list[dict[str, Any]] = [{"role": "user", "content": query}]
    calls: list[dict[str, Any]] = []
    last_result: str | None = None
    expected: str | float | None = None
    n = 0
    for step in call_steps:
        if step.get("executed") is False or step.get("parse_error") or not all(_call_ok(c) for c in step["calls"]):
            continue  # failed attempts are not taught; the clean path keeps what worked
        tool_calls, results = [], []
        for call in step["calls"]:
            call_id = call.get("id") or f"call_{n}"
            n += 1
            arguments = call.get("arguments")
            if not isinstance(arguments, dict):
                return None, "call arguments are not a JSON object"
            tool_calls.append(tool_call(str(call.get("name")), arguments, call_id))
            observation = call.get("observation") or {}
            text = observation.get("text") if observation.get("text") is not None else call.get("shown", "")
            results.append({"role": "tool", "tool_call_id": call_id, "name": call.get("name"), "content": str(text)})
            calls.append({"name": call.get("name"), "arguments": arguments})
            last_result = str(text).strip()
            expected = result_to_state(last_result, observation.get("value"))
        messages.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        messages.extend(results)
    if not any(c["name"] == tool for c in calls):
        return None, "the explored tool was not called successfully"
    if require_answer and expected is not None and not answer_matches(final, expected):
        return None, "the final answer does not state the tool's result"
    if require_answer and expected is not None and answer_matches(query, expected):
        in_arguments = any(answer_matches(json.dumps(c["arguments"]), expected) for c in calls)
        if not in_arguments:  # "Adding 2 days to 2023-04-21 results in 2023-04-23." asks for nothing
            return None, "the request states the tool's result"
    messages.append({"role": "assistant", "content": final.strip()})
    tools = trial.get("tools") or []
    example = {"messages": messages, "tools": tools, "meta": {}}
    problem = validate_example(example)
    if problem is not None:
        return None, f"invalid conversation ({problem})"
    trial_id = f"{tool}/e{trial.get('episode')}/s{trial.get('slot')}"
    meta = {
        "id": trial_id,
        "original_id": trial_id,
        "tool": tool,
        "source": "explore",
        "category": "explore",
        # The real tool's result of the last successful call: what a correct final answer must state.
        # Kept only when short (a number, a date, a converted quantity), where answer matching is meaningful.
        "expected_answer": last_result if last_result and len(last_result) <= EXPECTED_ANSWER_MAX_CHARS else None,
        "model": trial.get("model"),
        "solved": trial.get("solved"),
        "paraphrase": False,
    }
    return Candidate(trial_id, tool, query, messages, tools, calls, final.strip(), meta), None


# ---------------------------------------------------------------------------------------------- judge

JUDGE_CRITERIA = ("addresses", "faithful", "appropriate")
JUDGE_PROMPT = """You check one example of an assistant using tools.
Answer each question with Yes or No and a short reason.

User query:
{query}

Tool calls and their results:
{calls}

Final answer:
{final}

Questions:
1. Does the final answer address the query informatively?
2. Is the final answer faithful to the tool results (no invented facts)?
3. Were the tools used appropriately for the query?

Reply with exactly three lines:
Addresses: Yes|No - reason
Faithful: Yes|No - reason
Appropriate: Yes|No - reason"""
# "Faithful: No - reason", also numbered ("2. ", "2) ") like the questions, bulleted or in bold. A verdict
# followed by its alternative ("Yes|No", "Yes/No", "Yes or No": the reply format echoed back, as a small judge
# does) is no verdict: read as Yes, an echo of the prompt's three format lines kept every trial.
_NOT_AN_ALTERNATIVE = r"(?!\s*(?:[|/]|or\b)\s*(?:yes|no)\b)"
_JUDGE_LINE = re.compile(
    rf"^\W*(?:\d+[.)]\W*)?(addresses|faithful|appropriate)\W*\s*(yes|no)\b{_NOT_AN_ALTERNATIVE}\W*(.*)$",
    re.IGNORECASE,
)
# "2. No - reason": the answer to question 2, numbered as the prompt numbers them, without the criterion's name
_JUDGE_NUMBERED = re.compile(rf"^\W*([1-3])\s*[.):]\W*(yes|no)\b{_NOT_AN_ALTERNATIVE}\W*(.*)$", re.IGNORECASE)


def judge_prompt(candidate: Candidate) -> str:
    lines = []
    for message in candidate.messages[1:-1]:
        if message.get("tool_calls"):
            for call in message["tool_calls"]:
                lines.append(f"CALL {call['function']['name']}({json.dumps(call['function']['arguments'])})")
        elif message.get("role") == "tool":
            lines.append(f"RESULT {str(message.get('content'))[:600]}")
    return JUDGE_PROMPT.format(query=candidate.query, calls="\n".join(lines), final=candidate.final_answer)


def parse_judgment(text: str) -> dict[str, Any]:
    """{criterion: {"verdict": bool, "reason": str}} plus `keep` (all Yes) and `error` when a line is missing.

    A criterion's line is `Name: Yes|No - reason` (as asked) or, failing that, `N. Yes|No - reason` for question N.
    A reply without a verdict for every criterion is not kept; its `error` says which are missing."""
    found: dict[str, dict[str, Any]] = {}
    numbered: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        match = _JUDGE_LINE.match(line.strip())
        if match and match.group(1).lower() not in found:
            found[match.group(1).lower()] = {
                "verdict": match.group(2).lower() == "yes",
                "reason": match.group(3).strip(" -:"),
            }
            continue
        match = _JUDGE_NUMBERED.match(line.strip())
        if match and JUDGE_CRITERIA[int(match.group(1)) - 1] not in numbered:
            numbered[JUDGE_CRITERIA[int(match.group(1)) - 1]] = {
                "verdict": match.group(2).lower() == "yes",
                "reason": match.group(3).strip(" -:"),
            }
    found = {c: found.get(c) or numbered[c] for c in JUDGE_CRITERIA if c in found or c in numbered}
    missing = [c for c in JUDGE_CRITERIA if c not in found]
    result: dict[str, Any] = {**found, "raw": text}
    result["error"] = f"no verdict for {', '.join(missing)}" if missing else None
    result["keep"] = not missing and all(found[c]["verdict"] for c in JUDGE_CRITERIA)
    return result


# ---------------------------------------------------------------------------------------------- dedupe
# Queries are compared as the tokens of `same_request_key` (toolschool.data.dataset), the project's one definition
# of "the same request": what distill calls one request, the dataset builds, the held-out set and ICL retrieval do.


def jaccard(a: str, b: str) -> float:
    """Token-set Jaccard similarity of two requests' `same_request_key` tokens."""
    sa, sb = set(same_request_key(a).split()), set(same_request_key(b).split())
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


_ATOM = re.compile(r"\d+|[-+*/×÷^%=<>]")


def _atoms(norm: str) -> list[str]:
    """The numbers and operators of a `same_request_key`, in order: what a word set cannot see."""
    return [token for token in norm.split() if _ATOM.fullmatch(token)]


def near_duplicate(text: str, others: list[str], threshold: float) -> bool:
    """The same request (`same_request_key`), or word-set Jaccard >= threshold with the same numbers and operators
    in the same order ("12 - 5" and "5 - 12", or 2024-05-01 and 2024-01-05, share every word but ask for other
    calls)."""
    norm = same_request_key(text)
    atoms = _atoms(norm)
    for other in others:
        other_norm = same_request_key(other)
        if norm == other_norm or (atoms == _atoms(other_norm) and jaccard(text, other) >= threshold):
            return True
    return False


def dedupe(candidates: list[Candidate], threshold: float) -> tuple[list[Candidate], list[Candidate]]:
    """Keep the first of each group of near-identical queries (per tool); return (kept, removed)."""
    kept: list[Candidate] = []
    removed: list[Candidate] = []
    seen: dict[str, list[str]] = defaultdict(list)
    for candidate in candidates:
        if near_duplicate(candidate.query, seen[candidate.tool], threshold):
            removed.append(candidate)
        else:
            seen[candidate.tool].append(candidate.query)
            kept.append(candidate)
    return kept, removed


# ---------------------------------------------------------------------------------------------- paraphrase

PARAPHRASE_PROMPT = """Rewrite the user request below in different words, as a user would ask it.
Keep every number, date, name and unit exactly as written. Reply with the rewritten request only.

Request: {query}"""
_NUM = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def _numbers(text: str) -> set[str]:
    out = set()
    for match in _NUM.findall(text):
        raw = match.replace(",", "")
        try:
            value = float(raw)
        except ValueError:
            continue
        out.add(repr(value))
    return out


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flatten(v)]
    if isinstance(value, list):
        return [x for v in value for x in _flatten(v)]
    return [value]


def required_atoms(query: str, calls: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """What a paraphrase must keep: (numbers, phrases) that the calls' arguments take from the query.

    Numbers are compared by value (`1,200` = `1200`); phrases are short string arguments (units, dates,
    names such as `km`, `2024-05-01`, `Paris`) that appear in the query, compared case-insensitively.
    """
    query_numbers = _numbers(query)
    query_lower = query.lower()
    numbers: set[str] = set()
    phrases: set[str] = set()
    for call in calls:
        for value in _flatten(call.get("arguments") or {}):
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(value, int | float):
                key = repr(float(value))
                if key in query_numbers:
                    numbers.add(key)
                continue
            text = str(value)
            numbers |= _numbers(text) & query_numbers
            for date in _DATE.findall(text):
                if date in query:
                    phrases.add(date.lower())
            if (
                len(text.split()) <= 4
                and text.strip()
                and not _NUM.fullmatch(text.strip())  # a number is checked by value above
                and re.search(rf"(?<!\w){re.escape(text.lower())}(?!\w)", query_lower)
            ):
                phrases.add(text.lower())
    return numbers, phrases


def _call_numbers(calls: list[dict[str, Any]]) -> set[str]:
    """Every number in the calls' arguments, compared by value like `_numbers`."""
    out: set[str] = set()
    for call in calls:
        for value in _flatten(call.get("arguments") or {}):
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(value, int | float):
                out.add(repr(float(value)))
            else:
                out |= _numbers(str(value))
    return out


def _number_phrase_pairs(text: str, numbers: set[str], phrases: set[str]) -> set[tuple[str, str]]:
    """(number, phrase) pairs written side by side ("5 km"): which number a unit belongs to. Keeping every
    number and unit is not enough: "5 miles in km" keeps both of "5 km in miles" and asks for another call."""
    pairs: set[tuple[str, str]] = set()
    lower = text.lower()
    for phrase in phrases:
        for match in re.finditer(rf"({_NUM.pattern})\s*{re.escape(phrase)}(?!\w)", lower):
            pairs |= {(value, phrase) for value in _numbers(match.group(1)) & numbers}  # by value, as elsewhere
    return pairs


# Quoted spans: "…", “…”, ‘…’, `…`, and '…' where the quotes are not apostrophes (what's, Ann's).
_QUOTED = re.compile(r'"([^"\n]+)"|“([^”\n]+)”|‘([^’\n]+)’|`([^`\n]+)`|(?<!\w)\'([^\'\n]+)\'(?!\w)')


def quoted_values(query: str, calls: list[dict[str, Any]]) -> set[str]:
    """Quoted spans of the query that a call's string argument holds (a text to count, a word to look up, a file
    name): kept verbatim, whatever their length (`required_atoms` takes names of up to four words only)."""
    strings = [v for call in calls for v in _flatten(call.get("arguments") or {}) if isinstance(v, str)]
    values = set()
    for match in _QUOTED.finditer(query):
        value = next(g for g in match.groups() if g is not None).strip()
        if value and any(value in s for s in strings):
            values.add(value)
    return values


_MONTH = re.compile(
    r"(?<!\w)(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|"
    r"oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?(?!\w)",
    re.IGNORECASE,
)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


def _months_named(text: str) -> set[int]:
    return {_MONTHS.index(m.group(1)[:3].lower()) + 1 for m in _MONTH.finditer(text)}


def required_months(query: str, calls: list[dict[str, Any]]) -> dict[str, int]:
    """{ISO date: month} for each date argument the query writes with its month's name ("May 1st 2024" for
    2024-05-01): the numbers 1 and 2024 are kept by the number check, the month only by its name."""
    named = _months_named(query)
    dates = {d for call in calls for v in _flatten(call.get("arguments") or {}) for d in _DATE.findall(str(v))}
    return {d: int(d[5:7]) for d in dates if d not in query and int(d[5:7]) in named}


# The paraphrasing prompt's own instructions, as runs of four request tokens: a reply that repeats one (and the
# query does not have it) echoes the prompt instead of rewriting the request.
_ECHO_RUN = 4


def _token_runs(text: str) -> set[tuple[str, ...]]:
    tokens = same_request_key(text).split()
    return {tuple(tokens[i : i + _ECHO_RUN]) for i in range(len(tokens) - _ECHO_RUN + 1)}


_INSTRUCTION_RUNS = _token_runs(PARAPHRASE_PROMPT.replace("{query}", ""))


def _states(text: str, answer: str) -> bool:
    """Whether `text` holds `answer` as whole request tokens (case, spacing and punctuation aside)."""
    key = same_request_key(answer)
    return bool(key) and f" {key} " in f" {same_request_key(text)} "


def paraphrase_problem(
    paraphrase: str,
    original: str,
    calls: list[dict[str, Any]],
    others: list[str],
    threshold: float,
    *,
    answers: list[str] | tuple[str, ...] = (),
) -> str | None:
    """Why a paraphrase is rejected, or None.

    `answers`: what answers the original (its final answer, the last tool result): a paraphrase stating one that the
    query does not is an answer, not a request ("2024-05-01 is a Wednesday" for "Which day was 2024-05-01?")."""
    if not paraphrase.strip():
        return "empty"
    if same_request_key(paraphrase) == same_request_key(original):
        return "same as the original"
    if _token_runs(paraphrase) & (_INSTRUCTION_RUNS - _token_runs(original)):
        return "repeats the paraphrasing instructions"
    if any(_states(paraphrase, a) and not _states(original, a) for a in answers if a.strip()):
        return "states the answer instead of asking"
    numbers, phrases = required_atoms(original, calls)
    paraphrase_numbers = _numbers(paraphrase)
    if numbers - paraphrase_numbers:
        return "loses a number the call needs"
    # The paraphrase is paired with the original's call: a number that is neither in the original nor in the
    # call's arguments ("... * 2", "then add 1") asks for something that call does not do.
    if paraphrase_numbers - _numbers(original) - _call_numbers(calls):
        return "adds a number the call does not use"
    lower = paraphrase.lower()
    if any(not re.search(rf"(?<!\w){re.escape(p)}(?!\w)", lower) for p in phrases):
        return "loses a date, unit or name the call needs"
    if _number_phrase_pairs(original, numbers, phrases) - _number_phrase_pairs(paraphrase, numbers, phrases):
        return "puts a unit or name the call needs next to another number"
    if any(value not in paraphrase for value in quoted_values(original, calls)):
        return "loses a quoted value the call needs"
    named = _months_named(paraphrase)
    if any(month not in named and date not in paraphrase for date, month in required_months(original, calls).items()):
        return "loses the month of a date the call needs"
    if near_duplicate(paraphrase, others, threshold):
        return "near-duplicate of another paraphrase"
    return None


def clean_paraphrase(text: str) -> str:
    text = text.strip()
    text = re.sub(r"^(rewritten request|request|paraphrase)\s*:\s*", "", text, flags=re.IGNORECASE)
    text = text.strip().strip('"“”').strip()
    return text.split("\n\n")[0].strip()


@dataclass(frozen=True)
class ParaphraseReply:
    """One sampled paraphrase; `cut`: the reply ran out of `paraphrase_max_tokens` (finish reason "length")."""

    text: str
    cut: bool = False

    def to_cache(self) -> Any:
        return {"text": self.text, "cut": True} if self.cut else self.text  # a plain string: a reply that finished

    @staticmethod
    def from_cache(value: Any) -> ParaphraseReply:
        return (
            ParaphraseReply(value["text"], bool(value.get("cut")))
            if isinstance(value, dict)
            else ParaphraseReply(value)
        )

    def cut_off(self) -> bool:
        """Whether the paraphrase kept (the reply's first paragraph, `clean_paraphrase`) is the part cut short."""
        return self.cut and "\n\n" not in self.text.strip()


PARAPHRASE_JUDGE_PROMPT = """You check a rewritten user request against the original one.

Original request:
{original}

Rewritten request:
{paraphrase}

Question: Does the rewritten request ask for exactly the same thing as the original (the same task, numbers, dates,
names and values), written as a request from a user (not an answer, not instructions)?

Reply with exactly one line:
Same: Yes|No - reason"""
_SAME_LINE = re.compile(rf"^\W*same\W*\s*(yes|no)\b{_NOT_AN_ALTERNATIVE}\W*(.*)$", re.IGNORECASE)
_BARE_VERDICT = re.compile(rf"^\W*(yes|no)\b{_NOT_AN_ALTERNATIVE}\W*(.*)$", re.IGNORECASE)


def paraphrase_judge_prompt(original: str, paraphrase: str) -> str:
    return PARAPHRASE_JUDGE_PROMPT.format(original=original, paraphrase=paraphrase)


def parse_paraphrase_judgment(text: str) -> dict[str, Any]:
    """{"same": {"verdict", "reason"}, "raw", "error", "keep"}, read as `parse_judgment` reads a trial's: the
    `Same: Yes|No - reason` line, or failing that the first line that starts with Yes or No. A reply without a
    verdict (an echo of `Same: Yes|No`) is not kept; its `error` says so."""
    lines = [line.strip() for line in text.splitlines()]
    match = next((m for m in map(_SAME_LINE.match, lines) if m), None) or next(
        (m for m in map(_BARE_VERDICT.match, lines) if m), None
    )
    if match is None:
        return {"raw": text, "error": "no verdict for same", "keep": False}
    same = {"verdict": match.group(1).lower() == "yes", "reason": match.group(2).strip(" -:")}
    return {"same": same, "raw": text, "error": None, "keep": same["verdict"]}


def candidate_answers(candidate: Candidate) -> list[str]:
    """What answers a candidate's query: its final answer and the last tool result (`paraphrase_problem`)."""
    results = [str(m.get("content") or "") for m in candidate.messages if m.get("role") == "tool"]
    return [candidate.final_answer, *results[-1:]]


def paraphrase_plan(counts: dict[str, int], target: int, max_per_original: int) -> dict[str, int]:
    """Paraphrases to ask per original: spread (target - originals) over a tool's originals, capped."""
    plan: dict[str, int] = {}
    for tool, n in counts.items():
        missing = max(0, target - n)
        plan[tool] = 0 if n == 0 or target <= 0 else min(max_per_original, -(-missing // n))
    return plan


# ---------------------------------------------------------------------------------------------- run


@dataclass
class DistillOptions:
    trials: Path
    out: Path
    target_per_tool: int = 0
    max_paraphrases: int = 3
    dedupe_threshold: float = 0.9
    validation_fraction: float = 0.1
    require_solved: bool = False
    seed: int = 0
    concurrency: int = 16
    judge_model: str | None = None
    paraphrase_model: str | None = None
    explorer_model: str | None = None  # round trip and chit-chat (run_distill_stage: else the run's explorer or judge)
    temperature: float = 0.8
    max_tokens: int = 160  # per judge reply (a trial's three verdicts, a paraphrase's one)
    paraphrase_max_tokens: int = 128  # per paraphrase: one request; a reply cut short is rejected, and counted
    dtype: str | None = "auto"  # how a local judge/paraphraser loads: the run's [model] dtype and device
    device: str | None = None
    require_grounded: bool = True  # every call value stated in (or derivable from) the request
    require_answer: bool = False  # the final answer states a short tool result
    round_trip: bool = True  # with a judge: its model must write the call again from the request and tools alone
    round_trip_max_tokens: int = 256  # per round-trip reply (one call)
    irrelevance_fraction: float = 0.2  # no-tool lines built from kept requests, per tool-call line
    chitchat_fraction: float = 0.1  # chit-chat lines the judge model imagines and answers, per tool-call line
    out_of_scope_fraction: float = 0.1  # refused requests for a service no offered tool gives, per tool-call line
    chitchat_max_tokens: int = 96  # per imagined chit-chat request and per answer (an answer cut there is dropped)
    explore_format: str = "hermes"  # the exploration prompts a request must not echo: the run's [explore] format
    explore_prompts: str | None = None  # and its [explore] prompts override folder


def check_options(opts: DistillOptions, *, paraphrasing: bool) -> None:
    """Refuse settings that cannot work before anything is written or any model is asked."""
    if opts.target_per_tool > 0 and not paraphrasing:
        raise DataError(
            f"target_per_tool={opts.target_per_tool} needs a paraphrasing model",
            hint="pass --paraphrase-model (any backend), or --target-per-tool 0 to skip paraphrasing",
        )
    if opts.max_paraphrases < 0 or not 0.0 < opts.dedupe_threshold <= 1.0:
        raise DataError(
            f"max_paraphrases={opts.max_paraphrases} must be >= 0 and "
            f"dedupe_threshold={opts.dedupe_threshold} must be in (0, 1]"
        )
    if not 0.0 <= opts.validation_fraction < 1.0:
        raise DataError(f"validation_fraction {opts.validation_fraction} must be in [0, 1)", hint="e.g. 0.1")
    for key in ("irrelevance_fraction", "chitchat_fraction", "out_of_scope_fraction"):
        value = getattr(opts, key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
            raise DataError(
                f"{key}={value!r} must be a number in [0, 1]", hint="a share of the tool-call lines, e.g. 0.2"
            )
    for key, hint in (
        ("max_tokens", "tokens per judge reply, e.g. 160"),
        ("paraphrase_max_tokens", "e.g. 128"),
        ("round_trip_max_tokens", "tokens per round-trip call, e.g. 256"),
        ("chitchat_max_tokens", "tokens per chit-chat request or answer, e.g. 96"),
    ):
        value = getattr(opts, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DataError(f"{key}={value!r} must be a whole number of tokens >= 1", hint=hint)


async def _generate(
    backend: Backend, prompt: str, *, n: int, temperature: float, max_tokens: int, seed: int
) -> list[Completion]:
    request = GenerationRequest(
        messages=[{"role": "user", "content": prompt}],
        params=SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens, seed=seed),
    )
    return await backend.generate(request)


async def _judge_replies(
    purpose: str, prompts: list[str], backend: Backend, cache: ReplyCache, opts: DistillOptions, advance: Any
) -> list[str]:
    """One greedy reply per prompt from the judge (cached under `purpose`), at most `concurrency` in flight."""
    semaphore = asyncio.Semaphore(max(1, opts.concurrency))

    async def one(prompt: str) -> str:
        key = cache.key(purpose, getattr(backend, "name", ""), prompt, opts.max_tokens)
        text = cache.get(key)
        if text is None:
            async with semaphore:
                completions = await _generate(
                    backend, prompt, n=1, temperature=0.0, max_tokens=opts.max_tokens, seed=opts.seed
                )
            text = completions[0].text
            cache.put(key, text)
        if advance is not None:
            advance()
        return text

    return list(await asyncio.gather(*(one(p) for p in prompts)))


async def run_judge(
    candidates: list[Candidate], backend: Backend, cache: ReplyCache, opts: DistillOptions, progress: Any = None
) -> list[dict[str, Any]]:
    """One judgment per candidate (cached); order follows `candidates`."""
    advance = progress("judging", len(candidates)) if progress is not None else None
    prompts = [judge_prompt(c) for c in candidates]
    return [parse_judgment(text) for text in await _judge_replies("judge", prompts, backend, cache, opts, advance)]


async def run_paraphrase_judge(
    pairs: list[tuple[str, str]], backend: Backend, cache: ReplyCache, opts: DistillOptions, progress: Any = None
) -> list[dict[str, Any]]:
    """One verdict per (original, paraphrase) pair from the trials' judge, asked as it asks about trials (greedy,
    `max_tokens`, cached); order follows `pairs`."""
    advance = progress("judging paraphrases", len(pairs)) if progress is not None and pairs else None
    prompts = [paraphrase_judge_prompt(original, paraphrase) for original, paraphrase in pairs]
    replies = await _judge_replies("paraphrase-judge", prompts, backend, cache, opts, advance)
    return [parse_paraphrase_judgment(text) for text in replies]


async def run_paraphrase(
    candidates: list[Candidate],
    plan: dict[str, int],
    backend: Backend,
    cache: ReplyCache,
    opts: DistillOptions,
    progress: Any = None,
) -> dict[str, list[ParaphraseReply]]:
    """Raw paraphrases per candidate id (cached); each candidate asks for its tool's planned count."""
    semaphore = asyncio.Semaphore(max(1, opts.concurrency))
    asking = sum(1 for c in candidates if plan.get(c.tool, 0) > 0)
    advance = progress("paraphrasing", asking) if progress is not None and asking else None

    async def one(candidate: Candidate) -> tuple[str, list[ParaphraseReply]]:
        n = plan.get(candidate.tool, 0)
        if n <= 0:
            return candidate.id, []
        prompt = PARAPHRASE_PROMPT.format(query=candidate.query)
        # ask for a few extra: some will be rejected
        n_ask = n + 2
        seed = int(hashlib.sha256(f"{opts.seed}:{candidate.id}".encode()).hexdigest()[:8], 16)
        # The key leaves out how many samples were asked for: the plan changes with the number of originals (more
        # trials, another target), and samples already paid for are reused; only the missing ones are asked for,
        # with a seed moved on by the count already held.
        max_tokens = opts.paraphrase_max_tokens
        key = cache.key("paraphrase", getattr(backend, "name", ""), prompt, opts.temperature, max_tokens, seed)
        replies = [ParaphraseReply.from_cache(value) for value in cache.get(key) or []]
        if len(replies) < n_ask:
            async with semaphore:
                completions = await _generate(
                    backend,
                    prompt,
                    n=n_ask - len(replies),
                    temperature=opts.temperature,
                    max_tokens=max_tokens,
                    seed=seed + len(replies),
                )
            replies += [ParaphraseReply(c.text, c.finish_reason == "length") for c in completions]
            cache.put(key, [reply.to_cache() for reply in replies])
        if advance is not None:
            advance()
        return candidate.id, replies[:n_ask]

    return dict(await asyncio.gather(*(one(c) for c in candidates)))


Verdicts = dict[tuple[str, str], dict[str, Any]]  # (original query, paraphrase) -> the judge's verdict


def select_paraphrases(
    originals: list[Candidate],
    raw: dict[str, list[ParaphraseReply]],
    plan: dict[str, int],
    opts: DistillOptions,
    verdicts: Verdicts | None = None,
) -> tuple[list[tuple[Candidate, str, int]], dict[str, Counter[str]], list[tuple[str, str]]]:
    """(accepted (original, text, index), rejection reasons per tool, pairs awaiting the judge).

    The originals are taken in order, each until it has its share: a paraphrase is checked (`paraphrase_problem`;
    cut short by `paraphrase_max_tokens`), then, with a judge (`verdicts` not None), must be judged the same request.
    A pair not judged yet is taken as accepted and returned as awaiting: judge those and select again, until none
    awaits. The result is what asking the judge about each paraphrase in turn would give, with the judge's replies
    asked for concurrently; it is asked only about paraphrases that passed the checks when their turn came, not
    about the samples past an original's share (a few more are asked for than planned, as some fail).
    """
    accepted: list[tuple[Candidate, str, int]] = []
    rejected: dict[str, Counter[str]] = defaultdict(Counter)
    awaiting: list[tuple[str, str]] = []
    originals_per_tool = Counter(c.tool for c in originals)
    made: Counter[str] = Counter()
    # every query of a tool so far, originals and accepted paraphrases of any original: two originals whose
    # paraphrases coincide must not yield the same line twice (possibly one in each split)
    tool_queries: dict[str, list[str]] = defaultdict(list)
    for candidate in originals:
        tool_queries[candidate.tool].append(candidate.query)
    for candidate in originals:
        need = opts.target_per_tool - originals_per_tool[candidate.tool] - made[candidate.tool]
        share = min(opts.max_paraphrases, plan.get(candidate.tool, 0), max(0, need))
        others = tool_queries[candidate.tool]
        kept: list[str] = []
        for reply in raw.get(candidate.id, []):
            if len(kept) >= share:
                break
            text = clean_paraphrase(reply.text)
            if reply.cut_off():
                problem: str | None = "cut off at paraphrase_max_tokens"
            else:
                problem = paraphrase_problem(
                    text, candidate.query, candidate.calls, others, opts.dedupe_threshold,
                    answers=candidate_answers(candidate),
                )  # fmt: skip
            if problem is None and verdicts is not None:
                verdict = verdicts.get((candidate.query, text))
                if verdict is None:
                    awaiting.append((candidate.query, text))
                elif verdict["error"] is not None:
                    problem = "the judge gave no Yes/No"
                elif not verdict["keep"]:
                    problem = "judged not the same request"
            if problem is not None:
                rejected[candidate.tool][problem] += 1
                continue
            kept.append(text)
            others.append(text)
        accepted += [(candidate, text, index) for index, text in enumerate(kept, start=1)]
        made[candidate.tool] += len(kept)
    return accepted, rejected, list(dict.fromkeys(awaiting))


def split_by_original(
    originals: list[Candidate], fraction: float, seed: int, paraphrases: dict[str, list[str]] | None = None
) -> set[str]:
    """Original ids going to validation, sampled per tool (seeded), so every tool is split the same way.

    An original moves with its paraphrases, and originals whose queries or paraphrases share a `same_request_key`
    (the same request explored for two tools) move together: no query is ever in both splits.
    """
    if not 0.0 <= fraction < 1.0:
        raise DataError(f"validation_fraction {fraction} must be in [0, 1)", hint="e.g. 0.1")
    paraphrases = paraphrases or {}
    parent = {c.id: c.id for c in originals}

    def root(key: str) -> str:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    owner: dict[str, str] = {}
    for c in sorted(originals, key=lambda c: c.id):
        for text in [c.query, *paraphrases.get(c.id, [])]:
            first = owner.setdefault(same_request_key(text), c.id)
            a, b = root(first), root(c.id)
            parent[max(a, b)] = min(a, b)  # a group is named by its smallest id
    tool_of = {c.id: c.tool for c in originals}
    members: dict[str, list[str]] = defaultdict(list)
    for c in originals:
        members[root(c.id)].append(c.id)
    by_tool: dict[str, list[str]] = defaultdict(list)
    for group in members:
        by_tool[tool_of[group]].append(group)
    chosen: set[str] = set()
    for tool, groups in sorted(by_tool.items()):
        groups = sorted(groups)
        random.Random(f"{seed}:{tool}").shuffle(groups)
        for group in groups[: round(len(groups) * fraction)]:
            chosen.update(members[group])
    return chosen


def distill(
    trials: list[dict[str, Any]],
    opts: DistillOptions,
    *,
    judge: Backend | None = None,
    paraphraser: Backend | None = None,
    explorer: Backend | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Synchronous entry point: `adistill` in a fresh event loop."""
    return asyncio.run(
        adistill(trials, opts, judge=judge, paraphraser=paraphraser, explorer=explorer, progress=progress)
    )


async def run_distill(
    trials: list[dict[str, Any]], opts: DistillOptions, *, progress: Any = None, ready: Any = None
) -> dict[str, Any]:
    """Make the judge/paraphraser backends named in `opts` (one backend when both name the same model), run,
    and close them, all in one event loop (a local backend's batching worker lives on that loop).

    An endpoint is reached (and its model looked for) before `ready()` is called and any work starts: an unreachable
    one, or a model that cannot load, stops distill before it writes anything."""
    from toolschool.engine.backends import make_backend

    backends: dict[str, Backend] = {}
    try:
        for spec in (opts.judge_model, opts.paraphrase_model, opts.explorer_model):
            if spec and spec not in backends:
                backends[spec] = make_backend(spec, concurrency=opts.concurrency, dtype=opts.dtype, device=opts.device)
                check = getattr(backends[spec], "check", None)
                if check is not None:
                    await check()
        if ready is not None:
            ready()
        return await adistill(
            trials,
            opts,
            judge=backends.get(opts.judge_model or ""),
            paraphraser=backends.get(opts.paraphrase_model or ""),
            explorer=backends.get(opts.explorer_model or ""),
            progress=progress,
        )
    finally:
        for backend in backends.values():
            await backend.aclose()


def _exploration_prompt_texts(opts: DistillOptions) -> list[EchoSource]:
    """The exploration prompts' sentences and worked examples; the packaged ones when the run's override folder is
    gone (it is read for this check only)."""
    from toolschool.errors import ConfigError

    try:
        return exploration_echo_sources(opts.explore_format, opts.explore_prompts)
    except ConfigError:
        return exploration_echo_sources(opts.explore_format, None)


def _tool_lists(originals: list[Candidate]) -> list[list[dict[str, Any]]]:
    """The distinct offered-tool lists of the kept originals (by id): what a chit-chat line offers, in turn."""
    lists: dict[str, list[dict[str, Any]]] = {}
    for candidate in sorted(originals, key=lambda c: c.id):
        lists.setdefault(json.dumps(candidate.tools, sort_keys=True), candidate.tools)
    return list(lists.values())


def _row_order(tool: str) -> tuple[bool, str]:
    return tool == NO_TOOL, tool


def filter_yield(
    counts: dict[str, Counter[str]], drops: dict[str, dict[str, Counter[str]]], off: dict[str, bool]
) -> list[dict[str, Any]]:
    """Per filter, in the order they run: how many trials entered it, how many it removed and why, how many it
    kept; `on` False for a filter this run skipped (no judge model, or turned off)."""
    tools = [t for t in counts if t != NO_TOOL]
    entered = sum(counts[t]["trials"] for t in tools)
    rows = []
    for name, step in FILTERS:
        kept = sum(counts[t][step] for t in tools)
        reasons: Counter[str] = Counter()
        for per_reason in drops[name].values():
            reasons.update(per_reason)
        rows.append(
            {
                "filter": name,
                "on": not off.get(name, False),
                "entered": entered,
                "removed": entered - kept,
                "kept": kept,
                "reasons": dict(reasons.most_common()),
            }
        )
        entered = kept
    return rows


async def adistill(
    trials: list[dict[str, Any]],
    opts: DistillOptions,
    *,
    judge: Backend | None = None,
    paraphraser: Backend | None = None,
    explorer: Backend | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Run every step over `trials`, write train/validation/summary/card into `opts.out`; return the summary.

    `explorer` writes the round-trip calls and the chit-chat lines (None: the judge does, when there is one).

    `progress(label, total)`, when given, is called as the judge and the paraphraser start and returns what to call
    as each of `total` candidates is done (as `toolschool eval` reports its items)."""
    check_options(opts, paraphrasing=paraphraser is not None)
    explorer = explorer if explorer is not None else judge
    opts.out.mkdir(parents=True, exist_ok=True)
    cache = ReplyCache(opts.out / "cache.jsonl")
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    drops: dict[str, dict[str, Counter[str]]] = {
        stage: defaultdict(Counter)
        for stage in (*(name for name, _step in FILTERS), "paraphrase", "irrelevance", "chitchat", "out_of_scope")
    }
    filtered: list[dict[str, Any]] = []  # what grounding, echo and the round trip removed, with the detail

    candidates: list[Candidate] = []
    seen_trials: set[str] = set()
    for index, trial in enumerate(trials, start=1):
        problem = trial_problem(trial)
        if problem is not None:
            where = trial.get("_where") if isinstance(trial, dict) else None
            if where is None:
                where = f"trial {index}"
                if isinstance(trial, dict):
                    where += f" ({trial.get('tool')}/e{trial.get('episode')}/s{trial.get('slot')})"
            raise DataError(f"{where}: {problem}", hint="fix or remove that trial; every other trial is kept")
        tool = str(trial.get("tool"))
        counts[tool]["trials"] += 1
        candidate, reason = trial_to_candidate(
            trial, require_solved=opts.require_solved, require_answer=opts.require_answer
        )
        if candidate is not None and candidate.id in seen_trials:
            candidate, reason = None, "duplicate trial line"
        if candidate is None:
            drops["rules"][tool][str(reason)] += 1
            continue
        seen_trials.add(candidate.id)
        counts[tool]["rules"] += 1
        candidates.append(candidate)

    def drop(candidate: Candidate, stage: str, reason: str, detail: Any = None) -> None:
        drops[stage][candidate.tool][reason] += 1
        filtered.append(
            {"id": candidate.id, "tool": candidate.tool, "query": candidate.query, "filter": stage, "reason": reason}
            | ({"detail": detail} if detail is not None else {})
        )

    grounded: list[Candidate] = []
    for candidate in candidates:
        ungrounded = grounding_problem(candidate.messages, candidate.tools) if opts.require_grounded else None
        if ungrounded is None:
            grounded.append(candidate)
            counts[candidate.tool]["grounded"] += 1
        else:
            drop(candidate, "grounding", ungrounded.reason, ungrounded.detail)

    prompt_texts = _exploration_prompt_texts(opts)
    unechoed: list[Candidate] = []
    for candidate in grounded:
        copied = echo_problem(candidate.query, prompt_texts + tool_description_sources(candidate.tools))
        if copied is None:
            unechoed.append(candidate)
            counts[candidate.tool]["no_echo"] += 1
        else:
            drop(candidate, "echo", copied.label, copied.text)

    judged = unechoed
    no_verdict = 0  # judge replies without a readable Yes/No for every criterion (not kept)
    if judge is None:  # an earlier judged run's verdicts are not this data's: the card says "rules only"
        (opts.out / "judgments.jsonl").unlink(missing_ok=True)
    else:
        judgments = await run_judge(unechoed, judge, cache, opts, progress)
        write_jsonl(
            opts.out / "judgments.jsonl",
            ({"id": c.id, "tool": c.tool, "query": c.query, **j} for c, j in zip(unechoed, judgments, strict=True)),
        )
        judged = []
        for candidate, judgment in zip(unechoed, judgments, strict=True):
            candidate.meta["judge"] = {k: judgment[k] for k in JUDGE_CRITERIA if k in judgment}
            no_verdict += judgment["error"] is not None
            if judgment["keep"]:
                judged.append(candidate)
            else:
                reason = judgment["error"] or "judged No on " + ", ".join(
                    k for k in JUDGE_CRITERIA if not judgment[k]["verdict"]
                )
                drops["judge"][candidate.tool][reason] += 1
    for candidate in judged:
        counts[candidate.tool]["judge"] += 1

    reproduced = judged
    if explorer is not None and opts.round_trip:
        advance = progress("round trip", len(judged)) if progress is not None and judged else None
        trips = await run_round_trips(
            [(c.query, c.messages, c.tools) for c in judged],
            explorer,
            cache,
            max_tokens=opts.round_trip_max_tokens,
            seed=opts.seed,
            concurrency=opts.concurrency,
            advance=advance,
        )
        reproduced = []
        for candidate, trip in zip(judged, trips, strict=True):
            if trip.problem is None:
                reproduced.append(candidate)
            else:
                drop(candidate, "round_trip", trip.problem, trip.reply)
    for candidate in reproduced:
        counts[candidate.tool]["round_trip"] += 1
    write_jsonl(opts.out / "filtered.jsonl", filtered)

    originals, removed = dedupe(reproduced, opts.dedupe_threshold)
    for candidate in originals:
        counts[candidate.tool]["dedupe"] += 1
    for candidate in removed:
        drops["dedupe"][candidate.tool]["near-duplicate of an earlier query of the tool"] += 1

    paraphrases: list[tuple[Candidate, str, int]] = []
    verdicts: Verdicts = {}
    if paraphraser is not None and opts.target_per_tool > 0 and opts.max_paraphrases > 0:
        plan = paraphrase_plan(Counter(c.tool for c in originals), opts.target_per_tool, opts.max_paraphrases)
        raw = await run_paraphrase(originals, plan, paraphraser, cache, opts, progress)
        while True:  # with a judge: judge the paraphrases the selection would keep, until it keeps only judged ones
            paraphrases, rejected, awaiting = select_paraphrases(
                originals, raw, plan, opts, verdicts if judge is not None else None
            )
            if judge is None or not awaiting:
                break
            verdicts.update(
                zip(awaiting, await run_paraphrase_judge(awaiting, judge, cache, opts, progress), strict=True)
            )
        for tool, reasons in rejected.items():
            drops["paraphrase"][tool].update(reasons)
        for candidate, _text, _index in paraphrases:
            counts[candidate.tool]["paraphrases"] += 1
    if verdicts:  # every paraphrase verdict, kept or not, beside the trials' in judgments.jsonl
        ids: dict[str, list[str]] = defaultdict(list)  # one query may be an original of two tools
        for candidate in originals:
            ids[candidate.query].append(candidate.id)
        write_jsonl(
            opts.out / "paraphrase_judgments.jsonl",
            ({"original_ids": ids[q], "query": q, "paraphrase": t, **v} for (q, t), v in verdicts.items()),
        )
    else:  # an earlier run's verdicts are not this data's
        (opts.out / "paraphrase_judgments.jsonl").unlink(missing_ok=True)

    texts: dict[str, list[str]] = defaultdict(list)
    for candidate, text, _index in paraphrases:
        texts[candidate.id].append(text)
    validation_ids = split_by_original(originals, opts.validation_fraction, opts.seed, texts)
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "validation": []}
    for candidate in originals:
        split = "validation" if candidate.id in validation_ids else "train"
        splits[split].append(candidate.example(split=split))
    for candidate, text, index in paraphrases:
        split = "validation" if candidate.id in validation_ids else "train"
        splits[split].append(
            candidate.example(
                text, id=f"{candidate.id}/p{index}", paraphrase=True, original_query=candidate.query, split=split
            )
        )
    tool_lines = splits["train"] + splits["validation"]
    irrelevant, skipped, irrelevance_per_tool = build_irrelevance(tool_lines, opts.irrelevance_fraction, opts.seed)
    if skipped:
        drops["irrelevance"][NO_TOOL].update(skipped)
    for line in irrelevant:
        splits[line["meta"]["split"]].append(line)
    chitchat_wanted = lines_wanted(opts.chitchat_fraction, len(tool_lines)) if explorer is not None else 0
    known_requests = {same_request_key(line["messages"][0]["content"]) for line in tool_lines}
    chitchat, chitchat_dropped = await build_chitchat(
        explorer,  # type: ignore[arg-type]  # None only when nothing is wanted
        cache,
        ChitchatOptions(chitchat_wanted, opts.temperature, opts.chitchat_max_tokens, opts.seed, opts.concurrency),
        _tool_lists(originals),
        known_requests,
        progress,
    )
    if chitchat_dropped:
        drops["chitchat"][NO_TOOL].update(chitchat_dropped)
    known_requests |= {same_request_key(line["messages"][0]["content"]) for line in chitchat}
    out_of_scope_wanted = lines_wanted(opts.out_of_scope_fraction, len(tool_lines))
    out_of_scope, out_of_scope_dropped = build_out_of_scope(
        out_of_scope_wanted, _tool_lists(originals), known_requests, opts.seed
    )
    if out_of_scope_dropped:
        drops["out_of_scope"][NO_TOOL].update(out_of_scope_dropped)
    if irrelevant or chitchat or out_of_scope:  # a row of its own, shown only when there are such lines
        counts[NO_TOOL].update(irrelevance=len(irrelevant), chitchat=len(chitchat), out_of_scope=len(out_of_scope))
    for kind, imagined in (("chitchat", chitchat), ("out_of_scope", out_of_scope)):
        held_out = round(len(imagined) * opts.validation_fraction)
        for number, line in enumerate(random.Random(f"{opts.seed}:{kind}").sample(imagined, len(imagined))):
            split = "validation" if number < held_out else "train"
            splits[split].append({**line, "meta": {**line["meta"], "split": split}})
    for split, examples in splits.items():
        random.Random(f"{opts.seed}:{split}").shuffle(examples)
        for example in examples:
            row = example["meta"]["tool"] or NO_TOOL
            counts[row][split] += 1
            counts[row]["final"] += 1
        write_jsonl(opts.out / f"{split}.jsonl", examples)

    summary = {
        "options": {
            "trials": str(opts.trials),
            "target_per_tool": opts.target_per_tool,
            "max_paraphrases": opts.max_paraphrases,
            "dedupe_threshold": opts.dedupe_threshold,
            "validation_fraction": opts.validation_fraction,
            "require_solved": opts.require_solved,
            "seed": opts.seed,
            "judge_model": opts.judge_model if judge is not None else None,
            "paraphrase_model": opts.paraphrase_model if paraphraser is not None else None,
            "explorer_model": (opts.explorer_model or opts.judge_model) if explorer is not None else None,
            "max_tokens": opts.max_tokens,
            "paraphrase_max_tokens": opts.paraphrase_max_tokens,
            "require_grounded": opts.require_grounded,
            "require_answer": opts.require_answer,
            "round_trip": opts.round_trip and explorer is not None,
            "round_trip_max_tokens": opts.round_trip_max_tokens,
            "irrelevance_fraction": opts.irrelevance_fraction,
            "chitchat_fraction": opts.chitchat_fraction,
            "out_of_scope_fraction": opts.out_of_scope_fraction,
            "chitchat_max_tokens": opts.chitchat_max_tokens,
        },
        "per_tool": {tool: {step: counts[tool][step] for step in STEPS} for tool in sorted(counts, key=_row_order)},
        "total": {step: sum(counts[t][step] for t in counts) for step in STEPS},
        "dropped": {stage: {t: dict(c.most_common()) for t, c in sorted(per.items())} for stage, per in drops.items()},
        "yield": filter_yield(
            counts,
            drops,
            off={
                "grounding": not opts.require_grounded,
                "judge": judge is None,
                "round_trip": explorer is None or not opts.round_trip,
            },
        ),
        "no_tool": {
            "irrelevance": len(irrelevant),
            "irrelevance_per_tool": irrelevance_per_tool,
            "chitchat": len(chitchat),
            "chitchat_wanted": chitchat_wanted,
            "out_of_scope": len(out_of_scope),
            "out_of_scope_wanted": out_of_scope_wanted,
            "lines": len(irrelevant) + len(chitchat) + len(out_of_scope),
            "share": round(
                (len(irrelevant) + len(chitchat) + len(out_of_scope)) / max(1, sum(len(e) for e in splits.values())), 4
            ),
        },
        "judge_no_verdict": no_verdict,
        "files": {"train": str(opts.out / "train.jsonl"), "validation": str(opts.out / "validation.jsonl")},
    }
    (opts.out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (opts.out / "README.md").write_text(distill_card(summary), encoding="utf-8")
    return summary


# What to do when a filter kept nothing: (the filter's name in the yield, the hint).
_EMPTY_HINTS = {
    "grounding": "explore more (a request must state every value its call uses), or set [distill] require_grounded = "
    "false",
    "echo": "explore more: the explorer copied the exploration prompts (try another explorer model or prompts)",
    "round_trip": "point --judge-model ([distill] judge_model) at a stronger model, or set [distill] round_trip = "
    "false",
}


def nothing_to_train(summary: dict[str, Any]) -> tuple[str, str] | None:
    """(why, what to do) when the distilled train split has no tool-call line: the step that kept nothing, not a
    guess (no-tool lines alone teach nothing about the tools)."""
    total = summary["total"]
    no_tool_train = summary["per_tool"].get(NO_TOOL, {}).get("train", 0)
    if total["train"] - no_tool_train:
        return None
    first = "distillation kept no training example: "
    if not total["trials"]:
        return first + "the trial log holds no trial", "run `toolschool explore` (more episodes) first"
    if not total["rules"]:
        why = "no exploration trial ended with a final answer after a call that executed without error"
        return first + why, "explore more (more episodes), or point [pipeline] explorer at a stronger model"
    for stage in summary.get("yield", []):
        if stage["filter"] in _EMPTY_HINTS and stage["entered"] and not stage["kept"]:
            reasons = "; ".join(f"{r}: {n}" for r, n in list(stage["reasons"].items())[:3])
            why = (
                f"the {stage['filter'].replace('_', ' ')} filter kept none of the {stage['entered']} trials ({reasons})"
            )
            return first + why, _EMPTY_HINTS[stage["filter"]]
        if stage["filter"] == "judge" and stage["entered"] and not stage["kept"]:
            unread = summary.get("judge_no_verdict", 0)
            why = f"the judge kept none of the {stage['entered']} trials that passed the rules"
            if unread:
                why += f" ({unread} of its replies gave no Yes/No for every criterion: see `raw` in judgments.jsonl)"
            return (
                first + why,
                "point --judge-model ([distill] judge_model) at a stronger model, or distill without one (the round "
                "trip still checks each trial with the explorer model)",
            )
    tool_lines = total["final"] - summary["per_tool"].get(NO_TOOL, {}).get("final", 0)
    why = f"all {tool_lines} kept examples went to the validation split"
    return first + why, "lower [distill] validation_fraction, or explore more"


def yield_rows(summary: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(filter, entered, removed, kept, reasons) per filter, as the card and the console show the yield."""
    rows = []
    for stage in summary.get("yield", []):
        reasons = "; ".join(f"{r}: {n}" for r, n in stage["reasons"].items()) if stage["on"] else "off"
        removed = str(stage["removed"]) if stage["on"] else "-"
        rows.append((stage["filter"], str(stage["entered"]), removed, str(stage["kept"]), reasons))
    return rows


def distill_card(summary: dict[str, Any]) -> str:
    """The markdown dataset card: where the data came from and what each step kept, per tool."""
    o = summary["options"]
    no_tool = summary.get("no_tool", {})
    lines = [
        "# Distilled tool-use dataset",
        "",
        f"Built by `toolschool distill` from `{o['trials']}` (exploration trials). One conversation per JSON line "
        '(`{"messages", "tools", "meta"}`): the query, the calls that executed without error with their results, '
        "the final answer.",
        "",
        f"- judge: {o['judge_model'] or 'none (rules only)'}; paraphraser: {o['paraphrase_model'] or 'none'}",
        f"- target per tool {o['target_per_tool']}, at most {o['max_paraphrases']} paraphrases per original, "
        f"dedupe Jaccard >= {o['dedupe_threshold']}, validation fraction {o['validation_fraction']} (by original "
        f"query), seed {o['seed']}, require self-reported success: {o['require_solved']}",
        f"- grounding required: {o.get('require_grounded', False)}; round trip: "
        f"{'on (' + str(o.get('explorer_model')) + ')' if o.get('round_trip') else 'off'}; no-tool lines: "
        f"irrelevance fraction "
        f"{o.get('irrelevance_fraction', 0)}, chit-chat fraction {o.get('chitchat_fraction', 0)}, out-of-scope "
        f"fraction {o.get('out_of_scope_fraction', 0)} (of the tool-call lines)",
        "",
        "## Counts per tool at each step",
        "",
        "| tool | " + " | ".join(STEPS) + " |",
        "| --- | " + " | ".join("---:" for _ in STEPS) + " |",
    ]
    for tool, row in summary["per_tool"].items():
        lines.append(f"| {tool} | " + " | ".join(str(row[s]) for s in STEPS) + " |")
    lines.append("| **total** | " + " | ".join(str(summary["total"][s]) for s in STEPS) + " |")
    if summary.get("yield"):
        lines += [
            "",
            "## Yield per filter",
            "",
            "Trials through each filter in turn (a tool's trials are counted before it is deduplicated):",
            "",
            "| filter | entered | removed | kept | why removed |",
            "| --- | ---: | ---: | ---: | --- |",
        ]
        lines += [f"| {' | '.join(row)} |" for row in yield_rows(summary)]
    if no_tool:
        share = f"{100 * no_tool.get('share', 0):.0f} %"
        lines += [
            "",
            "## No-tool lines",
            "",
            f"{no_tool.get('lines', 0)} of {summary['total']['final']} lines ({share}) answer without a call:",
            f"- irrelevance: {no_tool.get('irrelevance', 0)} (a kept request, offered without the tools that fit it, "
            "answered that no offered tool fits); from "
            + (", ".join(f"{t} {n}" for t, n in no_tool.get("irrelevance_per_tool", {}).items()) or "no tool"),
            f"- chit-chat: {no_tool.get('chitchat', 0)} of {no_tool.get('chitchat_wanted', 0)} wanted (imagined "
            "and answered by the explorer model without tools)",
            f"- out of scope: {no_tool.get('out_of_scope', 0)} of {no_tool.get('out_of_scope_wanted', 0)} wanted "
            "(requests for a service no offered tool gives, from a fixed list, answered that none can)",
        ]
    lines += ["", "## Why items were dropped", ""]
    for stage, per_tool in summary["dropped"].items():
        totals: Counter[str] = Counter()
        for reasons in per_tool.values():
            totals.update(reasons)
        if totals:
            lines.append(f"- **{stage}**: " + "; ".join(f"{r}: {n}" for r, n in totals.most_common()))
    if not any(summary["dropped"].values()):
        lines.append("- nothing was dropped")
    if summary.get("judge_no_verdict"):
        lines += [
            "",
            f"{summary['judge_no_verdict']} of {summary['total']['no_echo']} judge replies gave no Yes/No for every "
            "criterion (the reply text is under `raw` in `judgments.jsonl`): they are not kept, as a No is not.",
        ]
    lines += [
        "",
        "Steps: rules (final answer after a call that executed without error, explored tool called, the explorer's "
        "reflection not No) → grounding (every call value stated in or derivable from the request) → echo (the "
        "request copies no exploration prompt sentence, worked example or tool description) → judge (three Yes/No "
        "criteria, reasons in `judgments.jsonl` and `meta.judge`) → round trip (the explorer model writes the same "
        "call from the request and the tools alone) → near-duplicate removal → paraphrasing (a paraphrase is rejected "
        "when it is empty or the original again, repeats the paraphrasing "
        "instructions, states the answer, drops or changes a number, date, unit, name or quoted value the call "
        "takes from the query, or is cut off at paraphrase_max_tokens; with a judge, also when the judge does not "
        "call it the same request: verdicts in `paraphrase_judgments.jsonl`) → split by original query → no-tool "
        "lines. What grounding, echo and the round trip removed is in `filtered.jsonl`, with the value or reply.",
        "",
    ]
    return "\n".join(lines)


def distill_explorer(config: Any) -> str | None:
    """The model of the round trip and chit-chat: `[distill] explorer_model`, else the run's `[pipeline] explorer`
    when one other than the student is named, else the judge; None when there is none (neither step runs)."""
    d, explorer = config.distill, config.pipeline.explorer
    return d.explorer_model or (explorer if explorer and explorer != config.model.name else None) or d.judge_model


def run_distill_stage(
    config: Any, out: str | Path | None = None, *, console: Any = None
) -> tuple[Path, dict[str, Any]]:
    """The `distill` stage on a run config: read the run's trial log, write the stage folder, return its summary.

    The output folder is locked while it runs: two distills into one folder at once would append the same replies
    to `cache.jsonl` and replace each other's train/validation files with a mix of two runs."""
    from toolschool.config import stage_dir, stage_path
    from toolschool.errors import ToolschoolError
    from toolschool.locking import folder_lock

    d = config.distill
    trials_path = Path(d.trials) if d.trials else config.run_dir() / "explore" / "trials.jsonl"
    records, note = read_trial_log(trials_path)
    out_dir = stage_path(config, "distill", out)
    opts = DistillOptions(
        trials=trials_path,
        out=out_dir,
        target_per_tool=d.target_per_tool,
        max_paraphrases=d.max_paraphrases,
        dedupe_threshold=d.dedupe_threshold,
        validation_fraction=d.validation_fraction,
        require_solved=d.require_solved,
        seed=config.run.seed,
        concurrency=d.concurrency,
        judge_model=d.judge_model,
        explorer_model=distill_explorer(config),
        paraphrase_model=d.paraphrase_model,
        temperature=d.temperature,
        max_tokens=d.max_tokens,
        paraphrase_max_tokens=d.paraphrase_max_tokens,
        dtype=config.model.dtype,
        device=config.model.device,
        require_grounded=d.require_grounded,
        require_answer=d.require_answer,
        round_trip=d.round_trip,
        round_trip_max_tokens=d.round_trip_max_tokens,
        irrelevance_fraction=d.irrelevance_fraction,
        chitchat_fraction=d.chitchat_fraction,
        out_of_scope_fraction=d.out_of_scope_fraction,
        chitchat_max_tokens=d.chitchat_max_tokens,
        explore_format=config.explore.format,
        explore_prompts=config.explore.prompts,
    )
    check_options(opts, paraphrasing=bool(opts.paraphrase_model))  # a refused distill writes nothing
    refusal = ToolschoolError(
        f"{out_dir} is being written by another running distill",
        hint="wait for it to finish (or stop it: a rerun resumes from its cache.jsonl), or distill into another --out",
    )
    # the config is saved once the judge and paraphraser loaded or answered: a refused distill writes nothing
    ready = lambda: stage_dir(config, "distill", out)  # noqa: E731
    with folder_lock(out_dir, refusal, name="distill output"):
        if console is None:
            return out_dir, asyncio.run(run_distill(records, opts, ready=ready))
        console.print(f"[dim]distill: {len(records)} trials from {trials_path} -> {out_dir}[/dim]")
        if note is not None:
            console.print(f"[yellow]{note}[/yellow]", highlight=False)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        # a judge or paraphraser on a CPU takes minutes: show which step runs and how far it is
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as bar:

            def progress(label: str, total: int) -> Any:
                task = bar.add_task(label, total=total)
                return lambda: bar.advance(task)

            summary = asyncio.run(run_distill(records, opts, progress=progress, ready=ready))
        print_yield(summary, console)
    return out_dir, summary


def print_yield(summary: dict[str, Any], console: Any) -> None:
    """The filters' yield on the console: where the trials went, filter by filter, and the no-tool lines."""
    from rich.table import Table

    table = Table(title="distill yield per filter", title_justify="left")
    for column in ("filter", "entered", "removed", "kept"):
        table.add_column(column, justify="left" if column == "filter" else "right")
    table.add_column("why removed", overflow="fold")
    for row in yield_rows(summary):
        table.add_row(*row)
    console.print(table)
    no_tool = summary["no_tool"]
    console.print(
        f"no-tool lines: {no_tool['irrelevance']} irrelevance + {no_tool['chitchat']} chit-chat "
        f"(of {no_tool['chitchat_wanted']} wanted) + {no_tool.get('out_of_scope', 0)} out of scope "
        f"(of {no_tool.get('out_of_scope_wanted', 0)}) = {no_tool['lines']} of {summary['total']['final']} lines "
        f"({100 * no_tool['share']:.0f} %)",
        highlight=False,
    )
