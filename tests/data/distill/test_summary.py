"""What the summary says: the step that left nothing to train on."""

from __future__ import annotations

from pathlib import Path

from distill_helpers import calc_trial, good_trials

from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.rules import Candidate, trial_to_candidate
from toolschool.data.distill.runner import distill
from toolschool.explore.trial import Trial


def candidate_of(line: dict, **rules: bool) -> tuple[Candidate | None, str | None]:
    """`trial_to_candidate` of a trial given as its log line."""
    return trial_to_candidate(Trial.from_json(line), **rules)


def test_an_empty_train_split_names_the_step_that_kept_nothing(tmp_path: Path) -> None:
    from toolschool.data.distill.summary import nothing_to_train

    def run(trials: list[dict], name: str, fraction: float = 0.0) -> dict:
        return distill(trials, DistillOptions(trials=tmp_path / "t", out=tmp_path / name, validation_fraction=fraction))

    assert nothing_to_train(run(good_trials(), "ok")) is None
    assert "the trial log holds no trial" in nothing_to_train(run([], "none"))[0]
    failing = [t for t in good_trials() if candidate_of(t)[0] is None]
    why, hint = nothing_to_train(run(failing, "rules"))
    assert "no exploration trial ended with a final answer" in why and "explorer" in hint
    # every trial passed the rules, none the grounding filter: it is named, with its reasons and the way out
    invented = [calc_trial(0, "What is 2 * 3?", "2*4", "8")]
    why, hint = nothing_to_train(run(invented, "grounding"))
    assert why.endswith(
        "the grounding filter kept none of the 1 trials (a number in the call is not in the request: 1)"
    )
    assert "require_grounded = false" in hint
    # one kept original and validation_fraction 0.9: round(0.9) = 1 group goes to validation, none to train
    why, hint = nothing_to_train(run(good_trials()[:1], "split", fraction=0.9))
    assert why.endswith("all 1 kept examples went to the validation split") and "validation_fraction" in hint
