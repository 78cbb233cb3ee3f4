"""Paraphrases: checked to ask for the original's call, judged, deduplicated, resumed from the cache."""

from __future__ import annotations

import json
from pathlib import Path

from distill_helpers import TOOLS, ScriptedBackend, calc_trial, call, first_call_replies, trial

from toolschool.data.dataset import load_dataset_jsonl
from toolschool.data.distill.dedupe import jaccard
from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.paraphrase import clean_paraphrase, paraphrase_plan, paraphrase_problem, required_atoms
from toolschool.data.distill.runner import distill
from toolschool.models.backend import Completion


def test_paraphrase_checks_what_the_call_needs() -> None:
    calls = [{"name": "unit_convert", "arguments": {"value": "5", "from_unit": "km", "to_unit": "mile"}}]
    assert required_atoms("How many miles is 5 km?", calls) == ({"5.0"}, {"km"})
    original = "How many miles is 5 km?"
    assert paraphrase_problem("Convert 5 km into miles please", original, calls, [], 0.9) is None
    assert paraphrase_problem("Convert five km into miles", original, calls, [], 0.9) == "loses a number the call needs"
    assert paraphrase_problem("Convert 5 kilometres to miles", original, calls, [], 0.9) == (
        "loses a date, unit or name the call needs"
    )
    # to be read back to the call (a round trip), a unit may be written out: the round trip checks what it means
    assert paraphrase_problem("Convert 5 kilometres to miles", original, calls, [], 0.9, read_back=True) is None
    assert paraphrase_problem("Convert five kilometres to miles", original, calls, [], 0.9, read_back=True) == (
        "loses a number the call needs"
    )
    assert paraphrase_problem("How many km is 5 miles?", original, calls, [], 0.9, read_back=True) == (
        "puts a unit or name the call needs next to another number"
    )
    assert paraphrase_problem("how many miles is 5 km", original, calls, [], 0.9) == "same as the original"
    # the same number and unit, swapped: 5 miles in km is another call than the original's 5 km in miles
    assert paraphrase_problem("How many km is 5 miles?", original, calls, [], 0.9) == (
        "puts a unit or name the call needs next to another number"
    )
    assert paraphrase_problem("5 KM, how many miles is that?", original, calls, [], 0.9) is None
    dated = [{"name": "weekday", "arguments": {"date": "2024-05-01"}}]
    assert paraphrase_problem("Which day is May 1st 2024?", "Weekday of 2024-05-01?", dated, [], 0.9) == (
        "loses a number the call needs"
    )
    assert jaccard("a b c", "a b d") == 0.5
    assert paraphrase_plan({"a": 2, "b": 10, "c": 0}, 7, 2) == {"a": 2, "b": 0, "c": 0}


def test_a_paraphrasers_preamble_label_and_quotes_are_taken_off() -> None:
    """The 0.5B leads some paraphrases with what it is doing; a student would learn to ask so."""
    for reply, paraphrase in [
        (
            "Sure, here's your request rewritten in a direct instruction: Add 416 days to 2021-06-20.",
            "Add 416 days to 2021-06-20.",
        ),
        (
            "To denote the exact same requirement, the rewritten request should be: Add 20 days to 2027-05-08.",
            "Add 20 days to 2027-05-08.",
        ),
        ("Certainly! Here is another way to ask:\n\nHow many km are 5 miles?", "How many km are 5 miles?"),
        ('Request: "What is 12 * 7?"', "What is 12 * 7?"),
        ("Sure, here's another request to add 198 days to 2016-04-30:", ""),  # no paraphrase after it: empty
        ("Request follows the format: Adjust 2014-10-27 by adding 988 days.", "Adjust 2014-10-27 by adding 988 days."),
        # the instructions said back, then the prompt's label and the paraphrase
        (
            "Make sure you keep the numbers and dates exactly as written. Request: Add 93 days to 2024-06-20?",
            "Add 93 days to 2024-06-20?",
        ),
        ("What is 5 km in miles?\n\nRequest: What is 5 km in miles?", "What is 5 km in miles?"),
        # a colon of the request itself stays
        ("Convert this: 5 km to miles", "Convert this: 5 km to miles"),
        ("Sure, what is 14:30 in Paris time?", "Sure, what is 14:30 in Paris time?"),
    ]:
        assert clean_paraphrase(reply) == paraphrase, reply


def test_paraphrase_that_writes_a_span_of_time_with_a_sign_is_rejected() -> None:
    """Distill's grounding filter refuses "-95 days" in a request (`signed_span_problem`); paraphrases are not
    grounded again, so the paraphrase check refuses it too, unless the original wrote it so."""
    original = "What was the date 95 days before 2023-02-12?"
    calls = [{"name": "date_add", "arguments": {"date": "2023-02-12", "days": -95}}]
    assert paraphrase_problem("What date is 2023-02-12 -95 days?", original, calls, [], 0.9) == (
        "writes a span of time with a sign"
    )
    assert paraphrase_problem("Which date is 95 days before 2023-02-12?", original, calls, [], 0.9) is None


def test_paraphrase_that_changes_the_call_is_rejected() -> None:
    """The paraphrase is paired with the original's call: a number neither the query nor the call has changes it."""
    calls = [{"name": "calculator", "arguments": {"expression": "1234*5678"}}]
    original = "What is 1234 * 5678?"
    assert paraphrase_problem("What is 1234 * 5678 * 2?", original, calls, [], 0.9) == (
        "adds a number the call does not use"
    )
    assert paraphrase_problem("Multiply 1234 by 5678, then add 1", original, calls, [], 0.9) == (
        "adds a number the call does not use"
    )
    assert paraphrase_problem("Multiply 1234 by 5678", original, calls, [], 0.9) is None
    # a number the call has (written in words in the original) is not new
    twelve = [{"name": "calculator", "arguments": {"expression": "12*7"}}]
    assert paraphrase_problem("What is 12 times 7?", "What is twelve times 7?", twelve, [], 0.9) is None


def test_paraphrases_of_different_originals_are_deduplicated_against_each_other(tmp_path: Path) -> None:
    """Two originals whose paraphraser writes the same text: one copy, never one in each split."""
    backend = ScriptedBackend(
        {
            "What is 1234 * 5678?": ["Multiply 1234 by 5678."],
            "Find the product of 1234 and 5678": ["Multiply 1234 by 5678.", "1234 times 5678 equals what?"],
        }
    )
    trials = [
        calc_trial(0, "What is 1234 * 5678?", "1234*5678", "7006652"),
        calc_trial(1, "Find the product of 1234 and 5678", "1234*5678", "7006652"),
    ]
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", target_per_tool=4, max_paraphrases=2,
        validation_fraction=0.5, paraphrase_model="scripted",
    )  # fmt: skip
    summary = distill(trials, opts, paraphraser=backend)
    queries = [
        e["messages"][0]["content"]
        for split in ("train", "validation")
        for e in load_dataset_jsonl(opts.out / f"{split}.jsonl", on_error="stop")[0]
        if e["meta"]["tool"] is not None  # not the no-tool lines
    ]
    assert sorted(queries) == sorted(
        ["What is 1234 * 5678?", "Find the product of 1234 and 5678", "Multiply 1234 by 5678.",
         "1234 times 5678 equals what?"]
    )  # fmt: skip
    assert summary["dropped"]["paraphrase"]["calculator"]["near-duplicate of another paraphrase"] == 1


def test_resume_reuses_cached_paraphrases_when_the_plan_changes(tmp_path: Path) -> None:
    """More (or fewer) originals change how many paraphrases each asks for: cached ones are used, not asked again."""
    texts = {
        "What is 1234 * 5678?": ["Multiply 1234 by 5678", "1234 times 5678?", "Product of 1234, 5678", "1234x5678"],
        "Add 17 and 25": ["Sum 17 and 25", "17 plus 25?", "What do 17 and 25 add up to", "Total of 17 and 25"],
        "Divide 81 by 9": ["81 over 9?", "What is 81 / 9", "Split 81 into 9 parts", "Quotient of 81 and 9"],
    }
    backend = ScriptedBackend(texts)
    trials = [
        calc_trial(0, "What is 1234 * 5678?", "1234*5678", "7006652"),
        calc_trial(1, "Add 17 and 25", "17+25", "42"),
        calc_trial(2, "Divide 81 by 9", "81/9", "9"),
    ]
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", target_per_tool=5, max_paraphrases=3,
        validation_fraction=0.0, paraphrase_model="scripted",
    )  # fmt: skip
    first = distill(trials[:2], opts, paraphraser=backend)  # 2 originals: 2 paraphrases each planned, 4 asked
    assert first["total"]["paraphrases"] == 3
    # one request per style, each for the samples of its style (three styles without a round trip: 2, 1 and 1)
    assert [r.params.n for r in backend.requests] == [2, 1, 1, 2, 1, 1]
    backend.requests.clear()
    second = distill(trials, opts, paraphraser=backend)  # 3 originals: 1 each planned, 3 asked
    asked = [r.messages[-1]["content"].rsplit("Request: ", 1)[1] for r in backend.requests]
    assert asked == ["Divide 81 by 9"] * 3, asked  # the first two come from the cache
    assert second["total"]["paraphrases"] == 2
    backend.requests.clear()
    opts.max_paraphrases = 3
    opts.target_per_tool = 12  # 3 each planned, 5 asked: only the missing samples are asked for
    distill(trials, opts, paraphraser=backend)
    # the first two: a second sample of the second style; the third: one more of the first and the second
    assert [r.params.n for r in backend.requests] == [1, 1, 1, 1]
    assert sorted(r.messages[-1]["content"].rsplit("Request: ", 1)[1] for r in backend.requests) == [
        "Add 17 and 25", "Divide 81 by 9", "Divide 81 by 9", "What is 1234 * 5678?"
    ]  # fmt: skip


def test_a_paraphrase_that_answers_echoes_the_prompt_or_drops_a_quoted_value_or_month_is_rejected() -> None:
    from toolschool.data.distill.paraphrase import paraphrase_prompt

    dated = [{"name": "weekday", "arguments": {"date": "2024-05-01"}}]
    original = "Which day of the week was 2024-05-01?"
    # an answer, not a request: it states the tool's result, which the original does not hold
    answers = ["It was a Wednesday.", "Wednesday"]
    assert paraphrase_problem("2024-05-01 was a Wednesday.", original, dated, [], 0.9, answers=answers) == (
        "states the answer instead of asking"
    )
    assert paraphrase_problem("What weekday fell on 2024-05-01?", original, dated, [], 0.9, answers=answers) is None
    # the paraphrasing prompt echoed back (a small model does), with or without the request after it, in any style
    for read_back in (False, True):
        for sample in range(4):
            echo = paraphrase_prompt("", sample, read_back=read_back).split("\n\n")[0]
            assert paraphrase_problem(echo, original, dated, [], 0.9) == "repeats the paraphrasing instructions"
    # units respelled only where a round trip reads them back; otherwise every unit and name is kept as written
    assert "in the words a person would say" in paraphrase_prompt("", 1, read_back=True)
    assert not any("in the words a person would say" in paraphrase_prompt("", i) for i in range(3))
    assert "name and unit exactly as written" in paraphrase_prompt("", 0)
    assert "name and unit" not in paraphrase_prompt("", 0, read_back=True)
    assert paraphrase_prompt("", 4, read_back=True) == paraphrase_prompt("", 0, read_back=True)  # styles in turn
    assert paraphrase_prompt("", 3) == paraphrase_prompt("", 0)
    assert paraphrase_problem(f"Keep every number and date exactly: {original}", original, dated, [], 0.9) == (
        "repeats the paraphrasing instructions"
    )
    # a date the query writes with its month's name: the numbers stay, the month changes
    named = "What weekday is May 1st 2024?"
    assert paraphrase_problem("What weekday is June 1st 2024?", named, dated, [], 0.9) == (
        "loses the month of a date the call needs"
    )
    assert paraphrase_problem("Which day of the week is 1 may 2024?", named, dated, [], 0.9) is None
    assert paraphrase_problem("Which day of the week is 2024-05-01?", named, dated, [], 0.9) is None
    # a quoted value the call takes, verbatim (five words: more than a name, so the phrase check does not see it)
    code = [{"name": "python", "arguments": {"code": "print(sum(c in 'aeiou' for c in 'the quick brown fox jumps'))"}}]
    quoted = 'How many vowels are in "the quick brown fox jumps"?'
    assert required_atoms(quoted, code) == (set(), set())
    assert paraphrase_problem('Count the vowels of "the quick brown fox"', quoted, code, [], 0.9) == (
        "loses a quoted value the call needs"
    )
    assert paraphrase_problem("Count the vowels of 'the quick brown fox jumps'.", quoted, code, [], 0.9) is None
    # an apostrophe is no quote; a quoted name keeps its case, which the call's argument has
    length = [{"name": "python", "arguments": {"code": "print(len('Hello World'))"}}]
    asked = "What's the length of 'Hello World'?"
    assert paraphrase_problem("How long is 'hello world'?", asked, length, [], 0.9) == (
        "loses a quoted value the call needs"
    )
    assert paraphrase_problem("How many characters has “Hello World”?", asked, length, [], 0.9) is None


def test_paraphrases_are_judged_when_a_judge_is_configured_and_every_rejection_is_counted(tmp_path: Path) -> None:
    """Paraphrases went into the training data unjudged while the trials were judged. Now the judge is asked about
    each paraphrase that passed the checks and could be kept (not about those rejected before it, nor about samples
    past an original's share), and a No, like each check's rejection, is counted with its reason."""
    weekday_tools = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": "weekday", "parameters": {
        "type": "object", "properties": {"date": {"type": "string"}}}}}]  # fmt: skip
    trials = [
        calc_trial(0, "What is 1234 * 5678?", "1234*5678", "7006652"),
        trial(
            "weekday",
            0,
            0,
            "Which day of the week was 2024-05-01?",
            [{"calls": [call("weekday", {"date": "2024-05-01"}, "Wednesday")]}],
            "It was a Wednesday.",
            tools=weekday_tools,
        ),  # fmt: skip
    ]
    # two paraphrases planned per original, four asked
    script = {
        "What is 1234 * 5678?": [
            "Rewrite the user request below in different words: What is 1234 * 5678?",  # the prompt echoed
            "Multiply 1234 by 5678.",
            "1234 times 5678?",
            "Product of 1234 and 5678?",  # past the original's share: never looked at, never judged
        ],
        "Which day of the week was 2024-05-01?": [
            "2024-05-01 was a Wednesday.",  # the answer
            Completion(text="Could you tell me which day of the week 2024-05-01", finish_reason="length"),
            "Which month was 2024-05-01 in?",  # keeps the date; the judge says it is another request
            "What weekday fell on 2024-05-01?",
        ],
    }
    backend = ScriptedBackend(script, not_same=("Which month was 2024-05-01 in?",), calls=first_call_replies(trials))
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", target_per_tool=3, max_paraphrases=2,
        validation_fraction=0.0, judge_model="scripted", paraphrase_model="scripted",
    )  # fmt: skip
    summary = distill(trials, opts, judge=backend, paraphraser=backend)
    assert summary["dropped"]["paraphrase"] == {
        "calculator": {"repeats the paraphrasing instructions": 1},
        "weekday": {
            "states the answer instead of asking": 1,
            "cut off at paraphrase_max_tokens": 1,
            "judged not the same request": 1,
        },
    }
    assert summary["per_tool"]["calculator"]["paraphrases"] == 2 and summary["per_tool"]["weekday"]["paraphrases"] == 1
    train, _ = load_dataset_jsonl(opts.out / "train.jsonl", on_error="stop")
    assert sorted(e["messages"][0]["content"] for e in train if e["meta"]["paraphrase"]) == [
        "1234 times 5678?",
        "Multiply 1234 by 5678.",
        "What weekday fell on 2024-05-01?",
    ]
    judged = [json.loads(line) for line in (opts.out / "paraphrase_judgments.jsonl").read_text().splitlines()]
    assert sorted((j["paraphrase"], j["keep"]) for j in judged) == [
        ("1234 times 5678?", True),
        ("Multiply 1234 by 5678.", True),
        ("What weekday fell on 2024-05-01?", True),
        ("Which month was 2024-05-01 in?", False),
    ]
    no = next(j for j in judged if not j["keep"])
    assert no["same"] == {"verdict": False, "reason": "another task"} and no["original_ids"] == ["weekday/e0/s0"]
    card = (opts.out / "README.md").read_text()
    assert "judged not the same request: 1" in card and "states the answer instead of asking: 1" in card
    # a rerun asks nothing again (the verdicts are cached); without a judge, the verdict file goes
    asked = len(backend.requests)
    assert distill(trials, opts, judge=backend, paraphraser=backend)["dropped"] == summary["dropped"]
    assert len(backend.requests) == asked
    opts.judge_model = None
    distill(trials, opts, paraphraser=backend)
    assert not (opts.out / "paraphrase_judgments.jsonl").exists()


def test_a_paraphrase_is_kept_only_when_the_explorer_reads_it_back_to_the_original_call(tmp_path: Path) -> None:
    """The rules cannot see "Multiply 1234 by 5678" read as a sum; the explorer, made to call the calculator from
    the paraphrase alone, writes 1234 + 5678: that paraphrase would teach another call, and is not kept."""
    from distill_helpers import good_trials, hermes_call

    trials = good_trials()[:1]  # "What is 1234 * 5678?" -> calculator
    misread = hermes_call("calculator", {"expression": "1234 + 5678"})
    script = {"What is 1234 * 5678?": ["Multiply 1234 by 5678.", "Compute 1234 times 5678.", "Find 1234 x 5678."]}
    backend = ScriptedBackend(script, calls={"Multiply 1234 by 5678.": misread})
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", target_per_tool=3, max_paraphrases=2,
        validation_fraction=0.0, paraphrase_model="scripted", chitchat_fraction=0.0,
    )  # fmt: skip
    summary = distill(trials, opts, paraphraser=backend, explorer=backend)
    assert summary["options"]["paraphrase_round_trip"] is True
    assert summary["dropped"]["paraphrase"]["calculator"] == {"round trip: calls the tool with other arguments": 1}
    train, _ = load_dataset_jsonl(opts.out / "train.jsonl", on_error="stop")
    kept = sorted(e["messages"][0]["content"] for e in train if e["meta"].get("paraphrase"))
    assert kept == ["Compute 1234 times 5678.", "Find 1234 x 5678."]
    trips = [r for r in backend.requests if r.constraint is not None]
    # the reply must call the original's tool (a named tool_choice), from the paraphrase alone
    assert {r.messages[-1]["content"] for r in trips} == {
        "Multiply 1234 by 5678.", "Compute 1234 times 5678.", "Find 1234 x 5678."
    }  # fmt: skip
    assert all(r.constraint.tool_choice == "calculator" and len(r.messages) <= 2 for r in trips)
    assert "paraphrase round trip: on" in (opts.out / "README.md").read_text()

    # a rerun reads the round trips back from the cache; switched off, the misread paraphrase is kept
    again = ScriptedBackend(script, calls={"Multiply 1234 by 5678.": misread})
    assert distill(trials, opts, paraphraser=again, explorer=again)["dropped"] == summary["dropped"]
    assert not [r for r in again.requests if r.constraint is not None]
    opts.paraphrase_round_trip = False
    off = distill(trials, opts, paraphraser=again, explorer=again)
    assert off["dropped"]["paraphrase"] == {} and off["options"]["paraphrase_round_trip"] is False
    assert off["per_tool"]["calculator"]["paraphrases"] == 2


def test_a_paraphrase_whose_call_is_not_grounded_in_it_is_rejected(tmp_path: Path) -> None:
    """A round trip may still write the original's call from a paraphrase that left a unit out (the explorer guesses
    "mile" for "Convert 5 km."): grounded like its original, the paraphrase is checked for what its call takes."""
    from distill_helpers import good_trials

    trials = [good_trials()[3]]  # "How many miles is 5 km?" -> unit_convert(5, km, mile)
    script = {"How many miles is 5 km?": ["Convert 5 km.", "How many miles are 5 kilometres?"]}
    backend = ScriptedBackend(script)
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", target_per_tool=3, max_paraphrases=2,
        validation_fraction=0.0, paraphrase_model="scripted", chitchat_fraction=0.0,
    )  # fmt: skip
    summary = distill(trials, opts, paraphraser=backend, explorer=backend)
    dropped = summary["dropped"]["paraphrase"]["unit_convert"]
    assert dropped["not grounded: a unit in the call is not in the request"] == 1  # the others: samples left empty
    train, _ = load_dataset_jsonl(opts.out / "train.jsonl", on_error="stop")
    assert [e["messages"][0]["content"] for e in train if e["meta"].get("paraphrase")] == [
        "How many miles are 5 kilometres?"
    ]
