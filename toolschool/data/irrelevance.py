"""No-tool examples: a student must also learn when not to call.

Two kinds, both answered in plain text with the tools still offered:

- **irrelevance** (no teacher, as Hammer builds them): a kept request with the tools that fit it taken out of the
  offered list. The tools that fit are the ones its conversation calls, the ones a kept trial of the same request
  (`same_request_key`) called, and any tool that runs code (a python tool can stand in for every other). When
  nothing is left to offer the line is not built. The reply is a fixed, natural template that says no offered tool
  fits and names what is missing (the tool's name and what its description says it does), picked by the seed.
- **chit-chat**: the explorer model imagines a message that needs no tool (one topic per request, from a fixed list,
  for variety) and answers it in a fresh context without tools. A request is dropped when it is empty, long, holds a
  digit (it may need a calculation), copies the prompt, or repeats another; a reply when it is empty, cut off at
  `chitchat_max_tokens`, holds a tool call, or repeats itself (a sentence or six words in a row twice). Requests and
  replies are cached like every distill reply.
- **out of scope**: the explorer model imagines a request for something an assistant can only do with a tool or
  service it is not given (live information, acting in the world or on the user's accounts and devices: one task
  per request from a fixed list), answered with a fixed sentence that no available tool can do it. Why: the
  irrelevance lines only teach "this request's own tool is missing"; a small student offered the whole toolbox and
  asked for something else entirely invents a tool for it (`weather`, `send_email`). Such a request is dropped, on
  top of the chit-chat rules (digits allowed: "a table for 4"), when it shares a word with an offered tool's name or
  description: a request a user's own tool might serve must not be taught as one to refuse.

Irrelevance lines go to the split of the request they come from; chit-chat and out-of-scope lines are split by the
validation fraction, so no request is in both splits.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolschool.chat.formats import DEFAULT_FORMAT, get_format
from toolschool.data.cache import ReplyCache
from toolschool.data.dataset import same_request_key
from toolschool.data.filters import EchoSource, echo_problem, template_sentences
from toolschool.models.backend import Backend, ContextLengthError, GenerationRequest, SamplingParams

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
CHITCHAT_REQUEST_FILE = PROMPTS_DIR / "chitchat_request.txt"
CHITCHAT_ANSWER_FILE = PROMPTS_DIR / "chitchat_answer.txt"
OUT_OF_SCOPE_REQUEST_FILE = PROMPTS_DIR / "out_of_scope_request.txt"

# The replies of an irrelevance line: {name} the missing tool, {what} what it does (its description's first clause).
REFUSALS = (
    "None of the available tools can do that. It needs a tool like {name}: {what}.",
    "I can't do that with the tools I have: none of them fits. What is missing is a tool like {name} ({what}).",
    "None of the offered tools fits this request. It would take {name}, a tool for this: {what}. "
    "If you can give me such a tool, I'll use it.",
    "Sorry, none of the available tools can help here: there is no {name} tool ({what}).",
)
CHITCHAT_TOPICS = (
    "a greeting",
    "thanks for some earlier help",
    "cooking a simple meal",
    "travel tips",
    "a book to read",
    "music",
    "a film to watch",
    "learning a new language",
    "sleeping better",
    "staying active",
    "gardening",
    "pets",
    "a short poem",
    "a light joke",
    "a moment in history",
    "how something in nature works",
    "writing a polite email",
    "career advice",
    "the meaning of a word",
    "friendship",
    "the meaning of an idiom",
    "motivation",
    "an animal fact",
    "staying focused at work",
)
# What a request of the out-of-scope kind asks the assistant to do (kinds of service, not requests to copy).
OUT_OF_SCOPE_TASKS = (
    "read today's news headlines",
    "look up a live sports score",
    "order food for delivery",
    "buy something online",
    "reserve a hotel room",
    "call a taxi",
    "text a friend",
    "post on social media",
    "turn on the lights at home",
    "change the thermostat setting",
    "put a meeting in the user's calendar",
    "show a photo from the user's phone",
    "give driving directions",
    "track a parcel",
    "pay a bill",
    "draw a picture",
    "record a voice memo",
    "check a bank balance",
    "find a nearby pharmacy",
    "look up a train timetable",
    "check the traffic on the way to work",
    "share a document with a coworker",
    "switch on the robot vacuum",
    "look up opening hours of a shop",
)
# The replies of an out-of-scope line (picked by the seed): no offered tool does it, say so and do not pretend.
OUT_OF_SCOPE_REPLIES = (
    "I can't do that: none of the tools I have here can.",
    "Sorry, none of the available tools can do this, so I can't help with it here.",
    "That needs a tool I don't have. None of the available tools can do it; if you give me one, I'll use it.",
    "None of my tools can do that, so I can't do it for you here.",
)
# Words of a request that say nothing about what it needs (not compared with the tools' words).
_COMMON_WORDS = frozenset(
    "all also and another any are but can could does for from get give had has have help how into its just need new "
    "not now off one only our out own please should some than that the their them then there these this too want "
    "was what when where which who will with would you your".split()
)
CHITCHAT_MAX_REQUEST_CHARS = 300
ASK_FACTOR = 2  # chit-chat requests asked for per line wanted (plus two): some are dropped


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function", tool) if isinstance(tool, dict) else {}


def tool_name(tool: dict[str, Any]) -> str:
    return str(_function(tool).get("name") or "")


def runs_code(tool: dict[str, Any]) -> bool:
    """A tool that runs a program can do what any other does: it always fits, so it is never left offered."""
    function = _function(tool)
    properties = (function.get("parameters") or {}).get("properties") or {}
    description = str(function.get("description") or "").lower()
    return "code" in properties or function.get("name") == "python" or "python program" in description


def what_it_does(tool: dict[str, Any]) -> str:
    """The first clause of a tool's description, lower-cased and without asides: "convert a quantity from one unit
    to another" for "Convert a quantity from one unit to another, e.g. 5 km to mile ..."."""
    text = re.sub(r"\s*\([^)]*\)", "", str(_function(tool).get("description") or "")).strip()
    text = re.split(r"(?<=[a-z0-9])\.\s|\.$|,\s*e\.g\.|;\s", text)[0].strip().rstrip(".")
    if not text:
        return "what this request asks for"
    return text[0].lower() + text[1:] if text[1:2].islower() else text


def refusal_reply(missing: list[dict[str, Any]], seed: int | str) -> str:
    """A plain answer saying no offered tool fits and naming the missing one; the template is picked by `seed`."""
    tool = missing[0]
    template = REFUSALS[random.Random(f"refusal:{seed}").randrange(len(REFUSALS))]
    return template.format(name=tool_name(tool), what=what_it_does(tool))


def _called(example: dict[str, Any]) -> list[str]:
    names = []
    for message in example["messages"]:
        for call in message.get("tool_calls") or []:
            name = (call.get("function") or {}).get("name")
            if name and name not in names:
                names.append(name)
    return names


def build_irrelevance(
    examples: list[dict[str, Any]], fraction: float, seed: int
) -> tuple[list[dict[str, Any]], Counter[str], dict[str, int]]:
    """(irrelevance lines, why lines could not be built, lines built per source tool) for `fraction` of `examples`
    (the tool-call lines; at least one when the fraction is above 0). Each original request comes first, in a seeded
    order; paraphrases only when more are wanted than there are originals."""
    skipped: Counter[str] = Counter()
    per_tool: Counter[str] = Counter()
    if fraction <= 0 or not examples:
        return [], skipped, {}
    want = max(1, round(fraction * len(examples)))
    by_request: dict[str, set[str]] = {}
    for example in examples:
        by_request.setdefault(same_request_key(example["messages"][0]["content"]), set()).update(_called(example))
    order = sorted(examples, key=lambda e: e["meta"]["id"])
    random.Random(f"{seed}:irrelevance").shuffle(order)
    order.sort(key=lambda e: bool(e["meta"].get("paraphrase")))  # stable: originals first, each group shuffled
    lines: list[dict[str, Any]] = []
    for example in order:
        if len(lines) >= want:
            break
        query = example["messages"][0]["content"]
        called = _called(example)
        fits = set(called) | by_request.get(same_request_key(query), set())
        offered = [t for t in example["tools"] if tool_name(t) not in fits and not runs_code(t)]
        if not offered:
            skipped["no other tool to offer"] += 1
            continue
        missing = [t for t in example["tools"] if tool_name(t) in called] or [{"function": {"name": called[0]}}]
        meta = example["meta"]
        line_id = f"{meta['id']}/irrelevant"
        lines.append(
            {
                "messages": [
                    {"role": "user", "content": query},
                    {"role": "assistant", "content": refusal_reply(missing, f"{seed}:{line_id}")},
                ],
                "tools": offered,
                "meta": {
                    "id": line_id,
                    "original_id": meta.get("original_id", meta["id"]),
                    "tool": None,
                    "source": "distill-irrelevance",
                    "category": "no_tool",
                    "expected_answer": None,
                    "removed_tools": sorted(t for t in fits if t),
                    "paraphrase": bool(meta.get("paraphrase")),
                    "split": meta.get("split"),
                },
            }
        )
        per_tool[str(meta.get("tool"))] += 1
    return lines, skipped, dict(sorted(per_tool.items()))


# ---------------------------------------------------------------------------------------------- chit-chat


@dataclass(frozen=True)
class NoToolKind:
    """One kind of imagined no-tool line: how its requests are asked for and answered, and what it is counted as."""

    name: str  # "chitchat" | "out_of_scope": the meta source is distill-NAME, line ids NAME/INDEX
    topics: tuple[str, ...]
    request_file: Path
    digits_allowed: bool  # chit-chat: a number may need a calculation; out of scope: "a table for 4" is fine
    replies: tuple[str, ...] = ()  # fixed replies picked by the seed; empty: the explorer answers without tools

    def prompt(self, index: int, seed: int) -> str:
        topics = list(self.topics)
        random.Random(f"{seed}:{self.name}-topics").shuffle(topics)
        return self.request_file.read_text(encoding="utf-8").strip().format(topic=topics[index % len(topics)])


CHITCHAT = NoToolKind("chitchat", CHITCHAT_TOPICS, CHITCHAT_REQUEST_FILE, digits_allowed=False)
OUT_OF_SCOPE = NoToolKind(
    "out_of_scope", OUT_OF_SCOPE_TASKS, OUT_OF_SCOPE_REQUEST_FILE, digits_allowed=True, replies=OUT_OF_SCOPE_REPLIES
)


@dataclass(frozen=True)
class ChitchatOptions:
    count: int  # lines wanted
    temperature: float
    max_tokens: int  # per imagined request and per answer; an answer cut off there is dropped
    seed: int
    concurrency: int


def chitchat_count(fraction: float, tool_lines: int) -> int:
    """Chit-chat lines wanted: `fraction` of the tool-call lines, at least one when both are above 0."""
    return 0 if fraction <= 0 or tool_lines <= 0 else max(1, round(fraction * tool_lines))


def chitchat_prompt(index: int, seed: int) -> str:
    return CHITCHAT.prompt(index, seed)


def _words(text: str) -> set[str]:
    """The lower-cased words of a text that say what it is about, singular ("files" -> "file"), names split at
    underscores ("send_email" -> "send", "email")."""
    words = re.findall(r"[a-z]+", text.lower().replace("_", " "))
    singular = {w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in words}
    return {w for w in singular if len(w) > 2} - _COMMON_WORDS


def shared_tool_word(text: str, tools: list[dict[str, Any]]) -> str | None:
    """A word `text` shares with an offered tool's name or description (what may make that tool fit), or None."""
    request = _words(text)
    for tool in tools:
        function = _function(tool)
        common = request & _words(f"{function.get('name') or ''} {function.get('description') or ''}")
        if common:
            return sorted(common)[0]
    return None


def clean_request(text: str) -> str:
    text = text.strip()
    text = re.sub(r"^(user'?s? message|message|user)\s*:\s*", "", text, flags=re.IGNORECASE)
    return text.strip().strip("\"“”'").strip().split("\n\n")[0].strip()


def chitchat_request_problem(
    text: str,
    cut: bool,
    echo: list[EchoSource],
    seen: set[str],
    *,
    digits_allowed: bool = False,
    tools: list[dict[str, Any]] | None = None,
) -> str | None:
    """Why an imagined no-tool request is dropped, or None; with `tools`, also when it shares a word with one."""
    if cut:
        return "request cut off"
    if not text:
        return "empty request"
    if len(text) > CHITCHAT_MAX_REQUEST_CHARS:
        return "request too long"
    if not digits_allowed and re.search(r"\d", text):
        return "request has a number (it may need a tool)"
    if tools is not None and shared_tool_word(text, tools) is not None:
        return "request shares a word with an offered tool (it may fit)"
    if echo_problem(text, echo) is not None:
        return "request copies the prompt"
    if same_request_key(text) in seen:
        return "request repeats another"
    return None


def _repeats_itself(text: str) -> bool:
    """A sentence said twice, or a run of six words said twice: what a small model's loop looks like ("a source of
    inspiration and inspiration for many people. ... a source of inspiration and inspiration ...")."""
    sentences = [same_request_key(s) for s in re.split(r"(?<=[.!?])\s+", text) if same_request_key(s)]
    if len(sentences) != len(set(sentences)):
        return True
    words = same_request_key(text).split()
    runs = [tuple(words[i : i + 6]) for i in range(len(words) - 5)]
    return len(runs) != len(set(runs))


def chitchat_reply_problem(text: str, cut: bool, tools: list[dict[str, Any]]) -> str | None:
    if not text.strip():
        return "empty reply"
    if cut:
        return "reply cut off at chitchat_max_tokens"
    if "<tool_call>" in text or get_format(DEFAULT_FORMAT).parse(text, tools).calls:
        return "reply holds a tool call"
    if _repeats_itself(text):
        return "reply repeats itself"
    return None


async def _sample(
    backend: Backend, cache: ReplyCache, purpose: str, request: GenerationRequest, semaphore: asyncio.Semaphore
) -> tuple[str, bool]:
    """One completion (text, cut off at max_tokens), cached under `purpose` with the whole request."""
    params = request.params
    key = cache.key(
        purpose, getattr(backend, "name", ""), request.messages, params.temperature, params.max_tokens, params.seed
    )
    value = cache.get(key)
    if value is None:
        try:
            async with semaphore:
                completions = await backend.generate(request)
            completion = completions[0] if completions else None
            value = {
                "text": completion.text if completion else "",
                "cut": bool(completion and completion.finish_reason == "length"),
            }
        except ContextLengthError:
            value = {"text": "", "cut": True}
        cache.put(key, value)
    return str(value["text"]), bool(value["cut"])


async def build_chitchat(
    backend: Backend,
    cache: ReplyCache,
    opts: ChitchatOptions,
    tool_lists: list[list[dict[str, Any]]],
    known_requests: set[str],
    progress: Any = None,
    kind: NoToolKind = CHITCHAT,
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """(no-tool lines of `kind`, why candidates were dropped): up to `opts.count` lines, each offering one of
    `tool_lists` (in turn) and answering without a call. `known_requests`: `same_request_key`s of the lines already
    made (not repeated; the caller's set is not changed)."""
    dropped: Counter[str] = Counter()
    if opts.count <= 0 or not tool_lists:
        return [], dropped
    semaphore = asyncio.Semaphore(max(1, opts.concurrency))
    asked = opts.count * ASK_FACTOR + 2
    label = kind.name.replace("_", "-")
    advance = progress(f"imagining {label}", asked) if progress is not None else None

    async def imagine(index: int) -> tuple[str, bool]:
        salt = "chitchat" if kind is CHITCHAT else kind.name  # chit-chat keeps the seeds (and cache) it always had
        seed = int(hashlib.sha256(f"{opts.seed}:{salt}:{index}".encode()).hexdigest()[:8], 16)
        params = SamplingParams(temperature=opts.temperature, max_tokens=opts.max_tokens, seed=seed)
        request = GenerationRequest([{"role": "user", "content": kind.prompt(index, opts.seed)}], None, params)
        text, cut = await _sample(backend, cache, f"{label}-request", request, semaphore)
        if advance is not None:
            advance()
        return clean_request(text), cut

    imagined = await asyncio.gather(*(imagine(i) for i in range(asked)))
    echo = [EchoSource(f"{label} prompt", s) for s in template_sentences(kind.request_file.read_text("utf-8"))]
    every_tool = {tool_name(t): t for tools in tool_lists for t in tools}
    seen = set(known_requests)
    requests: list[str] = []
    for text, cut in imagined:
        problem = chitchat_request_problem(
            text,
            cut,
            echo,
            seen,
            digits_allowed=kind.digits_allowed,
            tools=list(every_tool.values()) if kind.replies else None,
        )
        if problem is not None:
            dropped[problem] += 1
            continue
        seen.add(same_request_key(text))
        requests.append(text)

    system = CHITCHAT_ANSWER_FILE.read_text(encoding="utf-8").strip()
    answering = progress(f"answering {label}", opts.count) if progress is not None and requests else None

    async def answer(index: int, text: str) -> tuple[str, bool]:
        if kind.replies:
            return kind.replies[random.Random(f"{opts.seed}:{kind.name}:{index}").randrange(len(kind.replies))], False
        params = SamplingParams(temperature=0.0, max_tokens=opts.max_tokens, seed=opts.seed)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        return await _sample(backend, cache, "chitchat-answer", GenerationRequest(messages, None, params), semaphore)

    lines: list[dict[str, Any]] = []
    done = 0  # requests answered so far: answered in order, only as many as lines are still wanted
    while len(lines) < opts.count and done < len(requests):
        batch = list(enumerate(requests[done : done + opts.count - len(lines)], start=done))
        done += len(batch)
        replies = await asyncio.gather(*(answer(index, text) for index, text in batch))
        for (index, request), (reply, cut) in zip(batch, replies, strict=True):
            tools = tool_lists[len(lines) % len(tool_lists)]
            problem = chitchat_reply_problem(reply, cut, tools)
            if problem is not None:
                dropped[problem] += 1
                continue
            if answering is not None:
                answering()
            line_id = f"{kind.name}/{index}"
            lines.append(
                {
                    "messages": [{"role": "user", "content": request}, {"role": "assistant", "content": reply.strip()}],
                    "tools": tools,
                    "meta": {
                        "id": line_id,
                        "original_id": line_id,
                        "tool": None,
                        "source": f"distill-{kind.name.replace('_', '-')}",
                        "category": "no_tool",
                        "expected_answer": None,
                        "model": getattr(backend, "name", None),
                        "paraphrase": False,
                    },
                }
            )
    return lines, dropped
