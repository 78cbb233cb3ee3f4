"""No-tool examples: a student must also learn when not to call.

Three kinds, all answered in plain text with the tools still offered:

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
- **out of scope** (no teacher): a request for something an assistant can only do with a tool or service it is
  not given (live information, acting in the world or on the user's accounts and devices), from a fixed list of
  tasks put in one of six ways a person asks ("Could you pay my electricity bill for me?") and of questions only
  live or personal information answers ("Is my train to Bristol on time?"), offered with a tool
  list of the kept lines and answered with a fixed sentence that no available tool can do it. Why: irrelevance lines
  only teach "this request's own tool was taken away" and chit-chat is small talk, so a small student offered the
  whole toolbox and asked for something else entirely invents a tool for it (`weather`, `send_email`). Written, not
  imagined: asked for such requests, Qwen2.5-Coder-0.5B wrote the assistant's side ("Sure! What would you like to
  buy online?") or a letter ("Dear [Your Name], ..."). A request that shares a word with an offered tool's name or
  description is not used: one a user's own tool might serve must not be taught as one to refuse.

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
# What an out-of-scope request asks for: services an assistant gives only with a tool it is not offered (live
# information, acting in the world or on the user's accounts and devices), written out as a person asks for them.
OUT_OF_SCOPE_TASKS = (
    "read me this morning's news headlines",
    "tell me the score of last night's football match",
    "order two large pizzas to 14 Elm Street",
    "buy a pair of running shoes in size 42 online",
    "reserve a double room in Lisbon for the weekend",
    "call a taxi to the airport for 6 am",
    "change my phone's wallpaper to a beach photo",
    "post my holiday photos on Instagram",
    "turn off the lights in the living room",
    "set the thermostat to 21",
    "put the dentist appointment in my calendar",
    "send me the photos from my phone's camera roll",
    "get me directions to the nearest petrol station",
    "track the parcel I sent to my aunt",
    "pay my electricity bill",
    "draw a picture of a cat on a skateboard",
    "record a voice memo of my shopping list",
    "check my bank balance",
    "find a pharmacy near me that is still open",
    "check whether my train to Bristol is on time",
    "share the budget spreadsheet with Sam",
    "switch on the robot vacuum in the kitchen",
    "look up the opening hours of the town museum",
    "lock the front door",
    "cancel my gym membership",
    "order a refill of my prescription",
    "find a plumber who can come this afternoon",
    "download the latest episode of my podcast",
    "get my boarding pass for the trip to Rome",
    "open the garage door",
    "renew my car insurance",
    "find my lost phone",
    "upload my essay to the school portal",
    "check the air quality in my street right now",
    "search the web for reviews of this laptop",
    "back up my laptop to the cloud",
)
# What a person asks that only live or personal information answers, put as the question itself: told only the
# tasks above (all requests to act), the 135M student still invented a tool for a plain question that needs one
# ("What is the capital..." answered, "What is the current price of..." called `python`).
OUT_OF_SCOPE_QUESTIONS = (
    "Who won last night's football match?",
    "Is my train to Bristol on time?",
    "What time does the town museum close?",
    "What's on at the cinema near me tonight?",
    "How much money is in my bank account?",
    "Has my parcel to my aunt arrived yet?",
    "What are the top news stories right now?",
    "Is the pharmacy on Elm Street still open?",
    "How long is the queue at the passport office right now?",
    "What's the traffic like on the ring road at the moment?",
    "Which restaurants near me have a free table tonight?",
    "Did Sam answer my last message?",
    "How many steps have I walked so far?",
    "Where did I leave my phone?",
    "Is the swimming pool open on Sunday?",
    "Who is playing at the concert hall this weekend?",
)
QUESTION_FORMS = ("{question}", "Quick question: {question}", "Hi! {question}", "Do you know? {question}")
# How a person puts such a task (with the task's first letter upper-cased where it starts the message).
OUT_OF_SCOPE_FORMS = (
    "Can you {task}?",
    "Please {task}.",
    "Could you {task} for me?",
    "I'd like you to {task}.",
    "{Task}.",
    "Hey, can you {task}? Thanks!",
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


def build_out_of_scope(
    count: int, tool_lists: list[list[dict[str, Any]]], known_requests: set[str], seed: int
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """(out-of-scope lines, why candidates were not used): up to `count` lines, each offering one of `tool_lists`
    (in turn); the tasks and questions that share no word with any offered tool, each in one form before any in a
    second, in a seeded order. `known_requests`: `same_request_key`s of the other lines (not repeated)."""
    skipped: Counter[str] = Counter()
    if count <= 0 or not tool_lists:
        return [], skipped
    every_tool = list({tool_name(t): t for tools in tool_lists for t in tools}.values())
    # each task or question with the ways it is put
    candidates: list[list[str]] = []
    for task in OUT_OF_SCOPE_TASKS:
        candidates.append([form.format(task=task, Task=task[0].upper() + task[1:]) for form in OUT_OF_SCOPE_FORMS])
    for question in OUT_OF_SCOPE_QUESTIONS:
        candidates.append([form.format(question=question) for form in QUESTION_FORMS])
    usable = []
    for requests in candidates:
        if shared_tool_word(" ".join(requests), every_tool) is None:  # every form's words ("Quick question")
            usable.append(requests)
        else:
            skipped["the task shares a word with an offered tool (it may fit)"] += 1
    rng = random.Random(f"{seed}:out-of-scope")
    rng.shuffle(usable)
    for requests in usable:
        rng.shuffle(requests)
    seen = set(known_requests)
    lines: list[dict[str, Any]] = []
    for round_ in range(max((len(requests) for requests in usable), default=0)):
        for requests in usable:
            if len(lines) >= count:
                return lines, skipped
            if round_ >= len(requests):
                continue
            request = requests[round_]
            if same_request_key(request) in seen:
                skipped["request repeats another"] += 1
                continue
            seen.add(same_request_key(request))
            index = len(lines)
            line_id = f"out_of_scope/{index}"
            reply = OUT_OF_SCOPE_REPLIES[random.Random(f"{seed}:{line_id}").randrange(len(OUT_OF_SCOPE_REPLIES))]
            lines.append(
                no_tool_line(line_id, request, reply, tool_lists[index % len(tool_lists)], "distill-out-of-scope")
            )
    return lines, skipped


def _called(example: dict[str, Any]) -> list[str]:
    names = []
    for message in example["messages"]:
        for call in message.get("tool_calls") or []:
            name = (call.get("function") or {}).get("name")
            if name and name not in names:
                names.append(name)
    return names


def lines_wanted(fraction: float, tool_lines: int) -> int:
    """No-tool lines of one kind wanted: `fraction` of the tool-call lines, at least one when both are above 0."""
    return 0 if fraction <= 0 or tool_lines <= 0 else max(1, round(fraction * tool_lines))


def no_tool_line(
    line_id: str, request: str, reply: str, tools: list[dict[str, Any]], source: str, **meta: Any
) -> dict[str, Any]:
    """A dataset line answered without a call: the request, the plain reply, the tools offered; `meta` adds to (or
    overrides) the keys every no-tool line has."""
    return {
        "messages": [{"role": "user", "content": request}, {"role": "assistant", "content": reply}],
        "tools": tools,
        "meta": {
            "id": line_id,
            "original_id": line_id,
            "tool": None,
            "source": source,
            "category": "no_tool",
            "expected_answer": None,
            "paraphrase": False,
            **meta,
        },
    }


def build_irrelevance(
    examples: list[dict[str, Any]], fraction: float, seed: int
) -> tuple[list[dict[str, Any]], Counter[str], dict[str, int]]:
    """(irrelevance lines, why lines could not be built, lines built per source tool) for `fraction` of `examples`
    (the tool-call lines; at least one when the fraction is above 0). Each original request comes first, in a seeded
    order; paraphrases only when more are wanted than there are originals."""
    skipped: Counter[str] = Counter()
    per_tool: Counter[str] = Counter()
    want = lines_wanted(fraction, len(examples))
    if not want:
        return [], skipped, {}
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
            no_tool_line(
                line_id,
                query,
                refusal_reply(missing, f"{seed}:{line_id}"),
                offered,
                "distill-irrelevance",
                original_id=meta.get("original_id", meta["id"]),
                removed_tools=sorted(t for t in fits if t),
                paraphrase=bool(meta.get("paraphrase")),
                split=meta.get("split"),
            )
        )
        per_tool[str(meta.get("tool"))] += 1
    return lines, skipped, dict(sorted(per_tool.items()))


# ---------------------------------------------------------------------------------------------- chit-chat


@dataclass(frozen=True)
class ChitchatOptions:
    count: int  # lines wanted
    temperature: float
    max_tokens: int  # per imagined request and per answer; an answer cut off there is dropped
    seed: int
    concurrency: int


def chitchat_prompt(index: int, seed: int) -> str:
    topics = list(CHITCHAT_TOPICS)
    random.Random(f"{seed}:chitchat-topics").shuffle(topics)
    return CHITCHAT_REQUEST_FILE.read_text(encoding="utf-8").strip().format(topic=topics[index % len(topics)])


def _words(text: str) -> set[str]:
    """The words of a text that say what it is about (`same_request_key`'s words, no numbers), singular ("files" ->
    "file"), names split at underscores ("send_email" -> "send", "email")."""
    words = [w for w in same_request_key(text.replace("_", " ")).split() if w.isalpha()]
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


def chitchat_request_problem(text: str, cut: bool, echo: list[EchoSource], seen: set[str]) -> str | None:
    if cut:
        return "request cut off"
    if not text:
        return "empty request"
    if len(text) > CHITCHAT_MAX_REQUEST_CHARS:
        return "request too long"
    if re.search(r"\d", text):
        return "request has a number (it may need a tool)"
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
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """(chit-chat lines, why candidates were dropped): up to `opts.count` lines, each offering one of `tool_lists`
    (in turn) and answering without a call. `known_requests`: `same_request_key`s of the tool lines (not repeated)."""
    dropped: Counter[str] = Counter()
    if opts.count <= 0 or not tool_lists:
        return [], dropped
    semaphore = asyncio.Semaphore(max(1, opts.concurrency))
    asked = opts.count * ASK_FACTOR + 2
    advance = progress("imagining chit-chat", asked) if progress is not None else None

    async def imagine(index: int) -> tuple[str, bool]:
        seed = int(hashlib.sha256(f"{opts.seed}:chitchat:{index}".encode()).hexdigest()[:8], 16)
        params = SamplingParams(temperature=opts.temperature, max_tokens=opts.max_tokens, seed=seed)
        request = GenerationRequest([{"role": "user", "content": chitchat_prompt(index, opts.seed)}], None, params)
        text, cut = await _sample(backend, cache, "chitchat-request", request, semaphore)
        if advance is not None:
            advance()
        return clean_request(text), cut

    imagined = await asyncio.gather(*(imagine(i) for i in range(asked)))
    echo = [EchoSource("chit-chat prompt", s) for s in template_sentences(CHITCHAT_REQUEST_FILE.read_text("utf-8"))]
    seen = set(known_requests)
    requests: list[str] = []
    for text, cut in imagined:
        problem = chitchat_request_problem(text, cut, echo, seen)
        if problem is not None:
            dropped[problem] += 1
            continue
        seen.add(same_request_key(text))
        requests.append(text)

    system = CHITCHAT_ANSWER_FILE.read_text(encoding="utf-8").strip()
    answering = progress("answering chit-chat", opts.count) if progress is not None and requests else None

    async def answer(text: str) -> tuple[str, bool]:
        params = SamplingParams(temperature=0.0, max_tokens=opts.max_tokens, seed=opts.seed)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        return await _sample(backend, cache, "chitchat-answer", GenerationRequest(messages, None, params), semaphore)

    lines: list[dict[str, Any]] = []
    done = 0  # requests answered so far: answered in order, only as many as lines are still wanted
    while len(lines) < opts.count and done < len(requests):
        batch = list(enumerate(requests[done : done + opts.count - len(lines)], start=done))
        done += len(batch)
        replies = await asyncio.gather(*(answer(text) for _, text in batch))
        for (index, request), (reply, cut) in zip(batch, replies, strict=True):
            tools = tool_lists[len(lines) % len(tool_lists)]
            problem = chitchat_reply_problem(reply, cut, tools)
            if problem is not None:
                dropped[problem] += 1
                continue
            if answering is not None:
                answering()
            line_id = f"chitchat/{index}"
            lines.append(
                no_tool_line(
                    line_id, request, reply.strip(), tools, "distill-chitchat", model=getattr(backend, "name", None)
                )
            )
    return lines, dropped
