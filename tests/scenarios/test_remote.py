"""Scenario: stages pointed at an OpenAI-compatible endpoint (vLLM in production, `toolschool serve` here) must
behave as on the local backend; and the run report must say truly and readably what the run's files hold."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from helpers import CALC

from toolschool.engine.backends import make_backend
from toolschool.engine.local_backend import LocalBackend
from toolschool.models.backend import ContextLengthError, GenerationRequest, SamplingParams
from toolschool.serve.server import running_app, running_server


@pytest.fixture(scope="module")
def local(tiny_model_dir: Path):
    backend = make_backend(str(tiny_model_dir), dtype="fp32", max_batch_size=8)
    yield backend
    asyncio.run(backend.aclose())


@pytest.fixture(scope="module")
def url(local: LocalBackend):
    with running_server(local, "tiny") as base_url:
        yield base_url


def _long_request(local: LocalBackend, *, room: int, max_tokens: int, cap: bool = True) -> GenerationRequest:
    """A calculator question padded so that the prompt leaves `room` positions of the model's context."""
    words = 1
    while True:
        request = GenerationRequest(
            [{"role": "user", "content": "x " * words + "What is 12*7?"}],
            [CALC],
            SamplingParams(max_tokens=max_tokens, cap_max_tokens=cap),
        )
        left = local.max_positions - len(local.render_prompt(request))
        if left <= room:
            return request
        words += max(1, (left - room) // 2)


async def test_a_budget_past_the_context_is_lowered_over_http_as_on_the_local_backend(
    url: str, local: LocalBackend
) -> None:
    """Every stage's max_tokens is an upper bound: the local backend lowers it to the room the prompt leaves. vLLM
    (and toolschool serve) refuse a request whose max_tokens does not fit, so an eval item or an exploration turn
    near the context's end was a `context_full` failure on an endpoint and a reply locally."""
    request = _long_request(local, room=12, max_tokens=64)
    (direct,) = await local.generate(request)
    http = make_backend(f"openai:{url}#tiny")
    try:
        (remote,) = await http.generate(request)
        strict = _long_request(local, room=12, max_tokens=64, cap=False)
        with pytest.raises(ContextLengthError) as refused:  # a budget the caller needs whole is still refused
            await http.generate(strict)
    finally:
        await http.aclose()
    assert direct.finish_reason == "length" and 0 < direct.num_tokens <= 12
    assert (remote.text, remote.finish_reason, remote.num_tokens) == (
        direct.text,
        direct.finish_reason,
        direct.num_tokens,
    )
    assert refused.value.param == "max_tokens"


@pytest.mark.parametrize(
    ("message", "room"),
    [
        # vLLM 0.6 - 0.11 (and toolschool serve)
        (
            "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is "
            "4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None",
            1318,
        ),
        # vLLM's newer renderer
        (
            "This model's maximum context length is 128000 tokens. However, you requested 65535 output tokens "
            "and your prompt contains at least 62466 input tokens, for a total of at least 128001 tokens.",
            65534,
        ),
        # the OpenAI API and older vLLM
        (
            "This model's maximum context length is 4096 tokens. However, you requested 4726 tokens (3726 in the "
            "messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            370,
        ),
        # the prompt alone is too long: no room to lower the budget to
        (
            "This model's maximum context length is 1536 tokens. However, your request has 4176 input tokens. "
            "Please reduce the length of the input messages.",
            None,
        ),
    ],
)
def test_the_room_a_context_length_refusal_leaves_is_read_from_its_message(message: str, room: int | None) -> None:
    import httpx
    import openai

    from toolschool.models.openai_http import context_room

    response = httpx.Response(400, request=httpx.Request("POST", "http://127.0.0.1/v1/chat/completions"))
    error = openai.BadRequestError("refused", response=response, body={"message": message, "code": 400})
    assert context_room(error) == room


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------------ the report


def _pipeline_run(tmp_path: Path) -> Path:
    """A run folder as `toolschool run` leaves it: the eval stage's summary (models by path, the run's labels for
    them, the held-out file) and, after `--from eval`, the previous eval moved aside to .previous/TIME/."""
    run = tmp_path / "runs" / "demo"
    models = {"smollm2-135m": "base", "runs/demo/sft/merged": "sft", "runs/demo/rl/merged": "sft+rl"}
    rates = {"n": 4.0, "well_formed": 1.0, "correct": 0.25, "correct_tool": 0.5, "answer_accuracy": 0.25}
    block = {"overall": rates, "by_category": {}, "per_tool": {"calculator": {"n": 4.0, "accuracy": 0.25}}}
    settings = {"data": "runs/demo/eval/heldout.jsonl", "format": "hermes", "execute": True, "labels": models}
    summary = {"models": {model: {"data": block} for model in models}, "settings": settings}
    for folder in ("eval", ".previous/20261123-084848/eval"):
        (run / folder).mkdir(parents=True)
        (run / folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return run


def test_the_report_names_the_runs_models_by_their_role_and_the_data_they_were_scored_on(tmp_path: Path) -> None:
    """The eval stage compares base, sft and sft+rl on a held-out file and records both in its summary; the report
    showed only model paths and the benchmark name 'data', so which row is the trained model, and on what, was
    not readable from it."""
    from toolschool.evaluate.report import build_report

    run = _pipeline_run(tmp_path)
    markdown = (build_report(run).parent / "report.md").read_text(encoding="utf-8")
    assert "| data | all | base (smollm2-135m) | free | 4 |" in markdown
    assert "| data | all | sft+rl (runs/demo/rl/merged) | free | 4 |" in markdown
    assert "`runs/demo/eval/heldout.jsonl`" in markdown and "calls executed" in markdown


def test_outputs_a_rerun_moved_aside_are_not_reported_as_the_runs_results(tmp_path: Path) -> None:
    """`toolschool run --from STAGE` moves that stage's outputs to .previous/TIME/ because they no longer hold:
    the report plotted their eval beside the new one as if both were this run's models."""
    from toolschool.evaluate.report import build_report

    run = _pipeline_run(tmp_path)
    markdown = (build_report(run).parent / "report.md").read_text(encoding="utf-8")
    assert ".previous" not in markdown
    assert markdown.count("| data | all |") == 3


def test_the_reward_plot_shows_the_rewards_not_their_spread_nor_a_curve_twice() -> None:
    """The RL log holds each reward as `rewards/NAME` and TRL's `rewards/NAME/mean`, `/std`, `reward_std` and
    `frac_reward_zero_std`: all were drawn on the reward plot (15 lines for 4 rewards, the same curve twice,
    a fraction and standard deviations on the reward axis, colours repeating)."""
    from toolschool.evaluate.report import curve_groups

    record = {"step": 1, "reward": 1.5, "reward_std": 1.5, "frac_reward_zero_std": 0.5, "kl": 0.0}
    for name, value in (("format", 0.75), ("tool", 0.25)):
        record |= {f"rewards/{name}/mean": value, f"rewards/{name}/std": 0.5, f"rewards/{name}": value}
    assert set(curve_groups([record, {**record, "step": 2}])["reward"]) == {"reward", "rewards/format", "rewards/tool"}
    only_trl = {"step": 1, "reward": 1.0, "rewards/format/mean": 1.0, "rewards/format/std": 0.0}
    assert set(curve_groups([only_trl])["reward"]) == {"reward", "rewards/format/mean"}


# ------------------------------------------------------------------------------------------------ served names


def _explore_config(tmp_path: Path, model: str) -> Any:
    from toolschool.config import ToolschoolConfig

    return ToolschoolConfig.model_validate(
        {
            "run": {"name": "wrong-name", "root": str(tmp_path / "runs")},
            "model": {"name": model},
            "tools": {"toolbox": ["builtin"], "only": ["calculator", "weekday"]},
            "explore": {"episodes": 2, "stm_slots": 1, "max_turns": 1, "max_tokens": 8, "demonstrations": 0},
        }
    )


def test_an_explorer_name_the_endpoint_does_not_serve_stops_before_any_episode(url: str, tmp_path: Path) -> None:
    """vLLM answers a model it does not serve with 404. The endpoint check only warned when GET /models did not list
    the name (llama.cpp answers whatever name is sent), so every episode then failed on its own 404: a warning per
    episode, errors.jsonl, exit 1 and a summary titled 'exploration — None (None)', instead of one line before
    any work as for an unreachable endpoint."""
    from toolschool.explore.stage import ExploreInputs, run_explore_stage
    from toolschool.models.openai_http import EndpointError

    config = _explore_config(tmp_path, f"openai:{url}#wrong")
    with pytest.raises(EndpointError, match=r"has no model 'wrong' .*it serves: tiny"):
        run_explore_stage(config, ExploreInputs(config.model.name), tmp_path / "explore")
    assert not (tmp_path / "explore" / "errors.jsonl").exists()
    assert not (tmp_path / "explore" / "trials.jsonl").exists()  # a run that wrote no trial leaves no empty log


async def test_a_server_that_answers_any_model_name_is_not_refused_for_an_unlisted_one() -> None:
    """llama.cpp's server lists its model under its file name and answers whatever `model` a request sends."""
    app = FastAPI()
    asked: list[str] = []

    @app.get("/v1/models")
    async def models() -> Any:
        return {"object": "list", "data": [{"id": "models/qwen2.5-7b-q4_k_m.gguf", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        asked.append((await request.json())["model"])
        message = {"role": "assistant", "content": "hello"}
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }

    with running_app(app) as base_url:
        backend = make_backend(f"openai:{base_url}#qwen")
        try:
            await backend.check()
            (completion,) = await backend.generate(GenerationRequest([{"role": "user", "content": "hi"}]))
        finally:
            await backend.aclose()
    assert completion.text == "hello" and set(asked) == {"qwen"}


def test_a_continual_report_names_the_model_that_learned_and_the_steps_per_round(tmp_path: Path) -> None:
    """The forgetting matrix alone does not say which model learned the batches nor how long each round trained;
    matrix.json records both, and the report now states them."""
    from toolschool.evaluate.report import build_report
    from toolschool.train.forgetting import forgetting_summary, write_matrix

    run = tmp_path / "run"
    for name, replay in (("continual", True), ("continual_no_replay", False)):
        data = {
            "model": "smollm2-135m",
            "steps_per_round": 24,
            "batches": [["date_add"], ["calculator"]],
            "matrix": [[87.5, None], [50.0, 0.0]],
            "details": [[{"n": 16}, None], [{"n": 16}, {"n": 8}]],
            "replay": replay,
            "replay_ratio": 0.1 if replay else 0.0,
            "summary": forgetting_summary([[87.5, None], [50.0, 0.0]]),
        }
        (run / name).mkdir(parents=True)
        write_matrix(run / name, data)
    markdown = (build_report(run).parent / "report.md").read_text(encoding="utf-8")
    assert markdown.count("Starting model `smollm2-135m`, 24 SFT steps per round.") == 2


def test_a_training_run_without_an_evaluation_says_so(tmp_path: Path) -> None:
    """`toolschool run` with the eval stage left out (or not reached) reported the training curves alone, without a
    word on the missing comparison."""
    from toolschool.evaluate.report import build_report

    run = tmp_path / "run"
    (run / "sft").mkdir(parents=True)
    (run / "sft" / "train_log.jsonl").write_text(json.dumps({"step": 1, "loss": 1.5}) + "\n", encoding="utf-8")
    markdown = (build_report(run).parent / "report.md").read_text(encoding="utf-8")
    assert "## Evaluation\n\nNo evaluation in this run (no eval `summary.json`)" in markdown


def test_an_exploration_whose_episodes_all_failed_still_names_its_model(tmp_path: Path) -> None:
    """An endpoint that refuses every request (here a 400 for every one) stops every episode: the summary took the
    model and format from the first trial, so it said `exploration — None (None)` and summary.json held nulls."""
    from toolschool.explore.stage import ExploreInputs, run_explore_stage
    from toolschool.models.backend import Backend, Completion
    from toolschool.models.openai_http import EndpointError

    class Refusing(Backend):
        name = "refusing"

        async def generate(self, request: GenerationRequest) -> list[Completion]:
            raise EndpointError("endpoint http://127.0.0.1:1/v1 rejected the request (HTTP 400: no)")

    config = _explore_config(tmp_path, "openai:http://127.0.0.1:1/v1#teacher")
    inputs = ExploreInputs(config.model.name)
    result = run_explore_stage(config, inputs, tmp_path / "explore", backend_factory=lambda _config, _model: Refusing())
    written = json.loads((tmp_path / "explore" / "summary.json").read_text(encoding="utf-8"))
    assert len(result.failures) == 4 and written["total"]["trials"] == 0
    assert (written["model"], written["format"]) == ("openai:http://127.0.0.1:1/v1#teacher", "hermes")
    assert written["ablations"] == result.summary["ablations"] is not None


def test_the_training_sections_name_the_model_trained_and_on_how_many_examples(tmp_path: Path) -> None:
    """A loss curve without the model it belongs to: sft/ and rl/ record their start model, method and examples
    (toolschool_sft.json / toolschool_rl.json), and the report now says them above the curves."""
    from toolschool.evaluate.report import build_report

    run = tmp_path / "run"
    meta = {
        "sft": {"base": {"model": "smollm2-135m"}, "method": "lora", "format": "hermes", "data": {"examples": 12}},
        "rl": {"base": {"model": "runs/demo/sft/merged"}, "method": "lora", "format": "hermes", "examples": 2},
    }
    for stage, record in meta.items():
        (run / stage).mkdir(parents=True)
        (run / stage / "train_log.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n", encoding="utf-8")
        (run / stage / f"toolschool_{stage}.json").write_text(json.dumps(record), encoding="utf-8")
    markdown = (build_report(run).parent / "report.md").read_text(encoding="utf-8")
    assert "Trained from `smollm2-135m` (lora, hermes format) on 12 examples." in markdown
    assert "Trained from `runs/demo/sft/merged` (lora, hermes format) on 2 examples." in markdown


def test_a_per_tool_plot_that_shows_only_some_tools_says_so(tmp_path: Path) -> None:
    """The per-tool plot draws the 20 tools with the most items (STE has hundreds of APIs) and left the others out
    without a word; its title now says how many of how many it shows."""
    from toolschool.evaluate import report

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    per_tool = {f"api_{k:02d}": {"n": float(30 - k), "accuracy": 0.5} for k in range(25)}
    block = {"overall": {"n": 100.0, "correct": 0.5}, "by_category": {}, "per_tool": per_tool}
    summary = {"models": {"m": {"ste": block}}, "settings": {}}
    (run / "eval" / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    titles: list[str] = []
    plot = report._plot_bars

    def recording(path: Path, title: str, *args: Any, **kwargs: Any) -> bool:
        titles.append(title)
        return plot(path, title, *args, **kwargs)

    report._plot_bars = recording  # type: ignore[assignment]
    try:
        report.build_report(run)
    finally:
        report._plot_bars = plot  # type: ignore[assignment]
    assert "ste: accuracy per tool (the 20 of 25 tools with the most items)" in titles
