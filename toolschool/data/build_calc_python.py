"""`toolschool dataset build-calc-python`: the calculator / python / no-tool dataset.

- calculator, from GSM8K-style `{question, answer}`: the solution's own `<<expression=value>>` annotations are
  each checked with the project calculator (the value must be the expression's result, up to the decimals
  the annotation shows); the annotation that yields the `#### answer` is then written as ONE expression by
  substituting, for each intermediate result it uses that is not a number of the question, the expression
  that produced it — so a single calculator call solves the problem. Every dropped problem is counted under
  its reason.
- python_exec, from CRUXEval-style `{code, input, output}`: the call is the function plus
  `print(repr(f(<input>)))`; the expected answer is what the sandbox printed, kept only when it equals the
  given output (as text or as the same Python literal).
- no_tool, from `{dialog_history, response}` (single user turn) or Alpaca-style `{instruction, input, output}`.

Selection is deterministic under the seed; per-category targets come from `size` and the ratios.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import random
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolschool.data.dataset import DatasetReport, read_raw_records, same_request_key
from toolschool.data.records import CATEGORIES, Record, example_to_format, record_to_example
from toolschool.errors import DataError
from toolschool.run_state import write_jsonl

ANNOTATION = re.compile(r"<<([^<>]*)>>")
NUMBER = re.compile(r"(?<![\d.])(?:\d+(?:\.\d+)?|\.\d+)")
FINAL_MARK = "####"

CALCULATOR_PROMPTS = ("{question}",)
PYTHON_PROMPTS = (
    "What does this Python function return for f({input})?\n\n```python\n{code}\n```",
    "Run this code and tell me the result of f({input}).\n\n```python\n{code}\n```",
    "Given the function below, what is the value of f({input})?\n\n```python\n{code}\n```",
    "I have this Python function:\n\n```python\n{code}\n```\n\nWhat do I get when I call f({input})?",
)


@dataclass
class CategoryStats:
    """How one category's source was used: available, examined, kept, dropped (by reason), selected."""

    source: str
    available: int = 0
    examined: int = 0
    valid: int = 0
    used: int = 0
    target: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    examples_of_drops: dict[str, str] = field(default_factory=dict)

    def drop(self, reason: str, where: str) -> None:
        self.dropped[reason] += 1
        self.examples_of_drops.setdefault(reason, where)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "available": self.available,
            "examined": self.examined,
            "valid": self.valid,
            "dropped": sum(self.dropped.values()),
            "dropped_by_reason": dict(self.dropped.most_common()),
            "first_dropped_at": self.examples_of_drops,
            "target": self.target,
            "used": self.used,
        }


def _stable_id(prefix: str, text: str) -> str:
    return f"{prefix}-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:12]}"


# ---------------------------------------------------------------------------------------------- calculator


def _decimals(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


def matches_annotated(value: float, annotated: str) -> bool:
    """`value` equals the annotated number, allowing the rounding the annotation's decimals imply.

    An integer annotation must match (within float noise); `3.33` accepts 10/3 — GSM8K rounds shown results.
    """
    try:
        target = float(annotated.replace(",", "").strip())
    except ValueError:
        return False
    places = _decimals(annotated.strip())
    noise = 1e-9 * max(1.0, abs(target))
    tolerance = noise if places == 0 else 0.5 * 10.0**-places + noise
    return math.isfinite(value) and abs(value - target) <= tolerance


def _same_number(annotated: str, literal: str) -> bool:
    try:
        return float(annotated.replace(",", "")) == float(literal)
    except ValueError:
        return False


@dataclass
class CalcResult:
    expression: str | None
    answer: str | None
    reason: str | None  # why the problem was dropped


def gsm8k_expression(question: str, answer: str, *, max_chars: int = 200) -> CalcResult:
    """One calculator expression solving a GSM8K problem, built from its checked annotations (or a drop reason)."""
    from toolschool.tools.calculator import CalculatorError, evaluate_expression

    if FINAL_MARK not in answer:
        return CalcResult(None, None, "no '#### answer' line")
    final_text = answer.rsplit(FINAL_MARK, 1)[1].strip().replace(",", "")
    try:
        float(final_text)
    except ValueError:
        return CalcResult(None, None, "final answer is not a number")
    annotations = ANNOTATION.findall(answer)
    if not annotations:
        return CalcResult(None, None, "no <<expression=value>> annotations")
    steps: list[tuple[str, str, float]] = []  # expression, annotated value text, computed value
    for raw in annotations:
        if "=" not in raw:
            return CalcResult(None, None, "annotation without '='")
        expression, annotated = (part.strip() for part in raw.rsplit("=", 1))
        try:
            value = float(evaluate_expression(expression))
        except CalculatorError:
            return CalcResult(None, None, "annotation expression does not evaluate")
        except (OverflowError, ZeroDivisionError, ValueError):
            return CalcResult(None, None, "annotation expression does not evaluate")
        if not matches_annotated(value, annotated):
            return CalcResult(None, None, "annotation value differs from its expression's result")
        steps.append((expression, annotated, value))

    target = next((i for i in range(len(steps) - 1, -1, -1) if matches_annotated(steps[i][2], final_text)), None)
    if target is None:
        return CalcResult(None, None, "no annotation yields the final answer")
    question_numbers = {n for n in NUMBER.findall(question.replace(",", ""))}

    def compose(index: int, depth: int = 0) -> str:
        expression = steps[index][0]

        def substitute(match: re.Match[str]) -> str:
            literal = match.group(0)
            if literal in question_numbers or depth > 20:
                return literal
            for j in range(index - 1, -1, -1):  # the latest earlier result with this value
                if _same_number(steps[j][1], literal):
                    return f"({compose(j, depth + 1)})"
            return literal

        return NUMBER.sub(substitute, expression)

    composed = compose(target)
    if len(composed) > max_chars:
        return CalcResult(None, None, f"composed expression longer than {max_chars} characters")
    try:
        composed_value = float(evaluate_expression(composed))
    except (CalculatorError, OverflowError, ZeroDivisionError, ValueError):
        return CalcResult(None, None, "composed expression does not evaluate")
    if not matches_annotated(composed_value, final_text):
        return CalcResult(None, None, "composed expression does not reproduce the final answer")
    return CalcResult(composed.replace(" ", ""), final_text, None)


# ---------------------------------------------------------------------------------------------- python


def python_call_code(code: str, call_input: str) -> str:
    """The code the python tool runs: the function, then print the repr of its result on the given input."""
    return f"{code.rstrip()}\n\nprint(repr(f({call_input})))\n"


def same_output(printed: str, given: str) -> bool:
    """Printed repr vs the dataset's output: equal text, or equal as Python literals."""
    if printed.strip() == given.strip():
        return True
    try:
        return ast.literal_eval(printed.strip()) == ast.literal_eval(given.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


# ---------------------------------------------------------------------------------------------- tools


def calc_python_tools() -> dict[str, Any]:
    """The built-in calculator and python tools (their schemas are offered on every line, no_tool included)."""
    from toolschool.tools.builtin import builtin_tools

    tools = {tool.name: tool for tool in builtin_tools() if tool.name in ("calculator", "python")}
    if set(tools) != {"calculator", "python"}:
        raise DataError(f"the built-in toolbox lacks calculator/python (found {', '.join(tools)})")
    return tools


# ---------------------------------------------------------------------------------------------- build


@dataclass
class BuildOptions:
    gsm8k: str
    cruxeval: str
    instructions: str
    out: Path
    size: int = 1000
    ratios: dict[str, float] = field(default_factory=lambda: {"calculator": 0.4, "python_exec": 0.3, "no_tool": 0.3})
    validation_fraction: float = 0.1
    seed: int = 0
    formats: list[str] = field(default_factory=lambda: ["hermes"])
    max_expression_chars: int = 200
    max_prompt_chars: int = 2000
    workers: int = 2
    split: str = "train"


def category_targets(size: int, ratios: dict[str, float]) -> dict[str, int]:
    """Per-category counts from the total and the ratios (normalised; largest remainders get the rest)."""
    unknown = sorted(set(ratios) - set(CATEGORIES))
    if unknown:
        raise DataError(f"unknown category ratio(s) {', '.join(unknown)}", hint=f"use {', '.join(CATEGORIES)}")
    if not all(math.isfinite(r) for r in ratios.values()):  # int(nan) further down would be a traceback
        raise DataError(
            f"--ratio / [dataset] ratios {ratios}: each share must be a finite number >= 0",
            hint="e.g. --ratio calculator=0.5 --ratio python_exec=0.3 --ratio no_tool=0.2",
        )
    if any(r < 0 for r in ratios.values()) or sum(ratios.values()) <= 0:
        raise DataError(
            f"--ratio / [dataset] ratios {ratios}: each share must be >= 0 with a positive sum",
            hint="e.g. --ratio calculator=0.5 --ratio python_exec=0.3 --ratio no_tool=0.2",
        )
    if size < 0:
        raise DataError(f"size {size} must be >= 0")
    total = sum(ratios.values())
    exact = {c: size * ratios.get(c, 0.0) / total for c in CATEGORIES}
    counts = {c: int(math.floor(v)) for c, v in exact.items()}
    for c in sorted(CATEGORIES, key=lambda c: exact[c] - counts[c], reverse=True)[: size - sum(counts.values())]:
        counts[c] += 1
    return counts


def _shuffled(rows: list[dict[str, Any]], seed: int, salt: str) -> list[dict[str, Any]]:
    order = list(rows)
    random.Random(f"{seed}:{salt}").shuffle(order)
    return order


def build_calculator(rows: list[dict[str, Any]], target: int, opts: BuildOptions, stats: CategoryStats) -> list[Record]:
    """Examine every problem (cheap), so the summary covers the whole source; keep the first `target` valid."""
    records: list[Record] = []
    seen: set[str] = set()  # a repeated question is one record (ids stay unique; nothing is trained on twice)
    for row in _shuffled(rows, opts.seed, "calculator"):
        stats.examined += 1
        where = row.get("_where", "?")
        question, answer = row.get("question"), row.get("answer")
        if not isinstance(question, str) or not isinstance(answer, str):
            stats.drop("missing 'question' or 'answer' text", where)
            continue
        record_id, key = _stable_id("calc", question.strip()), same_request_key(question)
        if key in seen:
            stats.drop("same question as an earlier row", where)
            continue
        result = gsm8k_expression(question, answer, max_chars=opts.max_expression_chars)
        if result.reason is not None:
            stats.drop(result.reason, where)
            continue
        seen.add(key)
        stats.valid += 1
        if len(records) < target:
            records.append(
                Record(
                    id=record_id,
                    source=stats.source,
                    category="calculator",
                    tool_needed=True,
                    tool="calculator",
                    tool_args={"expression": result.expression},
                    prompt=question.strip(),
                    expected_answer=str(result.answer),
                )
            )
    return records


def _run_python_row(row: dict[str, Any]) -> tuple[dict[str, Any], str | None, str | None]:
    """(row, sandbox result or None, drop reason or None) — runs the call in the sandbox, as the python tool does."""
    from toolschool.tools.sandbox import SandboxLimits, run_python

    code, call_input, given = row.get("code"), row.get("input"), row.get("output")
    if not all(isinstance(x, str) for x in (code, call_input, given)):
        return row, None, "missing 'code', 'input' or 'output' text"
    result = run_python(python_call_code(code, call_input), SandboxLimits())
    if result.timed_out or result.limit:
        return row, None, f"sandbox limit hit ({result.limit or 'timeout'})"
    if result.exit_code != 0:
        return row, None, "the code raised an error in the sandbox"
    printed = result.stdout.strip()
    if not same_output(printed, given):
        return row, None, "sandbox output differs from the given output"
    return row, result, None


def build_python(rows: list[dict[str, Any]], target: int, opts: BuildOptions, stats: CategoryStats) -> list[Record]:
    """Run candidates in the sandbox (in parallel batches) until `target` are valid; the rest are not run."""
    records: list[Record] = []
    seen: set[str] = set()
    order = _shuffled(rows, opts.seed, "python")
    rng = random.Random(f"{opts.seed}:python-prompts")
    batch = max(1, opts.workers) * 4
    with ThreadPoolExecutor(max_workers=max(1, opts.workers)) as pool:
        for start in range(0, len(order), batch):
            if len(records) >= target:
                break
            for row, result, reason in pool.map(_run_python_row, order[start : start + batch]):
                if len(records) >= target:
                    break
                stats.examined += 1
                if reason is not None:
                    stats.drop(reason, row.get("_where", "?"))
                    continue
                code = python_call_code(row["code"], row["input"])
                record_id = _stable_id("py", code)
                if record_id in seen:
                    stats.drop("same code and input as an earlier row", row.get("_where", "?"))
                    continue
                seen.add(record_id)
                stats.valid += 1
                template = PYTHON_PROMPTS[rng.randrange(len(PYTHON_PROMPTS))]
                records.append(
                    Record(
                        id=record_id,
                        source=stats.source,
                        category="python_exec",
                        tool_needed=True,
                        tool="python",
                        tool_args={"code": code},
                        prompt=template.format(input=row["input"], code=row["code"].rstrip()),
                        expected_answer=result.stdout.strip(),
                        # the python tool's observation text for this very run (PythonTool uses describe too)
                        observation=result.describe(),
                    )
                )
    return records


def instruction_prompt(row: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """(prompt, response, drop reason) from `{dialog_history, response}` or `{instruction, input, output}`."""
    if "dialog_history" in row:
        history = row.get("dialog_history")
        if not isinstance(history, list) or not history:
            return None, None, "empty dialog_history"
        if len(history) != 1 or not isinstance(history[0], dict) or history[0].get("role") != "user":
            return None, None, "dialog_history is not a single user turn (a record holds one prompt)"
        prompt, response = history[0].get("content"), row.get("response")
    elif "instruction" in row:
        prompt, response = row.get("instruction"), row.get("output")
        extra = row.get("input")
        if isinstance(prompt, str) and isinstance(extra, str) and extra.strip():
            prompt = f"{prompt.strip()}\n\n{extra.strip()}"
    else:
        return None, None, "neither {dialog_history, response} nor {instruction, input, output}"
    if not isinstance(prompt, str) or not prompt.strip():
        return None, None, "empty prompt"
    if not isinstance(response, str) or not response.strip():
        return None, None, "empty response"
    return prompt.strip(), response.strip(), None


def build_no_tool(rows: list[dict[str, Any]], target: int, opts: BuildOptions, stats: CategoryStats) -> list[Record]:
    records: list[Record] = []
    seen: set[str] = set()
    for row in _shuffled(rows, opts.seed, "no_tool"):
        stats.examined += 1
        prompt, response, reason = instruction_prompt(row)
        if reason is None and len(prompt or "") + len(response or "") > opts.max_prompt_chars:
            reason = f"prompt + response longer than {opts.max_prompt_chars} characters"
        record_id, key = _stable_id("chat", str(prompt)), same_request_key(str(prompt))
        if reason is None and key in seen:
            reason = "same prompt as an earlier row"
        if reason is not None:
            stats.drop(reason, row.get("_where", "?"))
            continue
        seen.add(key)
        stats.valid += 1
        if len(records) < target:
            records.append(
                Record(
                    id=record_id,
                    source=stats.source,
                    category="no_tool",
                    tool_needed=False,
                    tool=None,
                    tool_args=None,
                    prompt=str(prompt),
                    expected_answer=str(response),
                )
            )
    return records


def attach_observations(records: list[Record], tools: dict[str, Any]) -> None:
    """Run each call not yet run through the real tool, so the conversation shows exactly what it returns."""
    for record in records:
        if record.tool is None or record.observation is not None:
            continue
        observation = tools[record.tool].execute(dict(record.tool_args or {}))
        if observation.is_error:
            raise DataError(
                f"record '{record.id}': the {record.tool} tool failed on a checked call: {observation.text[:200]}"
            )
        record.observation = observation.text


def split_ids(ids: list[str], validation_fraction: float, seed: int) -> set[str]:
    """The ids going to validation: a seeded sample of `validation_fraction` of the distinct ids."""
    if not 0.0 <= validation_fraction < 1.0:
        raise DataError(f"validation_fraction {validation_fraction} must be in [0, 1)")
    distinct = sorted(set(ids))
    random.Random(f"{seed}:split").shuffle(distinct)
    n = round(len(distinct) * validation_fraction)
    return set(distinct[:n])


BUILD_FORMATS = ("hermes", "json")


def remove_other_formats(out: Path, formats: list[str]) -> list[str]:
    """Delete the split files an earlier build wrote in a format this build does not write; return their paths.

    Rebuilt with `--formats hermes` after `hermes,json`, the folder kept the old `json/` files beside the new
    records, summary and card: training on them used another selection and split (with another seed, validation
    lines of one build among the training lines of the other)."""
    removed = []
    for fmt in BUILD_FORMATS:
        if fmt in formats:
            continue
        for split in ("train", "validation"):
            path = out / fmt / f"{split}.jsonl"
            if path.is_file():
                path.unlink()
                removed.append(str(path))
        if (out / fmt).is_dir() and not any((out / fmt).iterdir()):
            (out / fmt).rmdir()
    return removed


def _source_name(source: str) -> str:
    """`gsm8k/train` for a local file (folder/stem: `train` alone says little), the id otherwise."""
    path = Path(source)
    if not path.suffix:
        return source
    return f"{path.parent.name}/{path.stem}" if path.parent.name else path.stem


def build_calc_python(opts: BuildOptions) -> dict[str, Any]:
    """Build the dataset into `opts.out`; returns the summary (also written as summary.json + README.md)."""
    bad_formats = [f for f in opts.formats if f not in BUILD_FORMATS]
    if bad_formats or not opts.formats:
        raise DataError(
            f"format(s) {', '.join(bad_formats) or '(none)'} cannot be written", hint="use hermes and/or json"
        )
    targets = category_targets(opts.size, opts.ratios)
    sources = {"calculator": opts.gsm8k, "python_exec": opts.cruxeval, "no_tool": opts.instructions}
    builders = {"calculator": build_calculator, "python_exec": build_python, "no_tool": build_no_tool}
    stats: dict[str, CategoryStats] = {}
    reports: dict[str, DatasetReport] = {}
    records: list[Record] = []
    for category in CATEGORIES:
        stats[category] = CategoryStats(source=_source_name(sources[category]), target=targets[category])
        if targets[category] == 0:
            continue
        rows, report = read_raw_records(sources[category], split=opts.split)
        reports[category] = report
        stats[category].available = len(rows)
        built = builders[category](rows, targets[category], opts, stats[category])
        stats[category].used = len(built)
        records.extend(built)

    # One seeded order over all categories: grouped by category, the first lines of a file (SFT's validation
    # samples, `eval --limit N`, a `head` of the data) would all be calculator items.
    random.Random(f"{opts.seed}:order").shuffle(records)
    tool_objects = calc_python_tools()
    attach_observations(records, tool_objects)
    tools = [tool_objects[name].schema() for name in ("calculator", "python")]

    validation: set[str] = set()  # each category gives its share, so validation keeps the ratios
    for category in CATEGORIES:
        validation |= split_ids([r.id for r in records if r.category == category], opts.validation_fraction, opts.seed)
    opts.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(
        opts.out / "records.jsonl",
        ({**r.to_dict(), "split": "validation" if r.id in validation else "train"} for r in records),
    )
    files: dict[str, dict[str, int]] = {}
    removed = remove_other_formats(opts.out, opts.formats)
    for fmt in opts.formats:
        for split in ("train", "validation"):
            examples = [
                record_to_example(r, tools, split=split)
                for r in records
                if (r.id in validation) == (split == "validation")
            ]
            if fmt != "hermes":  # hermes lines stay canonical (tool_calls); the chat template writes the tags
                examples = [example_to_format(e, fmt) for e in examples]
            else:
                examples = [{**e, "meta": {**e["meta"], "format": "hermes"}} for e in examples]
            path = opts.out / fmt / f"{split}.jsonl"
            files.setdefault(fmt, {})[split] = write_jsonl(path, examples)
    summary = {
        "options": {
            "size": opts.size,
            "ratios": opts.ratios,
            "validation_fraction": opts.validation_fraction,
            "seed": opts.seed,
            "formats": opts.formats,
            "max_expression_chars": opts.max_expression_chars,
            "sources": sources,
        },
        "categories": {c: s.to_dict() for c, s in stats.items()},
        "source_read_errors": {c: r.errors for c, r in reports.items() if r.errors},
        "records": len(records),
        "validation_records": len(validation),
        "files": files,
        "removed": removed,
    }
    (opts.out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (opts.out / "README.md").write_text(dataset_card(summary), encoding="utf-8")
    return summary


FORMAT_NOTES = {
    "hermes": "hermes lines are canonical `tool_calls`",
    "json": "json lines are the json format's text with the tools described in the system message",
}
HOW_MADE = {
    "calculator": "- **calculator** (GSM8K-style): every `<<expression=value>>` annotation is evaluated by the project "
    "calculator and must equal its value (up to the decimals shown); the annotation giving the `####` answer becomes "
    "one expression by substituting the expressions of the intermediate results it uses. Examined: all problems; "
    "the seeded shuffle picks which valid ones are used.",
    "python_exec": "- **python_exec** (CRUXEval-style): the call is the function plus `print(repr(f(<input>)))`; the "
    "expected answer is the sandbox's output, kept only when it equals the given output. Candidates are run in "
    "seeded order until the target is met (examined < available is expected).",
    "no_tool": "- **no_tool** (instruction data): single-turn prompts with their reference response; the calculator "
    "and python tools are still offered, so the model learns when not to call.",
}


def dataset_card(summary: dict[str, Any]) -> str:
    """A markdown card: what each category is built from, how much was used and dropped, and why."""
    o = summary["options"]
    lines = [
        "# Calculator / python / no-tool dataset",
        "",
        "Built by `toolschool dataset build-calc-python`. One conversation per JSON line "
        '(`{"messages", "tools", "meta"}`); `records.jsonl` holds the flat records '
        "(`id, source, category, tool_needed, tool, tool_args, prompt, expected_answer, observation, split`).",
        "",
        f"- size {o['size']}, ratios {o['ratios']}, validation fraction {o['validation_fraction']}, seed {o['seed']}",
        f"- formats: {', '.join(o['formats'])} ({'; '.join(FORMAT_NOTES[f] for f in o['formats'])})",
        "",
        "| category | source | available | examined | valid | dropped | target | used |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for category, s in summary["categories"].items():
        lines.append(
            f"| {category} | {s['source']} | {s['available']} | {s['examined']} | {s['valid']} | {s['dropped']} "
            f"| {s['target']} | {s['used']} |"
        )
    if summary.get("source_read_errors"):
        lines += ["", "## Source lines that could not be read", ""]
        lines.append("Not JSON objects, so not counted as available:")
        lines.append("")
        for category, errors in summary["source_read_errors"].items():
            lines.append(f"- {category}: {len(errors)} (first at {errors[0]})")
    lines += ["", "## Why items were dropped", ""]
    for category, s in summary["categories"].items():
        if not s["dropped_by_reason"]:
            continue
        lines.append(f"**{category}**")
        lines.append("")
        for reason, count in s["dropped_by_reason"].items():
            lines.append(f"- {reason}: {count} (first at {s['first_dropped_at'][reason]})")
        lines.append("")
    used = [c for c, s in summary["categories"].items() if s["used"]]
    lines += ["## How examples are made", ""]
    lines += [HOW_MADE[c] for c in used]
    lines += ["", "## Sources", ""]
    lines += [f"- {c}: `{o['sources'][c]}` (its own license)" for c in used]
    lines.append("")
    return "\n".join(lines)
