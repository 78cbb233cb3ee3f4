"""Evaluation over a `Backend`: every item is its own coroutine, so the backend batches them (continuous batching
locally, concurrent requests over HTTP); `concurrency` caps how many are in flight.

Per item: the prompt (optionally with retrieved demonstrations) is converted by the chat format, one reply is
generated and parsed (a reply that trips the parser is malformed, never an exception) and scored with
`metrics.score_item` (plus the benchmark's own judge, e.g. BFCL's AST checker). With `execute`, the predicted
calls then run through the tool registry, the observations go back to the model, and the final answer is
scored against the item's expected answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolschool.chat.constraints import Constraint
from toolschool.chat.formats import get_format
from toolschool.chat.toolkens import calls_named_as_offered
from toolschool.chat.types import ParsedReply
from toolschool.errors import ConfigError, DataError
from toolschool.evaluate.items import EvalItem
from toolschool.evaluate.metrics import ArgMode, ItemScore, aggregate, answer_matches, per_tool_accuracy, score_item
from toolschool.evaluate.retrieval import DemoPool, with_demonstrations
from toolschool.models.backend import Backend, ContextLengthError, GenerationRequest, SamplingParams


@dataclass
class EvalOptions:
    format: str = "hermes"
    max_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    concurrency: int = 16  # items in flight at once (1 = one at a time)
    mode: ArgMode = "exact"  # argument matching that decides `correct`
    semantic: bool = True  # also compute semantic argument matches (runs python in the sandbox)
    icl_k: int = 0  # demonstrations per item
    demos: DemoPool | None = None
    execute: bool = False
    registry: Any = None  # toolschool.tools.registry.ToolRegistry, needed for execute
    max_turns: int = 4  # replies per item with execute
    constrained: bool = False  # replies grammar-constrained (tool_choice auto): a call always parses and validates

    @property
    def decoding(self) -> str:
        """The decoding mode the report and summary state: "constrained" or "free"."""
        return "constrained" if self.constrained else "free"


@dataclass
class ItemResult:
    item: EvalItem
    prompt: list[dict[str, Any]]  # messages as sent to the backend (after the format's conversion)
    tools: list[dict[str, Any]] | None  # tools as sent
    raw: str
    parsed: ParsedReply
    score: ItemScore
    verdict: dict[str, Any] | None = None  # the benchmark judge's verdict
    transcript: list[dict[str, Any]] = field(default_factory=list)  # execute: the whole conversation
    final_answer: str | None = None
    seconds: float = 0.0
    decoding: str = "free"  # how the replies were generated (EvalOptions.decoding)

    def record(self) -> dict[str, Any]:
        """One JSON line of the per-item output."""
        return {
            "id": self.item.id,
            "benchmark": self.item.benchmark,
            "category": self.item.category,
            "prompt": self.prompt,
            "tools": [t.get("function", t).get("name") for t in self.item.tools],
            "raw_output": self.raw,
            "parsed": {
                "calls": self.parsed.calls,
                "final": self.parsed.final,
                "error": self.parsed.error,
            },
            "gold_calls": self.item.gold_calls,
            "gold_final": self.item.gold_final,
            "verdicts": self.score.to_dict(),
            "benchmark_verdict": self.verdict,
            "expected_answer": self.item.expected_answer if self.transcript else None,
            "final_answer": self.final_answer,
            "transcript": self.transcript or None,
            "decoding": self.decoding,
            "seconds": round(self.seconds, 3),
        }


def _with_ids(calls: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    out = []
    for k, call in enumerate(calls):
        call = dict(call)
        call.setdefault("id", f"call_{turn}_{k}")
        out.append(call)
    return out


def written_in(item: EvalItem) -> str | None:
    """The text format a dataset line is already written in (`meta.format` json/react), or None if canonical."""
    value = item.meta.get("format")
    return None if value in (None, "hermes") else str(value)


def sent_messages(
    fmt: Any, item: EvalItem, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The conversation as the format sends it (validation during training sends the same prompts). A line
    already written in the format keeps its own system message, which holds the format's instructions and tools
    already (converting it again would repeat them);
    the turns after it (demonstrations, --execute's calls and results) are converted as for any line."""
    if written_in(item) is None:
        return fmt.to_messages(messages, tools)
    sent, _ = fmt.to_messages(messages, None)
    if messages and messages[0].get("role") == "system":
        sent[0] = {"role": "system", "content": messages[0].get("content") or ""}
    return sent, None


def item_constraint(fmt: Any, item: EvalItem) -> Constraint:
    """What an item's reply may be when decoding is constrained: free text or a call that parses, names an offered
    tool and fits its schema (tool_choice auto)."""
    return Constraint.for_tools(fmt.name, item.tools, "auto")


def check_item_constraints(backend: Backend, items: list[EvalItem], options: EvalOptions) -> None:
    """Constrained decoding: a schema the grammar library cannot compile ends the evaluation here, in one line
    naming the tool and the construct, before any item generates (each distinct tool set checked once)."""
    if not options.constrained:
        return
    fmt = get_format(options.format)
    checked: set[str] = set()
    for item in items:
        constraint = item_constraint(fmt, item)
        if constraint.key() not in checked:
            checked.add(constraint.key())
            backend.check_constraint(constraint)


async def _generate(
    backend: Backend, fmt: Any, item: EvalItem, messages: list[dict[str, Any]], options: EvalOptions
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str]:
    # a toolken model's item offers <tool_NAME>: demonstrations and executed calls are named so too
    sent, sent_tools = sent_messages(fmt, item, calls_named_as_offered(messages, item.tools), item.tools)
    params = SamplingParams(
        max_tokens=options.max_tokens, temperature=options.temperature, stop=list(fmt.stop), seed=options.seed
    )
    constraint = item_constraint(fmt, item) if options.constrained else None
    request = GenerationRequest(sent, sent_tools, params, prefill=fmt.prefill, constraint=constraint)
    completions = await backend.generate(request)
    return sent, sent_tools, completions[0].text if completions else ""


async def evaluate_item(backend: Backend, item: EvalItem, options: EvalOptions) -> ItemResult:
    fmt = get_format(options.format)
    started = time.perf_counter()
    messages = [dict(m) for m in item.messages]
    if options.icl_k and options.demos is not None:
        messages = with_demonstrations(messages, options.demos.demonstrations(item.query, options.icl_k))
    try:
        sent, sent_tools, raw = await _generate(backend, fmt, item, messages, options)
        parsed = fmt.parse(raw, item.tools)
    except ContextLengthError as exc:  # scored as a failed reply: the other items go on, and a resume does not stop
        sent, sent_tools, raw = messages, item.tools, ""
        parsed = context_full_reply(exc)
    score = score_item(
        parsed,
        item.gold_calls,
        item.expected_answer if item.expected_answer is not None else item.gold_final,
        mode=options.mode,
        format_name=fmt.name,
        semantic=options.semantic,
    )
    verdict = item.judge(parsed) if item.judge is not None else None
    if verdict is not None:
        _arguments_by_judge(score, verdict)
    result = ItemResult(item, sent, sent_tools, raw, parsed, score, verdict, decoding=options.decoding)
    if options.execute and not is_context_full(parsed):
        await _execute(backend, fmt, item, messages, parsed, result, options)
    result.seconds = time.perf_counter() - started
    return result


def _arguments_by_judge(score: ItemScore, verdict: dict[str, Any]) -> None:
    """A benchmark's judge is its argument check: BFCL's gold calls carry only names (its answers are lists of
    acceptable values that only the AST checker reads), so without this `correct` would mean "right function"."""
    valid = bool(verdict.get("valid"))
    score.args_exact = score.args_semantic = score.tool_match and valid
    score.correct = score.well_formed and score.args_exact


async def _execute(
    backend: Backend,
    fmt: Any,
    item: EvalItem,
    messages: list[dict[str, Any]],
    parsed: ParsedReply,
    result: ItemResult,
    options: EvalOptions,
) -> None:
    """Run the calls, feed observations back, and score the final answer (None when the model never answers)."""
    conversation = list(messages)
    reply = parsed
    for turn in range(options.max_turns):
        if reply.error is not None:  # the parser's message goes back as the observation, as in exploration
            conversation.append({"role": "assistant", "content": reply.text})
            conversation.append({"role": "user", "content": f"Error: {reply.error}"})
        elif reply.calls:
            calls = _with_ids(reply.calls, turn)
            conversation.append({"role": "assistant", "content": reply.content or "", "tool_calls": calls})
            for call in calls:
                function = call.get("function", {})
                observation = await options.registry.acall(function.get("name", ""), function.get("arguments", {}))
                conversation.append(
                    {
                        "role": "tool",
                        "tool_call_id": call["id"],
                        "name": function.get("name"),
                        "content": observation.text,
                    }
                )
        else:
            conversation.append(reply.as_message())
            result.final_answer = reply.final
            break
        if turn == options.max_turns - 1:
            break
        try:
            _, _, raw = await _generate(backend, fmt, item, conversation, options)
        except ContextLengthError:  # the conversation outgrew the context: no final answer
            break
        reply = fmt.parse(raw, item.tools)
    result.transcript = conversation
    expected = item.expected_answer
    result.score.answer_correct = None if expected is None else answer_matches(result.final_answer, expected)


async def evaluate_items(
    backend: Backend,
    items: list[EvalItem],
    options: EvalOptions,
    *,
    on_done: Callable[[ItemResult], None] | None = None,
) -> list[ItemResult]:
    """All items, at most `options.concurrency` in flight; results in item order."""
    if options.execute and options.registry is None:
        raise ValueError("evaluate_items: execute=True needs options.registry")
    wrong = next((item for item in items if written_in(item) not in (None, options.format)), None)
    if wrong is not None:
        raise DataError(
            f"item '{wrong.id}' is written in the '{written_in(wrong)}' format (meta.format), but the evaluation "
            f"uses --format {options.format}",
            hint=f"pass --format {written_in(wrong)}, or evaluate the dataset's canonical (hermes) file",
        )
    if options.constrained and not getattr(backend, "constrains", False):
        raise ConfigError(
            f"--constrained needs a model run by the local backend; '{getattr(backend, 'name', 'the model')}' cannot "
            "constrain its replies (an OpenAI-compatible endpoint)",
            hint="evaluate it with --no-constrained (eval.constrained = false)",
        )
    check_item_constraints(backend, items, options)
    gate = asyncio.Semaphore(max(1, options.concurrency))

    async def one(item: EvalItem) -> ItemResult:
        async with gate:
            result = await evaluate_item(backend, item, options)
        if on_done is not None:
            on_done(result)
        return result

    return list(await asyncio.gather(*(one(item) for item in items)))


# The parse error of an item whose prompt the backend refused as longer than the model's context.
CONTEXT_FULL = "the prompt does not fit the model's context"


def context_full_reply(exc: ContextLengthError) -> ParsedReply:
    """How a prompt that does not fit the model's context is scored: a failed reply (`is_context_full`)."""
    return ParsedReply(text="", error=f"{CONTEXT_FULL}: {exc}")


def is_context_full(parsed: ParsedReply) -> bool:
    return bool(parsed.error and parsed.error.startswith(CONTEXT_FULL))


def items_digest(items: list[EvalItem]) -> str:
    """Which items a summary block scored (their ids and queries, in order): two summaries, e.g. zero-shot and
    ICL, compare only where they are equal, which the run report checks."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(json.dumps([item.id, item.query], ensure_ascii=False).encode("utf-8") + b"\n")
    return digest.hexdigest()[:16]


def summarize(results: list[ItemResult]) -> dict[str, Any]:
    """Metrics over all items, per benchmark category, and per gold tool; `accuracy` where a judge gave verdicts
    (BFCL's overall `accuracy`: its own aggregate of the categories, `bfcl.summary_accuracy`; the other rates are
    pooled over the items); `context_full`: how many items were scored failed because their prompt did not fit
    (only when some were); `items_digest` and `category_digests`: which items were scored."""

    def block(group: list[ItemResult]) -> dict[str, float]:
        rates = aggregate([r.score for r in group])
        judged = [r.verdict for r in group if r.verdict is not None]
        if judged:
            rates["accuracy"] = sum(bool(v.get("valid")) for v in judged) / len(judged)
        return rates

    categories: dict[str, list[ItemResult]] = {}
    for result in results:
        categories.setdefault(result.item.category or result.item.benchmark, []).append(result)
    by_category = {name: block(group) for name, group in sorted(categories.items())}
    overall = block(results)
    if "accuracy" in overall and all(r.item.benchmark == "bfcl" for r in results):
        # BFCL's overall is not pooled over items: the mean of its categories' accuracies (irrelevance apart)
        from toolschool.evaluate.benchmarks.bfcl import summary_accuracy

        value = summary_accuracy({n: b["accuracy"] for n, b in by_category.items() if "accuracy" in b})
        if value is not None:
            overall["accuracy"] = value
    summary: dict[str, Any] = {
        "overall": overall,
        "by_category": by_category if len(categories) > 1 else {},
        "per_tool": per_tool_accuracy([r.score for r in results]),
        "items_digest": items_digest([r.item for r in results]),
    }
    if len(categories) > 1:
        summary["category_digests"] = {
            name: items_digest([r.item for r in group]) for name, group in categories.items()
        }
    if full := sum(is_context_full(r.parsed) for r in results):
        summary["context_full"] = full
    return summary
