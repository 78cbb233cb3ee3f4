"""Trial-log lines and a scripted judge/paraphraser backend for the distill stage's tests (no model), shared by
the tests of distill, its filters, round trip and no-tool lines."""

from __future__ import annotations

import json

from toolschool.data.distill.paraphrase import clean_paraphrase, paraphrase_styles
from toolschool.models.backend import Backend, Completion, GenerationRequest

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {"type": "object", "properties": {key: {"type": "string"} for key in keys}},
        },
    }
    for name, keys in (("calculator", ["expression"]), ("unit_convert", ["value", "from_unit", "to_unit"]))
]


def call(name: str, args: dict, text: str, *, error: bool = False, cid: str = "c1") -> dict:
    return {
        "name": name,
        "arguments": args,
        "id": cid,
        "observation": {"text": text, "value": None, "is_error": error, "error_kind": "execution" if error else None},
        "shown": text,
    }


def trial(tool: str, episode: int, slot: int, query: str, steps: list[dict], final: str | None, **kw) -> dict:
    return {
        "v": 1, "tool": tool, "episode": episode, "slot": slot, "status": "ok", "query": query, "steps": steps,
        "final_answer": final, "reflection": "Yes", "solved": True, "tools": TOOLS, "model": "test", **kw,
    }  # fmt: skip


def good_trials() -> list[dict]:
    convert = {"value": "5", "from_unit": "km", "to_unit": "mile"}
    return [
        trial(
            "calculator",
            0,
            0,
            "What is 1234 * 5678?",
            [
                {"calls": [call("calculator", {"expression": "1234*5678"}, "7006652")]},
                {"calls": [], "final": "7006652"},
            ],
            "1234 * 5678 = 7006652",
        ),  # fmt: skip
        # a failed call, then a good one: the clean path keeps only the good one
        trial(
            "calculator",
            0,
            1,
            "Add 17 and 25 then double it",
            [
                {"calls": [call("calculator", {"expression": "(17+25)x2"}, "calculator error: write *", error=True)]},
                {"calls": [call("calculator", {"expression": "(17+25)*2"}, "84", cid="c2")]},
            ],
            "84",
        ),  # fmt: skip
        # near-duplicate of the first query
        trial(
            "calculator",
            1,
            0,
            "what is 1234 * 5678",
            [{"calls": [call("calculator", {"expression": "1234*5678"}, "7006652")]}],
            "7006652",
        ),  # fmt: skip
        trial(
            "unit_convert",
            0,
            0,
            "How many miles is 5 km?",
            [{"calls": [call("unit_convert", convert, "3.107 mile")]}],
            "About 3.107 miles.",
        ),  # fmt: skip
        # rule failures
        trial("calculator", 1, 1, "What is 2+2?", [], "4"),
        trial(
            "calculator",
            1,
            2,
            "What is 3+3?",
            [{"calls": [call("calculator", {"expression": "3+"}, "bad", error=True)]}],
            "6",
        ),  # fmt: skip
        trial("calculator", 2, 0, "Compute 9*9", [{"calls": [call("calculator", {"expression": "9*9"}, "81")]}], None),
        trial(
            "unit_convert",
            0,
            1,
            "What is 6 times 7?",
            [{"calls": [call("calculator", {"expression": "6*7"}, "42")]}],
            "42",
        ),  # fmt: skip
        trial("calculator", 2, 1, "", [], None, status="empty_query"),
    ]


def hermes_call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def first_call_replies(trials: list[dict]) -> dict[str, str]:
    """query -> the trial's first successful call, written as a model would: a round trip that reproduces it."""
    replies = {}
    for t in trials:
        for step in t["steps"]:
            good = [c for c in step.get("calls") or [] if not c["observation"]["is_error"]]
            if good:
                replies.setdefault(t["query"], hermes_call(good[0]["name"], good[0]["arguments"]))
                break
    return replies


class ScriptedBackend(Backend):
    """A test double: answers judge prompts with a fixed verdict, paraphrase prompts from a script, a round trip
    (the request alone, with tools) from `calls` (default: the trial's own first call; for a scripted paraphrase,
    its original's), and chit-chat prompts from
    `chitchat` (requests) with `answers` (replies, in turn)."""

    name = "scripted"

    def __init__(
        self,
        paraphrases: dict[str, list[str]],
        reject: str = "",
        not_same: tuple[str, ...] = (),
        *,
        calls: dict[str, str] | None = None,
        chitchat: tuple[str, ...] = ("Any tips for sleeping better?", "Tell me something nice about cats."),
        answers: tuple[str, ...] = ("Keep a regular bedtime and a dark, quiet room.",),
    ) -> None:
        self.paraphrases = paraphrases
        self.reject = reject
        self.not_same = not_same  # paraphrases the judge calls another request
        self.calls = {**first_call_replies(good_trials()), **(calls or {})}
        for query, texts in paraphrases.items():  # a paraphrase reads back to its original's call, unless scripted
            for text in texts:
                if isinstance(text, str) and query in self.calls:
                    self.calls.setdefault(clean_paraphrase(text), self.calls[query])
        self.chitchat = chitchat
        self.answers = answers
        self.requests: list[GenerationRequest] = []
        self.served: dict[tuple[str, int], int] = {}  # paraphrase samples served per (request, style)

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        self.requests.append(request)
        prompt = request.messages[-1]["content"]
        if request.tools:  # a round trip: the request alone, with the tools
            return [Completion(text=self.calls.get(prompt, "I cannot tell."))]
        if prompt.startswith("Write one short message"):
            index = sum(r.messages[-1]["content"].startswith("Write one short message") for r in self.requests) - 1
            return [Completion(text=self.chitchat[index % len(self.chitchat)])]
        if request.messages[0]["role"] == "system":  # a chit-chat answer
            index = sum(r.messages[0]["role"] == "system" for r in self.requests) - 1
            return [Completion(text=self.answers[index % len(self.answers)])]
        if prompt.startswith("You check one example"):
            verdict = "No - invented a number" if self.reject and self.reject in prompt else "Yes - fine"
            text = f"Addresses: Yes - answers it\nFaithful: {verdict}\nAppropriate: Yes - the right tool"
            return [Completion(text=text)]
        if prompt.startswith("You check a rewritten user request"):
            rewritten = prompt.split("Rewritten request:\n", 1)[1].split("\n\nQuestion:", 1)[0]
            return [Completion(text="Same: No - another task" if rewritten in self.not_same else "Same: Yes - same")]
        query = prompt.rsplit("Request: ", 1)[1]
        texts = self.paraphrases.get(query, [])  # a text, or a Completion (one cut off at max_tokens)
        # sample i of a request is asked in style i (in turn): this request serves its style's next samples
        styles = paraphrase_styles(read_back="Keep every number and date exactly" in prompt)
        style = next(i for i, s in enumerate(styles) if f"in different words, {s}." in prompt)
        first = self.served.get((query, style), 0)
        self.served[(query, style)] = first + request.params.n
        indices = [style + len(styles) * k for k in range(first, first + request.params.n)]
        replies = [texts[i] if i < len(texts) else "" for i in indices]
        return [r if isinstance(r, Completion) else Completion(text=r) for r in replies]


def calc_trial(episode: int, query: str, expression: str, result: str, tool: str = "calculator") -> dict:
    return trial(tool, episode, 0, query, [{"calls": [call(tool, {"expression": expression}, result)]}], result)


def check_counts_add_up(summary: dict) -> None:
    """What each filter lost is what its drop reasons count, per tool and in the yield; a tool's final lines are its
    kept originals + paraphrases, the no-tool row's its irrelevance + chit-chat + out-of-scope lines."""
    from toolschool.data.distill.summary import FILTERS, NO_TOOL

    dropped = summary["dropped"]
    for tool, row in summary["per_tool"].items():
        assert row["train"] + row["validation"] == row["final"], tool
        if tool == NO_TOOL:
            assert (
                row["irrelevance"] + row["chitchat"] + row["out_of_scope"]
                == row["final"]
                == summary["no_tool"]["lines"]
            )
            continue
        before = "trials"
        for name, step in FILTERS:
            assert row[before] - row[step] == sum(dropped[name].get(tool, {}).values()), (tool, name)
            before = step
        assert row["dedupe"] + row["paraphrases"] == row["final"], tool
    entered = summary["total"]["trials"]
    for stage, (name, step) in zip(summary["yield"], FILTERS, strict=True):
        assert stage["filter"] == name and stage["entered"] == entered and stage["kept"] == summary["total"][step]
        assert stage["removed"] == sum(stage["reasons"].values()) == entered - stage["kept"]
        entered = stage["kept"]
