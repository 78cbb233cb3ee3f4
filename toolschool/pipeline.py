"""The main job: explore -> distill -> sft -> rl -> eval -> report in one run directory.

Every stage writes into `runs/<name>/<stage>/` and, when it finishes, a `DONE.json` marker holding its
summary and duration. A finished stage is skipped on the next `toolschool run`; an interrupted one is
resumed (exploration continues after its last logged trial, training from its last checkpoint). `--from
STAGE` reruns from that stage: the earlier outputs of it and every later stage are moved aside to
`runs/<name>/.previous/<time>/`, never deleted. A finished stage whose settings (STAGE_SETTINGS) changed since it
ran is not skipped silently: the run is refused with the changed keys and a pointer to `--from`.

Each stage is a function of explicit inputs, `run_X(config, inputs, out_dir)`: this module (with `train.continual`
and the commands of `toolschool.cli`) is what knows the run folder's layout, and hands each stage what an earlier
one wrote there (`*_inputs` below: SFT and RL train on `distill/train.jsonl` unless the config names a file, RL
starts from the SFT stage's model, ...).

The eval stage compares the base model, the SFT model and the SFT+RL model on the held-out split of the
distilled data (`distill/validation.jsonl`, never trained on), executing the predicted calls so that the
final answers are scored too (`toolschool.evaluate.stage`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolschool.config import ToolschoolConfig, stage_path
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

if TYPE_CHECKING:
    from toolschool.data.distill.stage import DistillInputs
    from toolschool.evaluate.stage import EvalInputs
    from toolschool.train.common import TrainingInputs


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


# ------------------------------------------------------------------------------------------------ stage inputs
# What each stage takes from the run folder: the one place that maps the run's layout to a stage's inputs, for
# `toolschool run` and for a stage's own command (which passes `--out` and the config's files through it).


def distill_inputs(config: ToolschoolConfig) -> DistillInputs:
    """Distill's trial log: `[distill] trials`, else the run's explore/trials.jsonl."""
    from toolschool.data.distill.stage import DistillInputs

    return DistillInputs(
        Path(config.distill.trials).expanduser() if config.distill.trials else run_paths(config).trials
    )


def training_inputs(config: ToolschoolConfig, stage: str, *, start_model: str | None = None) -> TrainingInputs:
    """What SFT or RL (`stage`) trains: `start_model` (default `[model] name`) on `[STAGE] train`, else the run's
    distill/train.jsonl; validated on `[STAGE] validation`, else on the run's distill/validation.jsonl when it
    trains on the run's distill/train.jsonl and the split exists (a training file named explicitly gets no
    validation from the run's split: it may come from elsewhere)."""
    from toolschool.train.common import TrainingInputs

    section = getattr(config, stage)
    paths = run_paths(config)
    train = Path(section.train).expanduser() if section.train else paths.distill_train
    if section.validation:
        validation, optional = Path(section.validation).expanduser(), False
    else:
        split = paths.distill_validation
        validation, optional = (split if split.is_file() and not section.train else None), True
    return TrainingInputs(start_model or config.model.name, train, validation, optional)


def sft_model_dir(config: ToolschoolConfig) -> Path:
    return run_paths(config).model("sft")


def rl_model_dir(config: ToolschoolConfig) -> Path:
    return run_paths(config).model("rl")


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


def eval_inputs(config: ToolschoolConfig) -> EvalInputs:
    """The eval stage's models (`eval_models`) and held-out set: `[pipeline] eval_data` (which must name a non-empty
    file), the generated built-in toolbox test set for 'builtin' (leaving out the requests of the run's
    distill/train.jsonl), else the run's distill/validation.jsonl."""
    from toolschool.evaluate.stage import EvalInputs

    paths = run_paths(config)
    models = tuple(eval_models(config))
    data = config.pipeline.eval_data
    if data == BUILTIN_HELDOUT:
        return EvalInputs(models, None, trained_on=paths.distill_train)
    if data:
        path = Path(data)
        if not path.is_file() or not path.read_text(encoding="utf-8").strip():
            state = "is empty" if path.is_file() else "does not exist"
            raise ToolschoolError(
                f"[pipeline] eval_data = '{path}' {state}",
                hint="point it at a test JSONL of conversations, set it to 'builtin' for the generated built-in "
                "toolbox test set, or remove it to evaluate on the distill validation split",
            )
        return EvalInputs(models, path)
    return EvalInputs(models, paths.distill_validation)


# ------------------------------------------------------------------------------------------------ stages


def _stage_explore(config: ToolschoolConfig, console: Any) -> dict[str, Any]:
    from toolschool.explore.stage import ExploreInputs, run_explore_stage

    explorer = config.pipeline.explorer or config.model.name
    out_dir = stage_path(config, "explore")
    resume = run_paths(config).trials.is_file()
    result = run_explore_stage(config, ExploreInputs(explorer), out_dir, resume=resume, console=console)
    return {"explorer": explorer, "trials": result.summary.get("total", {}), "seconds_exploring": result.seconds}


def _stage_distill(config: ToolschoolConfig, console: Any) -> dict[str, Any]:
    from toolschool.data.distill.stage import run_distill_stage
    from toolschool.data.distill.summary import nothing_to_train

    out_dir = stage_path(config, "distill")
    summary = run_distill_stage(config, distill_inputs(config), out_dir, console=console)
    empty = nothing_to_train(summary)  # which step kept nothing: the rules, or a judge that kept none
    if empty is not None:
        raise ToolschoolError(f"{empty[0]} (see {out_dir / 'README.md'})", hint=empty[1])
    return {"counts": summary.get("total", {})}


def _stage_sft(config: ToolschoolConfig, console: Any) -> dict[str, Any]:
    from toolschool.train.common import checkpoint_folders
    from toolschool.train.sft import run_sft

    out_dir = stage_path(config, "sft")  # run_sft saves the config
    inputs = training_inputs(config, "sft")
    result = run_sft(config, inputs, out_dir, resume=bool(checkpoint_folders(out_dir)))  # a killed stage resumes
    return {
        "steps": result.steps,
        "model": str(result.merged_dir) if result.merged_dir else None,
        "data": result.stats,
        "final_validation": result.final_validation,
        "precision": result.precision,
    }


def _stage_rl(config: ToolschoolConfig, console: Any) -> dict[str, Any]:
    from toolschool.train.common import checkpoint_folders
    from toolschool.train.rl import run_rl

    start = sft_model_dir(config)
    if not start.is_dir():
        raise _no_sft_model(start)
    out_dir = stage_path(config, "rl")  # run_rl saves the config
    inputs = training_inputs(config, "rl", start_model=str(start))
    result = run_rl(config, inputs, out_dir, resume=bool(checkpoint_folders(out_dir)))  # a killed stage resumes
    return {
        "steps": result.steps,
        "model": str(result.merged_dir) if result.merged_dir else None,
        "final_validation": result.final_validation,
        "groups_with_reward_spread": result.groups_with_reward_spread,
        "precision": result.precision,
    }


def _no_sft_model(start: Path) -> ToolschoolError:
    return ToolschoolError(
        f"the rl stage starts from the SFT stage's model, but {start} does not exist",
        hint='add "sft" to [pipeline] stages, or train RL from another model with `toolschool rl --model MODEL`',
    )


def _stage_eval(config: ToolschoolConfig, console: Any) -> dict[str, Any]:
    from toolschool.evaluate.stage import run_eval_stage

    return run_eval_stage(config, eval_inputs(config), stage_path(config, "eval"), console=console)


def _stage_report(config: ToolschoolConfig, console: Any) -> dict[str, Any]:
    from toolschool.evaluate.report import build_report

    path = build_report(config.run_dir(), stage_path(config, "report"))
    return {"html": str(path)}


STAGE_FUNCTIONS: dict[str, Callable[[ToolschoolConfig, Any], dict[str, Any]]] = {
    "explore": _stage_explore,
    "distill": _stage_distill,
    "sft": _stage_sft,
    "rl": _stage_rl,
    "eval": _stage_eval,
    "report": _stage_report,
}


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
        from toolschool.train.rl import check_settings, check_train_file

        check_settings(config.rl, config.model.format, device=device, machine=device is not None)
        # a run, not `config show`: RL's data is there, or this run's distill writes it (the default
        # distill/train.jsonl); otherwise RL would stop only after SFT had trained
        if device is not None and (config.rl.train is not None or "distill" not in stages):
            check_train_file(training_inputs(config, "rl").train)
        if device is not None and "sft" not in stages and not sft_model_dir(config).is_dir():  # nor its start model
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
