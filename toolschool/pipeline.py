"""The main job: explore -> distill -> sft -> rl -> eval -> report in one run directory.

Every stage writes into `runs/<name>/<stage>/` and, when it finishes, a `DONE.json` marker holding its
summary and duration. A finished stage is skipped on the next `toolschool run`; an interrupted one is
resumed (exploration continues after its last logged trial, training from its last checkpoint). `--from
STAGE` reruns from that stage: the earlier outputs of it and every later stage are moved aside to
`runs/<name>/.previous/<time>/`, never deleted. A finished stage whose settings (STAGE_SETTINGS) changed since it
ran is not skipped silently: the run is refused with the changed keys and a pointer to `--from`.

The eval stage compares the base model, the SFT model and the SFT+RL model on the held-out split of the
distilled data (`distill/validation.jsonl`, never trained on), executing the predicted calls so that the
final answers are scored too; the final model is evaluated both ways, with free and with grammar-constrained
decoding (`[eval] constrained` picks the mode of the other rows; the other mode's evaluation is in
`eval/free/` or `eval/constrained/`), and the table's `decoding` column says which row is which.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolschool.config import ToolschoolConfig, stage_dir, stage_path
from toolschool.errors import ConfigError, ModelLoadError, ResumeRefused, ToolschoolError
from toolschool.run_state import (
    MARKER_FILE,
    STAGES,
    RunPaths,
    check_resume,
    folder_lock,
    marker_state,
    read_marker,
    run_paths,
    stage_settings,
    write_json,
)

# Columns of the final table: (label, summary key). Rates are in [0, 1].
TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("well-formed %", "well_formed"),
    ("correct tool %", "correct_tool"),
    ("correct %", "correct"),
    ("answer accuracy %", "answer_accuracy"),
)


@dataclass
class StageOutcome:
    stage: str
    status: str  # "done" (ran now), "skipped" (already done), "disabled"
    seconds: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class PipelineResult:
    run_dir: Path
    outcomes: list[StageOutcome]
    table: list[dict[str, Any]]
    report: Path | None


def enabled_stages(config: ToolschoolConfig) -> list[str]:
    wanted = list(config.pipeline.stages)
    unknown = [s for s in wanted if s not in STAGES]
    if unknown:
        raise ConfigError(
            f"pipeline.stages: unknown stage(s) {', '.join(unknown)}", hint=f"choose from: {', '.join(STAGES)}"
        )
    return [s for s in STAGES if s in wanted]


def is_done(config: ToolschoolConfig, stage: str) -> bool:
    return read_marker(run_paths(config).marker(stage)) is not None


def refuse_finished_stage(directory: Path, stage: str) -> None:
    """Refuse a standalone `toolschool distill` / `eval` into a finished stage of `toolschool run`: it would replace
    the outputs the run's later stages were made from (or its report shows) while the marker still says done."""
    if (directory / MARKER_FILE).is_file():
        raise ToolschoolError(
            f"'{directory}' holds a finished stage of `toolschool run` ({MARKER_FILE}): writing into it would replace "
            "what the run's later stages and report were made from",
            hint=f"rerun it with `toolschool run CONFIG --from {stage}` (its and the later stages' outputs move to "
            ".previous/), or pass --out another folder",
        )


def move_aside(config: ToolschoolConfig, from_stage: str) -> list[Path]:
    """Move the outputs of `from_stage` and every later stage to runs/<name>/.previous/<time>/."""
    from toolschool.run_state import move_aside as move

    if from_stage not in STAGES:
        raise ConfigError(f"--from {from_stage}: unknown stage", hint=f"choose from: {', '.join(STAGES)}")
    return move(config.run_dir(), STAGES[STAGES.index(from_stage) :])


def check_finished_stage(config: ToolschoolConfig, stage: str) -> list[str]:
    """Whether a finished stage may be kept under this config (`run_state.check_resume`): its refusal when a setting
    its outputs depend on changed since it ran, else the continuable changes it continues with (`key: old → new`)."""
    saved = (read_marker(run_paths(config).marker(stage)) or {}).get("settings")
    if not isinstance(saved, dict):  # a marker holding no settings: nothing to compare
        return []
    changed = check_resume(
        f"stage '{stage}' of {config.run_dir()}",
        marker_state(stage, saved),
        marker_state(stage, stage_settings(config, stage)),
        stage=stage,
        keep="those settings put back",
        fresh=f"rerun from it with --from {stage} (its outputs and the later stages' move to .previous/)",
    )
    return [str(change) for change in changed]


def reopen_continuable(config: ToolschoolConfig, stages: list[str], console: Any = None) -> None:
    """A finished stage whose changed settings are all continuable is not finished any more: it continues where it
    stopped (and the stages after it, stale then, run again)."""
    for stage in stages:
        try:
            changed = check_finished_stage(config, stage) if is_done(config, stage) else []
        except ResumeRefused:  # refused when kept (check_finished_settings), unless a stale stage before it reruns
            continue
        if changed:
            run_paths(config).marker(stage).unlink()
            if console is not None:
                console.print(
                    f"{stage} continues with {'; '.join(changed)} (what it wrote is kept; the later stages run again)",
                    markup=False,
                    highlight=False,
                )


def check_finished_settings(config: ToolschoolConfig, stages: list[str]) -> None:
    """Refuse to skip a finished stage whose settings changed since it ran (its outputs would not match them)."""
    for stage in stages:
        check_finished_stage(config, stage)


def check_explored_tools(config: ToolschoolConfig, stages: list[str]) -> None:
    """Refuse to skip a finished exploration of a tool whose schema was edited since (a user changed a function's
    signature or docstring): its trials hold calls to the old tool, and training on them teaches the old one."""
    if "explore" not in stages or not is_done(config, "explore"):
        return
    from toolschool.explore.log import read_trials
    from toolschool.explore.runner import schema_state
    from toolschool.tools.registry import registry_for

    trials = run_paths(config).trials
    records = read_trials(trials)[:1] if trials.is_file() else []
    if not records:
        return
    with registry_for(config.tools) as registry:
        saved, now = schema_state(records[0], registry.schemas())
    check_resume(
        f"stage 'explore' of {config.run_dir()}",
        saved,
        now,
        keep="the tools as they were",
        fresh="rerun from it with --from explore (its outputs and the later stages' move to .previous/)",
    )


def _write_marker(config: ToolschoolConfig, stage: str, seconds: float, summary: dict[str, Any]) -> None:
    record = {
        "stage": stage,
        "seconds": round(seconds, 1),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **summary,
        "settings": stage_settings(config, stage),
    }
    write_json(run_paths(config).marker(stage), record)  # killed while writing: no half a marker


def _with(config: ToolschoolConfig, **sections: dict[str, Any]) -> ToolschoolConfig:
    """A copy of the config with some fields of some sections replaced (validated)."""
    data = config.model_dump()
    for section, values in sections.items():
        data[section].update(values)
    return ToolschoolConfig.model_validate(data)


def sft_model_dir(config: ToolschoolConfig) -> Path:
    return run_paths(config).model("sft")


def rl_model_dir(config: ToolschoolConfig) -> Path:
    return run_paths(config).model("rl")


# ------------------------------------------------------------------------------------------------ stages


def _stage_explore(config: ToolschoolConfig, console: Any) -> dict[str, Any]:
    from toolschool.explore.stage import run_explore_stage

    explorer = config.pipeline.explorer or config.model.name
    explore_config = _with(config, model={"name": explorer})
    resume = run_paths(config).trials.is_file()
    result = run_explore_stage(explore_config, resume=resume, console=console)
    return {"explorer": explorer, "trials": result.summary.get("total", {}), "seconds_exploring": result.seconds}


def _stage_distill(config: ToolschoolConfig, console: Any) -> dict[str, Any]:
    from toolschool.data.distill.stage import run_distill_stage
    from toolschool.data.distill.summary import nothing_to_train

    out_dir, summary = run_distill_stage(config, console=console)
    empty = nothing_to_train(summary)  # which step kept nothing: the rules, or a judge that kept none
    if empty is not None:
        raise ToolschoolError(f"{empty[0]} (see {out_dir / 'README.md'})", hint=empty[1])
    return {"counts": summary.get("total", {})}


def _stage_sft(config: ToolschoolConfig, console: Any) -> dict[str, Any]:
    from toolschool.train.common import checkpoint_folders
    from toolschool.train.sft import run_sft

    out_dir = stage_path(config, "sft")  # run_sft saves the config
    result = run_sft(config, out_dir, resume=bool(checkpoint_folders(out_dir)))  # a killed stage resumes
    return {
        "steps": result.steps,
        "model": str(result.merged_dir) if result.merged_dir else None,
        "data": result.stats,
        "final_validation": result.final_validation,
    }


def _stage_rl(config: ToolschoolConfig, console: Any) -> dict[str, Any]:
    from toolschool.train.common import checkpoint_folders
    from toolschool.train.rl import run_rl

    start = sft_model_dir(config)
    if not start.is_dir():
        raise _no_sft_model(start)
    rl_config = _with(config, model={"name": str(start)})
    out_dir = stage_path(rl_config, "rl")  # run_rl saves the config
    result = run_rl(rl_config, out_dir, resume=bool(checkpoint_folders(out_dir)))  # a killed stage resumes
    return {
        "steps": result.steps,
        "model": str(result.merged_dir) if result.merged_dir else None,
        "final_validation": result.final_validation,
        "groups_with_reward_spread": result.groups_with_reward_spread,
    }


def _no_sft_model(start: Path) -> ToolschoolError:
    return ToolschoolError(
        f"the rl stage starts from the SFT stage's model, but {start} does not exist",
        hint='add "sft" to [pipeline] stages, or train RL from another model with `toolschool rl --model MODEL`',
    )


def eval_models(config: ToolschoolConfig) -> list[tuple[str, str]]:
    """(label, model) pairs compared by the eval stage: the base model, each trained model present, and the explorer
    zero-shot as the reference the student should reach (STE: the student fine-tuned on the explorer's trials)."""
    models = [("base", config.model.name)]
    if "sft" in config.pipeline.stages and sft_model_dir(config).is_dir():
        models.append(("sft", str(sft_model_dir(config))))
    if "rl" in config.pipeline.stages and rl_model_dir(config).is_dir():
        models.append(("sft+rl", str(rl_model_dir(config))))
    explorer = config.pipeline.explorer
    if config.pipeline.compare_explorer and explorer and explorer != config.model.name:
        models.append(("explorer (reference)", explorer))
    return models


BUILTIN_HELDOUT = "builtin"


def _training_queries(config: ToolschoolConfig) -> list[str]:
    """The user requests of the run's training data (distill/train.jsonl), if it has any."""
    from toolschool.data.dataset import load_dataset_jsonl
    from toolschool.evaluate.retrieval import first_user_text

    path = run_paths(config).distill_train
    if not path.is_file():
        return []
    examples, _ = load_dataset_jsonl(path, on_error="stop")
    return [query for query in map(first_user_text, examples) if query]


def _held_out(config: ToolschoolConfig, registry: Any, out_dir: Path) -> Path:
    """The held-out JSONL: the distill validation split, a file, or the generated built-in toolbox test set."""
    if config.pipeline.eval_data == BUILTIN_HELDOUT:
        from toolschool.data.heldout import builtin_heldout
        from toolschool.run_state import write_jsonl

        lines = builtin_heldout(
            registry,
            per_tool=config.pipeline.heldout_per_tool,
            no_tool=config.pipeline.heldout_no_tool,
            seed=config.run.seed,
            exclude=_training_queries(config),  # measuring only: never an item the run trained on
        )
        if not lines:
            raise ToolschoolError(
                "eval_data = 'builtin' needs built-in tools in the tool set, and it has none",
                hint="add toolbox = ['builtin'] under [tools], or point [pipeline] eval_data at a test JSONL",
            )
        path = out_dir / "heldout.jsonl"
        write_jsonl(path, lines)
        return path
    if config.pipeline.eval_data:
        path = Path(config.pipeline.eval_data)
        if not path.is_file() or not path.read_text(encoding="utf-8").strip():
            state = "is empty" if path.is_file() else "does not exist"
            raise ToolschoolError(
                f"[pipeline] eval_data = '{path}' {state}",
                hint="point it at a test JSONL of conversations, set it to 'builtin' for the generated built-in "
                "toolbox test set, or remove it to evaluate on the distill validation split",
            )
        return path
    path = run_paths(config).distill_validation
    if not path.is_file() or not path.read_text(encoding="utf-8").strip():
        raise ToolschoolError(
            f"the held-out set {path} is missing or empty",
            hint="raise distill.validation_fraction or explore more, or set [pipeline] eval_data to a test JSONL "
            "(or to 'builtin' for the generated built-in toolbox test set)",
        )
    return path


def _stage_eval(config: ToolschoolConfig, console: Any) -> dict[str, Any]:
    from toolschool.evaluate.session import make_options, resolve_benchmarks, run_evaluation
    from toolschool.evaluate.toolkens import benchmarks_for_model, open_model_backend
    from toolschool.tools.registry import registry_for

    out_dir = stage_dir(config, "eval")
    settings = config.eval.model_dump()
    settings["format"] = config.model.format
    settings["execute"] = config.pipeline.execute
    settings["seed"] = config.run.seed
    models = eval_models(config)
    registry = registry_for(config.tools)
    try:
        data = _held_out(config, registry, out_dir)
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


def _stage_report(config: ToolschoolConfig, console: Any) -> dict[str, Any]:
    from toolschool.evaluate.report import build_report

    path = build_report(config.run_dir())
    return {"html": str(path)}


STAGE_FUNCTIONS: dict[str, Callable[[ToolschoolConfig, Any], dict[str, Any]]] = {
    "explore": _stage_explore,
    "distill": _stage_distill,
    "sft": _stage_sft,
    "rl": _stage_rl,
    "eval": _stage_eval,
    "report": _stage_report,
}


# ------------------------------------------------------------------------------------------------ table


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


# ------------------------------------------------------------------------------------------------ driver


# Input files each stage reads when a key names one: (stage, section, key, what it must be).
INPUT_FILES: tuple[tuple[str, str, str, str], ...] = (
    ("explore", "explore", "prompts", "folder"),
    ("distill", "distill", "trials", "file"),
    ("sft", "sft", "train", "file"),
    ("sft", "sft", "validation", "file"),
    ("rl", "rl", "train", "file"),
    ("rl", "rl", "validation", "file"),
    ("eval", "pipeline", "eval_data", "file"),
    ("eval", "eval", "demos", "file"),
)


def check_input_files(config: ToolschoolConfig, stages: list[str]) -> None:
    """The files and folders the TOML names for the stages in `stages` exist, checked before the first stage runs:
    otherwise `[pipeline] eval_data` naming no file is found when the eval stage starts, after exploring, distilling
    and training. A path inside the run folder is left to the stage (an earlier stage of the run may write it)."""
    run_dir = config.run_dir().resolve()
    for stage, section, key, kind in INPUT_FILES:
        value = getattr(getattr(config, section), key)
        if stage not in stages or value is None or (section, key, value) == ("pipeline", "eval_data", "builtin"):
            continue
        path = Path(value).expanduser()
        if path.resolve().is_relative_to(run_dir):
            continue
        if not (path.is_dir() if kind == "folder" else path.is_file()):
            state = f"is not a {kind}" if path.exists() else "does not exist"
            raise ConfigError(
                f"[{section}] {key} = '{value}' {state}", hint=f"point it at an existing {kind}, or unset it"
            )
    _check_models(config, stages)
    if "eval" in stages and config.eval.icl and not config.eval.demos:
        raise ConfigError(
            f"[eval] icl = {config.eval.icl} needs [eval] demos",
            hint="set [eval] demos to a training JSONL to retrieve demonstrations from, or icl = 0",
        )


def _check_models(config: ToolschoolConfig, stages: list[str]) -> None:
    """Every model the stages in `stages` will load can be found: a model spec that is no folder, embedded name, hub
    id or endpoint, a folder holding no model, or a hub id neither cached nor reachable, is refused now (with an
    endpoint exploring, a mistyped `[model] name` folder surfaced only when SFT loaded it). Nothing is loaded or
    downloaded here."""
    from toolschool.models.loading import resolve_chain
    from toolschool.models.spec import parse_model_spec

    student = ("model", "name", config.model.name)
    wanted = {
        "explore": [("pipeline", "explorer", config.pipeline.explorer) if config.pipeline.explorer else student],
        "distill": [
            ("distill", "judge_model", config.distill.judge_model),
            ("distill", "paraphrase_model", config.distill.paraphrase_model),
        ],
        "sft": [student],
        "rl": [("rl", "ref_model", config.rl.ref_model)],
        "eval": [student],
    }
    for stage in stages:
        for section, key, value in wanted.get(stage, []):
            if value is None:
                continue
            try:
                spec = parse_model_spec(value)
                if spec.kind in ("local", "hub"):
                    # a folder holding a model (or an adapter naming a base that exists); a hub id cached or reachable
                    resolve_chain(spec)
            except ModelLoadError as exc:
                raise ConfigError(f"[{section}] {key} = '{value}': {exc.message}", hint=exc.hint) from None


def check_stage_settings(config: ToolschoolConfig, stages: list[str], *, device: str | None = None) -> None:
    """What the training stages refuse when they start, checked before the first stage runs: a bad [rl] or [sft]
    setting would otherwise surface after exploration and distillation (hours on a CPU). `device=None` leaves
    out what depends on this machine (`toolschool config show`)."""
    check_input_files(config, stages)
    if "sft" in stages:
        from toolschool.train.common import check_scheduler
        from toolschool.train.sft import resolve_batching

        resolve_batching(config.sft)
        check_scheduler(config.sft.lr_scheduler, "sft")
    if "rl" in stages:
        from toolschool.train.rl import check_settings, check_train_data

        check_settings(config.rl, config.model.format, device=device, machine=device is not None)
        if device is not None:  # a run, not `config show`: RL's data is there, or this run's distill writes it
            check_train_data(config, distill_runs_first="distill" in stages)
            if "sft" not in stages and not sft_model_dir(config).is_dir():  # nor its start model
                raise _no_sft_model(sft_model_dir(config))


def run_pipeline(
    config: ToolschoolConfig,
    *,
    from_stage: str | None = None,
    console: Any = None,
    on_stage: Callable[[str, str], None] | None = None,
) -> PipelineResult:
    """Run every enabled stage in order, skipping finished ones; returns the comparison table and report path.

    The run folder stays locked while this runs: a second `toolschool run` of it would skip what the first
    finished and train, evaluate and move aside the same stages in the same folders at the same time.
    """
    from toolschool.models.device import resolve_device

    stages = enabled_stages(config)
    check_stage_settings(config, stages, device=resolve_device(config.model.device))
    with folder_lock(
        config.run_dir(),
        ToolschoolError(
            f"the run folder {config.run_dir()} is in use by another running `toolschool run`",
            hint="wait for it to finish (or stop it: a rerun then continues where it stopped), "
            "or use another run name (--run)",
        ),
    ):
        return _run_stages(config, stages, from_stage, console, on_stage)


def stale_after(config: ToolschoolConfig, stages: list[str]) -> str | None:
    """The first stage whose outputs are stale: the one after the first unfinished stage of `stages` when a later
    one of them is finished (its folder or marker was deleted, or it was enabled after later stages ran). That
    stage runs again, so what the later ones made from its old outputs no longer follows from it."""
    unfinished = next((s for s in stages if not is_done(config, s)), None)
    if unfinished is None:
        return None
    position = STAGES.index(unfinished)
    if any(is_done(config, s) for s in stages if STAGES.index(s) > position):
        return STAGES[position + 1]
    return None


def _run_stages(
    config: ToolschoolConfig,
    stages: list[str],
    from_stage: str | None,
    console: Any,
    on_stage: Callable[[str, str], None] | None,
) -> PipelineResult:
    run_dir = config.run_dir()
    kept = stages  # the finished stages this run may skip: their settings must not have changed
    if from_stage in STAGES:
        kept = [s for s in stages if STAGES.index(s) < STAGES.index(from_stage)]
    reopen_continuable(config, kept, console)
    stale = stale_after(config, kept)
    if stale is not None:
        kept = [s for s in kept if STAGES.index(s) < STAGES.index(stale)]
    check_finished_settings(config, kept)
    check_explored_tools(config, kept)
    if stale is None and from_stage is not None:
        move_aside(config, from_stage)
    if stale is not None:  # it is never after from_stage: this moves what --from would too
        moved = move_aside(config, stale)
        unfinished = STAGES[STAGES.index(stale) - 1]
        if moved and console is not None:
            console.print(
                f"{unfinished} is not finished, so the finished later stage(s) "
                f"{', '.join(p.name for p in moved)} run again after it (their outputs moved to {moved[0].parent})",
                markup=False,
                highlight=False,
            )
    RunPaths(run_dir).config.write_text(_dump(config), encoding="utf-8")
    outcomes: list[StageOutcome] = []
    for stage in STAGES:
        if stage not in stages:
            outcomes.append(StageOutcome(stage, "disabled"))
            continue
        saved = read_marker(run_paths(config).marker(stage))
        if saved is not None:
            outcomes.append(StageOutcome(stage, "skipped", saved.get("seconds", 0.0), saved))
            if on_stage:
                on_stage(stage, "skipped")
            continue
        if on_stage:
            on_stage(stage, "start")
        started = time.perf_counter()
        try:
            summary = STAGE_FUNCTIONS[stage](config, console)
        except ResumeRefused as exc:  # its hint offers a new --out folder, which `toolschool run` has not
            exc.hint = (
                f"rerun with {exc.keep}, or start the {stage} stage over with --from {stage} (what it wrote so far "
                "and the later stages' outputs move to .previous/)"
            )
            raise
        seconds = time.perf_counter() - started
        _write_marker(config, stage, seconds, summary)
        outcomes.append(StageOutcome(stage, "done", seconds, summary))
        if on_stage:
            on_stage(stage, "done")
    table: list[dict[str, Any]] = []
    paths = RunPaths(run_dir)
    if paths.comparison.is_file():
        table = json.loads(paths.comparison.read_text(encoding="utf-8"))
    report = paths.report
    return PipelineResult(run_dir, outcomes, table, report if report.is_file() else None)


def _dump(config: ToolschoolConfig) -> str:
    from toolschool.config import dump_toml

    return dump_toml(config)
