"""Step 4, judge: a model says Yes/No with a reason on three criteria per trial, and whether a paraphrase asks for
the same thing as its original (step 7). Replies are cached; a reply without a readable verdict is not kept."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from toolschool.data.cache import ReplyCache
from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.rules import Candidate
from toolschool.data.distill.templates import generate, render
from toolschool.models.backend import Backend

JUDGE_CRITERIA = ("addresses", "faithful", "appropriate")  # the three questions of prompts/judge.jinja, in order
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
    return render("judge", query=candidate.query, calls="\n".join(lines), final=candidate.final_answer)


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


_SAME_LINE = re.compile(rf"^\W*same\W*\s*(yes|no)\b{_NOT_AN_ALTERNATIVE}\W*(.*)$", re.IGNORECASE)
_BARE_VERDICT = re.compile(rf"^\W*(yes|no)\b{_NOT_AN_ALTERNATIVE}\W*(.*)$", re.IGNORECASE)


def paraphrase_judge_prompt(original: str, paraphrase: str) -> str:
    return render("paraphrase_judge", original=original, paraphrase=paraphrase)


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
                completions = await generate(
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
