"""Step 7, paraphrase: more requests per tool, each checked to ask for the same call as its original (by rule, by
a round trip through the explorer, and, with a judge, judged so); every rejection counted with its reason."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from toolschool.data.cache import ReplyCache
from toolschool.data.dataset import same_request_key
from toolschool.data.distill.dedupe import near_duplicate
from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.rules import Candidate
from toolschool.data.distill.templates import PROMPTS_DIR, generate, render
from toolschool.data.filters import argument_values, grounding_problem, signed_span_problem
from toolschool.data.round_trip import RoundTrip
from toolschool.models.backend import Backend


@functools.cache
def paraphrase_styles(read_back: bool = False) -> tuple[str, ...]:
    """How each paraphrase is asked to be worded, in turn (`prompts/paraphrase_styles.json`); one that respells
    units or names only when the paraphrases are read back (`paraphrase_problem`'s `read_back`)."""
    styles = json.loads((PROMPTS_DIR / "paraphrase_styles.json").read_text(encoding="utf-8"))["styles"]
    return tuple(s["style"] for s in styles if read_back or not s.get("respells"))


def paraphrase_prompt(query: str, sample: int = 0, *, read_back: bool = False) -> str:
    """The paraphrasing prompt (`prompts/paraphrase.jinja`) for one request's `sample`-th paraphrase: the styles
    of `paraphrase_styles` in turn. Not read back, it asks to keep every unit and name as written too."""
    styles = paraphrase_styles(read_back)
    return render("paraphrase", query=query, style=styles[sample % len(styles)], read_back=read_back)


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
        for value in argument_values(call.get("arguments") or {}):
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
        for value in argument_values(call.get("arguments") or {}):
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
    strings = [v for call in calls for v in argument_values(call.get("arguments") or {}) if isinstance(v, str)]
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
    dates = {d for call in calls for v in argument_values(call.get("arguments") or {}) for d in _DATE.findall(str(v))}
    return {d: int(d[5:7]) for d in dates if d not in query and int(d[5:7]) in named}


# The paraphrasing prompt's own instructions, as runs of four request tokens: a reply that repeats one (and the
# query does not have it) echoes the prompt instead of rewriting the request.
_ECHO_RUN = 4


def _token_runs(text: str) -> set[tuple[str, ...]]:
    tokens = same_request_key(text).split()
    return {tuple(tokens[i : i + _ECHO_RUN]) for i in range(len(tokens) - _ECHO_RUN + 1)}


_INSTRUCTION_RUNS = set().union(
    *(
        _token_runs(paraphrase_prompt("", i, read_back=read_back))
        for read_back in (False, True)
        for i in range(len(paraphrase_styles(read_back)))
    )
)


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
    read_back: bool = False,
) -> str | None:
    """Why a paraphrase is rejected, or None.

    `answers`: what answers the original (its final answer, the last tool result): a paraphrase stating one that the
    query does not is an answer, not a request ("2024-05-01 is a Wednesday" for "Which day was 2024-05-01?").
    `read_back`: the paraphrase will be read back to the original's call (a round trip), which checks a unit or name
    by what it means: one not written as in the original (respelled, "kilometres" for "km", or left out) is then
    left to it, where alone it is rejected (a unit in words is what a student reading users' requests most needs
    to see). One written the same way is still checked here, with the number it goes with."""
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
    written = {p for p in phrases if re.search(rf"(?<!\w){re.escape(p)}(?!\w)", lower)}
    if written != phrases:
        if not read_back:
            return "loses a date, unit or name the call needs"
        phrases = written  # those written another way are the round trip's to check
    if _number_phrase_pairs(original, numbers, phrases) - _number_phrase_pairs(paraphrase, numbers, phrases):
        return "puts a unit or name the call needs next to another number"
    if any(value not in paraphrase for value in quoted_values(original, calls)):
        return "loses a quoted value the call needs"
    named = _months_named(paraphrase)
    if any(month not in named and date not in paraphrase for date, month in required_months(original, calls).items()):
        return "loses the month of a date the call needs"
    if signed_span_problem(paraphrase) is not None and signed_span_problem(original) is None:
        return "writes a span of time with a sign"
    if near_duplicate(paraphrase, others, threshold):
        return "near-duplicate of another paraphrase"
    return None


# What a small paraphraser writes ahead of the paraphrase: "Sure, here's another request to ...:", "To denote the
# exact same requirement, the rewritten request should be:", "Request follows the format:" (the 0.5B led 1 in 8 of
# a demo's paraphrases so)
_PREAMBLE = re.compile(
    r"^(?:(?:sure|certainly|of course|okay|ok|absolutely)\b[^:\n]{0,100}"
    r"|[^:\n]{0,100}\b(?:rewritten|paraphrased?|rephrased|reworded|another request|the request|the format)\b"
    r"[^:\n]{0,40})"
    r":(?:\s+|$)",
    re.IGNORECASE,
)
# The prompt's own "Request:" label after a sentence of the reply: the 0.5B wrote the instructions back in its own
# words, then the label and the paraphrase ("Make sure you keep the numbers and dates exactly as written. Request:
# Add 93 days to 2024-06-20, what date will you get?"), 7 of a demo's 66 date_add lines
_INNER_LABEL = re.compile(r"(?<=[.!?])\s+(?:rewritten request|request|paraphrase)\s*:\s*", re.IGNORECASE)


def clean_paraphrase(text: str) -> str:
    """The paraphrase a reply holds: its first paragraph, without a label ("Request:"), what comes before a label
    that follows a sentence (`_INNER_LABEL`), a preamble (`_PREAMBLE`) or quotes around it."""
    text = text.strip()
    text = _INNER_LABEL.split(text.split("\n\n")[0])[-1] if _INNER_LABEL.search(text) else text
    text = re.sub(r"^(rewritten request|request|paraphrase)\s*:\s*", "", text, flags=re.IGNORECASE)
    text = _PREAMBLE.sub("", text, count=1)
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


async def run_paraphrase(
    candidates: list[Candidate],
    plan: dict[str, int],
    backend: Backend,
    cache: ReplyCache,
    opts: DistillOptions,
    progress: Any = None,
    *,
    read_back: bool = False,
) -> dict[str, list[ParaphraseReply]]:
    """Raw paraphrases per candidate id (cached); each candidate asks for its tool's planned count, in the styles
    of `paraphrase_styles(read_back)` in turn."""
    semaphore = asyncio.Semaphore(max(1, opts.concurrency))
    asking = sum(1 for c in candidates if plan.get(c.tool, 0) > 0)
    advance = progress("paraphrasing", asking) if progress is not None and asking else None

    async def one(candidate: Candidate) -> tuple[str, list[ParaphraseReply]]:
        n = plan.get(candidate.tool, 0)
        if n <= 0:
            return candidate.id, []
        # ask for a few extra: some will be rejected
        n_ask = n + 2
        # sample i is asked in style i (in turn): one request per style, for the samples of that style
        styles = len(paraphrase_styles(read_back))
        per_style = [len(range(style, n_ask, styles)) for style in range(min(styles, n_ask))]
        by_style = await asyncio.gather(
            *(
                ask(candidate, paraphrase_prompt(candidate.query, style, read_back=read_back), count)
                for style, count in enumerate(per_style)
            )
        )
        if advance is not None:
            advance()
        return candidate.id, [by_style[i % styles][i // styles] for i in range(n_ask)]

    async def ask(candidate: Candidate, prompt: str, count: int) -> list[ParaphraseReply]:
        seed = int(hashlib.sha256(f"{opts.seed}:{candidate.id}".encode()).hexdigest()[:8], 16)
        # The key leaves out how many samples were asked for: the plan changes with the number of originals (more
        # trials, another target), and samples already paid for are reused; only the missing ones are asked for,
        # with a seed moved on by the count already held.
        max_tokens = opts.paraphrase_max_tokens
        key = cache.key("paraphrase", getattr(backend, "name", ""), prompt, opts.temperature, max_tokens, seed)
        replies = [ParaphraseReply.from_cache(value) for value in cache.get(key) or []]
        if len(replies) < count:
            async with semaphore:
                completions = await generate(
                    backend,
                    prompt,
                    n=count - len(replies),
                    temperature=opts.temperature,
                    max_tokens=max_tokens,
                    seed=seed + len(replies),
                )
            replies += [ParaphraseReply(c.text, c.finish_reason == "length") for c in completions]
            cache.put(key, [reply.to_cache() for reply in replies])
        return replies[:count]

    return dict(await asyncio.gather(*(one(c) for c in candidates)))


Verdicts = dict[tuple[str, str], dict[str, Any]]  # (original query, paraphrase) -> the judge's verdict
Trips = dict[tuple[str, str], RoundTrip]  # (original's id, paraphrase) -> its round trip


@dataclass
class Selection:
    """What `select_paraphrases` decided: `accepted` (original, text, index), `rejected` reasons per tool, and the
    pairs whose judge verdict (`awaiting`: (original query, text)) or round trip (`awaiting_trips`: (original,
    text)) is still to be asked for."""

    accepted: list[tuple[Candidate, str, int]]
    rejected: dict[str, Counter[str]]
    awaiting: list[tuple[str, str]]
    awaiting_trips: list[tuple[Candidate, str]]


def select_paraphrases(
    originals: list[Candidate],
    raw: dict[str, list[ParaphraseReply]],
    plan: dict[str, int],
    opts: DistillOptions,
    verdicts: Verdicts | None = None,
    trips: Trips | None = None,
) -> Selection:
    """The paraphrases kept, why the others were not, and the checks still to ask for (`Selection`).

    The originals are taken in order, each until it has its share: a paraphrase is checked (`paraphrase_problem`;
    cut short by `paraphrase_max_tokens`), then, with a round trip (`trips` not None), the explorer reading it must
    write the original's call, then, with a judge (`verdicts` not None), it must be judged the same request. A
    paraphrase whose round trip or verdict is not known yet is taken as accepted and returned as awaiting: ask for
    those and select again, until none awaits. The result is what asking about each paraphrase in turn would
    give, with the replies asked for concurrently; only paraphrases that passed the earlier checks when their turn
    came are asked about, not the samples past an original's share (a few more are asked for than planned, as
    some fail).
    """
    accepted: list[tuple[Candidate, str, int]] = []
    rejected: dict[str, Counter[str]] = defaultdict(Counter)
    awaiting: list[tuple[str, str]] = []
    awaiting_trips: list[tuple[Candidate, str]] = []
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
            pending = False  # its round trip is not known yet: the judge is asked once that has passed
            text = clean_paraphrase(reply.text)
            if reply.cut_off():
                problem: str | None = "cut off at paraphrase_max_tokens"
            else:
                problem = paraphrase_problem(
                    text, candidate.query, candidate.calls, others, opts.dedupe_threshold,
                    answers=candidate_answers(candidate), read_back=trips is not None,
                )  # fmt: skip
            if problem is None and opts.require_grounded:  # as its original was: "How fast is 230 km/h?" for m/s
                ungrounded = grounding_problem(candidate.example(text)["messages"], candidate.tools)
                problem = None if ungrounded is None else f"not grounded: {ungrounded.reason}"
            if problem is None and trips is not None:
                trip = trips.get((candidate.id, text))
                if trip is None:
                    awaiting_trips.append((candidate, text))
                    pending = True
                elif trip.problem is not None:
                    problem = f"round trip: {trip.problem}"
            if problem is None and verdicts is not None and not pending:
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
    unique_trips = list({(c.id, t): (c, t) for c, t in awaiting_trips}.values())
    return Selection(accepted, rejected, list(dict.fromkeys(awaiting)), unique_trips)
