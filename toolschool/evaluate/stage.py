"""The eval stage of `toolschool run`: the models it is handed compared on the held-out set it is handed (or on the
generated built-in toolbox test set), executing the predicted calls so that the final answers are scored too; the
final model evaluated both ways, with free and with grammar-constrained decoding (`[eval] constrained` picks the
mode of the other rows; the other mode's evaluation is in `eval/free/` or `eval/constrained/`), and the table's
`decoding` column says which row is which. `toolschool.pipeline` resolves its inputs from the run folder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolschool.config import ToolschoolConfig, save_config
from toolschool.errors import ToolschoolError

# Columns of the final table: (label, summary key). Rates are in [0, 1].
TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("well-formed %", "well_formed"),
    ("correct tool %", "correct_tool"),
    ("correct %", "correct"),
    ("answer accuracy %", "answer_accuracy"),
)


@dataclass(frozen=True)
class EvalInputs:
    """What the eval stage is handed: the (label, model) pairs it compares, in the table's order (`final_model`
    picks the one also evaluated the other way); the held-out JSONL, or None for the built-in toolbox test set,
    generated into the output folder; and the file the models trained on, if any, whose requests a generated test
    set leaves out (measuring only: never an item the run trained on)."""

    models: tuple[tuple[str, str], ...]
    heldout: Path | None
    trained_on: Path | None = None


def _training_queries(path: Path | None) -> list[str]:
    """The user requests of a training file (None, or a file that does not exist: none)."""
    from toolschool.data.dataset import load_dataset_jsonl
    from toolschool.evaluate.retrieval import first_user_text

    if path is None or not path.is_file():
        return []
    examples, _ = load_dataset_jsonl(path, on_error="stop")
    return [query for query in map(first_user_text, examples) if query]


def held_out(config: ToolschoolConfig, inputs: EvalInputs, registry: Any, out_dir: Path) -> Path:
    """The held-out JSONL: the file handed over, or the built-in toolbox test set generated into `out_dir`."""
    if inputs.heldout is None:
        from toolschool.data.heldout import builtin_heldout
        from toolschool.run_state import write_jsonl

        lines = builtin_heldout(
            registry,
            per_tool=config.pipeline.heldout_per_tool,
            no_tool=config.pipeline.heldout_no_tool,
            seed=config.run.seed,
            exclude=_training_queries(inputs.trained_on),  # measuring only: never an item the run trained on
        )
        if not lines:
            raise ToolschoolError(
                "eval_data = 'builtin' needs built-in tools in the tool set, and it has none",
                hint="add toolbox = ['builtin'] under [tools], or point [pipeline] eval_data at a test JSONL",
            )
        path = out_dir / "heldout.jsonl"
        write_jsonl(path, lines)
        return path
    path = inputs.heldout
    if not path.is_file() or not path.read_text(encoding="utf-8").strip():
        raise ToolschoolError(
            f"the held-out set {path} is missing or empty",
            hint="raise distill.validation_fraction or explore more, or set [pipeline] eval_data to a test JSONL "
            "(or to 'builtin' for the generated built-in toolbox test set)",
        )
    return path


def run_eval_stage(
    config: ToolschoolConfig, inputs: EvalInputs, out_dir: Path, *, console: Any = None
) -> dict[str, Any]:
    """Compare `inputs.models` on the held-out set with the config's [eval] settings into `out_dir` (its
    comparison.json and comparison.md: the table of `comparison_table`); returns the stage's summary."""
    from toolschool.evaluate.session import make_options, resolve_benchmarks, run_evaluation
    from toolschool.evaluate.toolkens import benchmarks_for_model, open_model_backend
    from toolschool.tools.registry import registry_for

    save_config(config, out_dir, "eval")
    settings = config.eval.model_dump()
    settings["format"] = config.model.format
    settings["execute"] = config.pipeline.execute
    settings["seed"] = config.run.seed
    models = list(inputs.models)
    registry = registry_for(config.tools)
    try:
        data = held_out(config, inputs, registry, out_dir)
        benchmarks = resolve_benchmarks([], str(data), config.eval.limit)
        options = make_options(settings, registry=registry)
        names = [model for _, model in models]
        eval_settings = {**settings, "data": str(data), "labels": dict((m, label) for label, m in models)}

        def restart(problem: str) -> None:
            if console is not None:
                console.print(f"eval: {problem}; starting the evaluation over", markup=False, highlight=False)

        with _eval_progress(console) as bar:

            def progress(label: str, count: int) -> Callable[[Any], None] | None:
                if bar is None:
                    return None
                model, _, bench = label.partition(" · ")  # a bar per model, named as in the table
                task = bar.add_task(f"{eval_settings['labels'].get(model, model)} · {bench}", total=count)
                return lambda _result: bar.advance(task)

            # An eval stage killed part-way keeps the items it scored, unless they were scored otherwise.
            summary = run_evaluation(
                names,
                benchmarks,
                options,
                out_dir,
                make_backend=lambda m: open_model_backend(m, dtype=config.model.dtype, device=config.model.device),
                settings=eval_settings,
                progress=progress,
                resume=True,
                on_resume_problem=restart,
                benchmarks_for=benchmarks_for_model,  # a toolken SFT model sees its <tool_NAME> names, as `eval` does
            )
        # the final model the other way too (constrained vs free decoding), so the table shows what constraints change
        both_ways = _evaluate_other_decoding(config, models, benchmarks, eval_settings, registry, out_dir, restart)
    finally:
        registry.close()
    table = comparison_table(summary, models)
    if both_ways is not None:
        table += comparison_table(*both_ways)
    (out_dir / "comparison.json").write_text(json.dumps(table, indent=2), encoding="utf-8")
    (out_dir / "comparison.md").write_text(
        comparison_markdown(table, arguments=config.eval.arguments), encoding="utf-8"
    )
    return {"data": str(data), "items": len(benchmarks[0].items), "table": table}


def final_model(models: list[tuple[str, str]]) -> tuple[str, str]:
    """The (label, model) the run ends with: the last trained one (sft+rl, else sft), else the base model."""
    trained = [pair for pair in models if pair[0] in ("sft+rl", "sft")]
    return trained[-1] if trained else models[0]


def _evaluate_other_decoding(
    config: ToolschoolConfig,
    models: list[tuple[str, str]],
    benchmarks: list[Any],
    settings: dict[str, Any],
    registry: Any,
    out_dir: Path,
    restart: Callable[[str], None],
) -> tuple[dict[str, Any], list[tuple[str, str]]] | None:
    """The final model evaluated with the other decoding (constrained when [eval] constrained is false, free when
    true) into eval/<mode>/: (its summary, its (label, model)) for the comparison; None for a model the local
    backend does not run (an endpoint cannot constrain), and for constraining a toolken model (it writes its calls
    as `<tool_NAME>` tokens, which the formats' grammars do not describe)."""
    from toolschool.evaluate.session import make_options, run_evaluation
    from toolschool.evaluate.toolkens import benchmarks_for_model, model_toolkens, open_model_backend
    from toolschool.models.spec import parse_model_spec

    label, model = final_model(models)
    if parse_model_spec(model).kind == "openai" or (not config.eval.constrained and model_toolkens(model)):
        return None
    other = {**settings, "constrained": not config.eval.constrained, "labels": {model: label}}
    options = make_options(other, registry=registry)
    summary = run_evaluation(
        [model],
        benchmarks,
        options,
        out_dir / options.decoding,
        make_backend=lambda m: open_model_backend(m, dtype=config.model.dtype, device=config.model.device),
        settings=other,
        resume=True,
        on_resume_problem=restart,
        benchmarks_for=benchmarks_for_model,
    )
    return summary, [(label, model)]


def _eval_progress(console: Any) -> AbstractContextManager[Any]:
    """The eval stage's progress bars on the run's console, as `toolschool eval` shows them (it scores every held-out
    item with each model: minutes on a CPU, with nothing on the screen before); none without a console."""
    if console is None:
        return nullcontext()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=console)


def comparison_table(summary: dict[str, Any], models: list[tuple[str, str]]) -> list[dict[str, Any]]:
    rows = []
    for label, model in models:
        block = summary["models"].get(model, {}).get("data", {})
        overall = block.get("overall", block)
        row: dict[str, Any] = {
            "model": label,
            "decoding": str(block.get("decoding") or "free"),
            "path": model,
            "n": int(overall.get("n", 0)),
        }
        for column, key in TABLE_COLUMNS:
            value = overall.get(key)
            row[column] = None if value is None else round(100 * float(value), 1)
        # correct % per category of the held-out set (a tool's name, or a no-tool kind)
        row["correct % by category"] = {
            category: round(100 * float(scores.get("correct", 0.0)), 1)
            for category, scores in sorted(block.get("by_category", {}).items())
        }
        rows.append(row)
    return rows


ARGUMENT_RULES = {
    "exact": "equal values after normalisation",
    "semantic": "equal, or the same call by the metrics' semantic rules: a calculator expression of the same value, "
    "one unit however it is named, a program printing the same",
}


def comparison_markdown(table: list[dict[str, Any]], *, arguments: str = "exact") -> str:
    header = ["model", "decoding", *(c for c, _ in TABLE_COLUMNS), "items"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    for row in table:
        values = ("—" if row[c] is None else f"{row[c]:.1f}" for c, _ in TABLE_COLUMNS)
        cells = [row["model"], row.get("decoding", "free"), *values, str(row["n"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"correct: the right tool with arguments matching the gold call's ({arguments}: {ARGUMENT_RULES[arguments]}).",
    ]
    categories = sorted({c for row in table for c in row.get("correct % by category", {})})
    if categories:
        lines += ["", "correct % by category:", ""]
        lines += [
            "| model | decoding | " + " | ".join(categories) + " |",
            "|" + "|".join(["---"] * (len(categories) + 2)) + "|",
        ]
        for row in table:
            by = row.get("correct % by category", {})
            cells = [
                row["model"],
                row.get("decoding", "free"),
                *("—" if c not in by else f"{by[c]:.1f}" for c in categories),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
