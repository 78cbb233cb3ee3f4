"""The judge of trials and of paraphrases: verdicts read, replies cached, no verdict not kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from distill_helpers import ScriptedBackend, check_counts_add_up, good_trials
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.data.distill.judge import parse_judgment
from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.runner import distill
from toolschool.models.backend import Completion, GenerationRequest


def test_judgment_parsing_keeps_reasons() -> None:
    text = "Addresses: Yes - gives the product\nFaithful: No - the result said 7006652\nAppropriate: yes"
    judgment = parse_judgment(text)
    assert judgment["keep"] is False and judgment["error"] is None
    assert judgment["faithful"] == {"verdict": False, "reason": "the result said 7006652"}
    assert parse_judgment("Yes")["error"] == "no verdict for addresses, faithful, appropriate"
    # judges often number the three lines as the questions are numbered; the verdicts are still read
    numbered = parse_judgment("1. Addresses: Yes - ok\n2) Faithful: No - made up\n3. **Appropriate:** Yes")
    assert numbered["error"] is None and numbered["faithful"] == {"verdict": False, "reason": "made up"}
    assert numbered["addresses"]["verdict"] and numbered["appropriate"]["verdict"]


class FailingAfter(ScriptedBackend):
    """Answers `limit` requests, then fails as a crashed server would."""

    def __init__(self, limit: int) -> None:
        super().__init__({})
        self.limit = limit

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        if len(self.requests) >= self.limit:
            raise ConnectionError("server went away")
        return await super().generate(request)


def test_an_interrupted_judge_run_resumes_without_asking_again(tmp_path: Path) -> None:
    """Judgments made before a crash are kept (cache.jsonl); the rerun asks only for the missing ones."""
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", validation_fraction=0.0, concurrency=1, judge_model="s"
    )
    with pytest.raises(ConnectionError):
        distill(good_trials(), opts, judge=FailingAfter(2))
    backend = ScriptedBackend({})
    summary = distill(good_trials(), opts, judge=backend)
    judged = [r for r in backend.requests if r.messages[-1]["content"].startswith("You check one example")]
    assert len(judged) == 2  # 4 candidates, 2 judged before the crash
    assert summary["total"]["judge"] == 4
    fresh = distill(good_trials(), DistillOptions(**{**opts.__dict__, "out": tmp_path / "fresh"}), judge=backend)
    assert fresh["per_tool"] == summary["per_tool"]
    assert (tmp_path / "fresh" / "train.jsonl").read_text() == (opts.out / "train.jsonl").read_text()


def test_a_judge_echoing_the_reply_format_gives_no_verdict() -> None:
    """A small judge echoes the prompt's 'Addresses: Yes|No - reason' lines: that was read as three Yes (kept)."""
    echo = "Reply with three lines:\nAddresses: Yes|No - reason\nFaithful: Yes/No - reason\nAppropriate: Yes or No"
    judgment = parse_judgment(echo)
    assert judgment["keep"] is False and judgment["error"] == "no verdict for addresses, faithful, appropriate"
    # answers numbered as the questions, without the criteria's names, are read in the questions' order
    numbered = parse_judgment("1. Yes\n2. No - it says 84\n3. Yes\n\nQuestion:\nWhat is 1234 * 5678?")
    assert numbered["error"] is None and numbered["keep"] is False
    assert numbered["faithful"] == {"verdict": False, "reason": "it says 84"} and numbered["appropriate"]["verdict"]
    # a named line wins over a numbered one for the same criterion
    both = parse_judgment("1. Yes\nAddresses: No - off topic\nFaithful: Yes\nAppropriate: Yes")
    assert both["addresses"] == {"verdict": False, "reason": "off topic"}


class GarbageJudge(ScriptedBackend):
    """Replies to judge prompts with text that holds no verdict (as the embedded 135M model does)."""

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        self.requests.append(request)
        return [Completion(text="The final answer is 84.\n\nThe tool results are accurate.")]


def test_judge_replies_without_a_verdict_are_counted_reported_and_not_kept(tmp_path: Path, monkeypatch) -> None:
    import toolschool.engine.backends as backends

    monkeypatch.setattr(backends, "make_backend", lambda spec, **kwargs: GarbageJudge({}))
    log = tmp_path / "trials.jsonl"
    log.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--judge-model", "j"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["judge_no_verdict"] == 4 and summary["total"]["judge"] == 0
    assert summary["dropped"]["judge"] == {
        "calculator": {"no verdict for addresses, faithful, appropriate": 3},
        "unit_convert": {"no verdict for addresses, faithful, appropriate": 1},
    }
    check_counts_add_up(summary)
    judgments = [json.loads(line) for line in (out / "judgments.jsonl").read_text().splitlines()]
    assert len(judgments) == 4 and all(j["raw"].startswith("The final answer") and not j["keep"] for j in judgments)
    assert "4 of 4 judge replies gave no Yes/No for every criterion" in (out / "README.md").read_text()
    output = " ".join(result.output.split())
    assert "4 of 4 judge replies gave no Yes/No for every criterion and were not kept" in output
    assert "distillation kept no training example: the judge kept none of the 4 trials that passed the rules" in output
    assert "point --judge-model" in output
    # distilled again without a judge: the earlier verdicts are not this data's (the card says rules only)
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert not (out / "judgments.jsonl").exists() and (out / "cache.jsonl").is_file()


def test_a_paraphrase_judgment_is_read_as_a_trial_judgment_is() -> None:
    from toolschool.data.distill.judge import parse_paraphrase_judgment

    assert parse_paraphrase_judgment("Same: No - it adds 1")["same"] == {"verdict": False, "reason": "it adds 1"}
    assert parse_paraphrase_judgment("**Same:** Yes")["keep"] is True
    assert parse_paraphrase_judgment("Yes, the same request.")["keep"] is True
    echo = parse_paraphrase_judgment("Reply with exactly one line:\nSame: Yes|No - reason")
    assert echo["keep"] is False and echo["error"] == "no verdict for same"
