"""Tool-use rewards for RL, as TRL reward functions `(prompts, completions, **columns) -> list[float | None]`.

Every verdict comes from the evaluation module (`toolschool.evaluate.metrics`): well-formedness from the chat
format's parser, the tool decision from `score_item`, arguments from its semantic check (calculator by value,
python by output or AST, units through pint), final answers from `answer_matches`. This module only turns those
verdicts into numbers, so a reply the evaluation calls correct is exactly a reply RL rewards.

Components (each logged by TRL as `rewards/<name>/mean`):
- format: +1.0 when every assistant turn is well-formed (a parsable call or a final answer), else 0;
- tool: +0.5 for the right tool(s), or the right decision to answer directly; -0.5 otherwise;
- arguments: +1.0 when the arguments are semantically correct, else 0 (None: the gold turn calls no tool);
- length: -0.2 when the reply holds text outside the call or the answer, else 0;
- answer (multi-turn): +1.0 when the final answer matches `expected_answer`, else 0 (None: no expected answer);
- fine_grained: an alternative correctness reward in [-3, 3]: the mean of tool-name match, parameter-name overlap
  and matching parameter values, scaled (ToolRL-style), so partial credit gives a gradient before full matches.

The completions of one batch are parsed and scored once (`RewardSuite.score`), whichever component asks first; it
also logs the batch's valid-format rate, tool accuracy and argument accuracy through TRL's `log_metric`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolschool.chat.toolkens import plain_name, plain_names_in_text, with_renamed_calls
from toolschool.chat.types import ParsedReply, arguments_from_wire
from toolschool.errors import ConfigError

FORMAT_REWARD = 1.0
TOOL_RIGHT = 0.5
TOOL_WRONG = -0.5
ARGUMENTS_REWARD = 1.0
LENGTH_PENALTY = -0.2
ANSWER_REWARD = 1.0
FINE_GRAINED_SCALE = 3.0

REWARD_NAMES: tuple[str, ...] = ("format", "tool", "arguments", "length", "answer", "fine_grained")
DEFAULT_REWARDS: tuple[str, ...] = ("format", "tool", "arguments", "length")
MULTI_TURN_ONLY: frozenset[str] = frozenset({"answer"})


def check_reward_names(
    names: Sequence[str], *, mode: str = "single_turn", weights: Sequence[float] | None = None
) -> None:
    """Refuse unknown or misplaced reward names before any model is loaded."""
    if not names:
        raise ConfigError("rl.rewards is empty", hint=f"choose from: {', '.join(REWARD_NAMES)}")
    unknown = [n for n in names if n not in REWARD_NAMES]
    if unknown:
        raise ConfigError(
            f"rl.rewards: unknown reward name(s) {', '.join(repr(n) for n in unknown)}",
            hint=f"valid names: {', '.join(REWARD_NAMES)}",
        )
    duplicated = sorted({n for n in names if list(names).count(n) > 1})
    if duplicated:
        raise ConfigError(f"rl.rewards lists {', '.join(duplicated)} more than once", hint="name each reward once")
    if mode != "multi_turn":
        misplaced = [n for n in names if n in MULTI_TURN_ONLY]
        if misplaced:
            raise ConfigError(
                f"rl.rewards: {', '.join(misplaced)} scores the final answer after the tools ran, which only "
                "happens in multi-turn mode",
                hint="set rl.mode = 'multi_turn' (--mode multi_turn) or drop it from rl.rewards",
            )
    if weights is not None and len(weights) != len(names):
        raise ConfigError(
            f"rl.reward_weights has {len(weights)} value(s) for {len(names)} reward(s) ({', '.join(names)})",
            hint="give one weight per reward, in the same order",
        )


# ------------------------------------------------------------------------------------------------- scoring


@dataclass
class Scored:
    """One completion, parsed and judged against its gold turn."""

    turns: list[ParsedReply]  # every assistant turn, parsed (single-turn: one)
    outside_text: bool  # text outside the call(s) / the answer in some turn
    well_formed: bool  # every turn well-formed
    tool_match: bool  # first turn: the right tool(s), or rightly no tool
    gold_called: bool
    args_correct: bool  # first turn: tool_match and semantically matching arguments
    fine_grained: float  # [0, 1]
    answer_correct: bool | None = None  # final answer vs expected (None: nothing to compare)
    details: dict[str, Any] = field(default_factory=dict)


def _gold_calls(gold: dict[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for call in gold.get("tool_calls") or []:
        function = call.get("function", call)
        try:
            arguments = arguments_from_wire(function.get("arguments"))
        except ValueError:
            arguments = {}
        calls.append({"type": "function", "function": {"name": function.get("name", ""), "arguments": arguments}})
    return calls


def _name_args(call: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = arguments_from_wire(arguments)
        except ValueError:
            arguments = {}
    return str(function.get("name", "")), arguments if isinstance(arguments, dict) else {}


def fine_grained_score(parsed: ParsedReply, gold_calls: list[dict[str, Any]]) -> float:
    """Partial credit in [0, 1]: mean of tool-name match, parameter-name overlap (Jaccard) and matching values.

    Calls are paired by name (each gold call with the first unused predicted call of that name); every part is
    divided by the larger of the predicted and gold call counts, so extra or missing calls cost credit. A value
    matches when the evaluation module's semantic check accepts it for that tool (alone, as `{key: value}`).
    """
    from toolschool.evaluate.metrics import arguments_match

    if not parsed.well_formed:
        return 0.0
    pred_calls = list(parsed.calls)
    if not gold_calls:
        return 1.0 if not pred_calls else 0.0
    if not pred_calls:
        return 0.0
    denominator = max(len(pred_calls), len(gold_calls))
    unused = [_name_args(c) for c in pred_calls]
    names = keys = values = 0.0
    for gold_call in gold_calls:
        name, gold_args = _name_args(gold_call)
        hit = next((i for i, (pred_name, _) in enumerate(unused) if pred_name == name), None)
        if hit is None:
            continue
        _, pred_args = unused.pop(hit)
        names += 1.0
        union = set(gold_args) | set(pred_args)
        keys += len(set(gold_args) & set(pred_args)) / len(union) if union else 1.0
        if not gold_args:
            values += 1.0
        elif arguments_match(name, pred_args, gold_args, mode="semantic"):
            values += 1.0
        else:
            matched = sum(
                1
                for key, gold_value in gold_args.items()
                if key in pred_args and arguments_match(name, {key: pred_args[key]}, {key: gold_value}, mode="semantic")
            )
            values += matched / len(gold_args)
    return (names + keys + values) / (3.0 * denominator)


def _parsed_tool_calls(tool_calls: Sequence[dict[str, Any]], content: str) -> ParsedReply:
    """A turn TRL's response parser read as tool calls, held to our format parser's rules.

    TRL keeps any JSON value as a call's arguments (a string such as "2+2", a list); our parser, which evaluation
    uses, calls such a reply malformed, so it is an error here too. A JSON string of an object is accepted by both.
    """
    from toolschool.chat.formats.base import coerce_arguments

    calls = []
    for call in tool_calls:
        function = call.get("function", call) if isinstance(call, dict) else {}
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            return ParsedReply(text=content, error=f"tool call without a function name: {call!r:.80}")
        arguments, error = coerce_arguments(function.get("arguments"), "arguments")
        if error is not None:
            return ParsedReply(text=content, error=f"tool call {name!r}: {error}")
        calls.append({"type": "function", "function": {"name": name, "arguments": arguments}})
    return ParsedReply(text=content, calls=calls, content=content.strip())


def _cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, str]:
    """(text before the first stop string, text from it on): what a stop-string-aware backend would return."""
    cut = min((text.index(s) for s in stop if s and s in text), default=len(text))
    return text[:cut], text[cut:]


def _outside(fmt_name: str, parsed: ParsedReply, text: str, tail: str) -> bool:
    """Text that is neither the call(s) nor the answer (ReAct's Thought is part of its format, so not counted)."""
    if tail.strip():
        return True
    if not parsed.well_formed:
        return bool(text.strip())
    if parsed.calls and fmt_name != "react":
        return bool(parsed.content.strip())
    return False


def _offered(value: Any) -> list[str]:
    """A row's `offered` column (the JSON list of tool names its prompt offered) as names; none when absent."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value else []
        except ValueError:
            value = []
    return [str(name) for name in value] if isinstance(value, list | tuple) else []


class RewardSuite:
    """Scores completions once per batch and exposes the chosen components as named TRL reward functions."""

    def __init__(
        self, fmt: Any, names: Sequence[str], *, mode: str = "single_turn", toolkens: Iterable[str] = ()
    ) -> None:
        check_reward_names(names, mode=mode)
        self.fmt = fmt
        self.names = list(names)
        self.mode = mode
        # a model trained with STE toolkens writes <tool_NAME>: read as NAME, as evaluation reads it
        self.toolkens = set(toolkens)
        self._last: tuple[Any, list[Scored]] | None = None

    # -- parsing ----------------------------------------------------------------------------------------------
    def parse_text(self, completion: str, offered: Sequence[str] = ()) -> tuple[ParsedReply, bool]:
        """A single-turn completion (text after the prompt and the format's prefill) -> (parsed, outside text).

        `offered`: the names of the tools the prompt offered (a bare JSON call is read only when it names one)."""
        text = (self.fmt.prefill or "") + completion
        if self.toolkens:
            text = plain_names_in_text(text, self.toolkens)
        head, tail = _cut_at_stop(text, self.fmt.stop)
        parsed = self.fmt.parse(head, list(offered))
        return parsed, _outside(self.fmt.name, parsed, head, tail)

    def parse_messages(
        self, messages: Sequence[dict[str, Any]], offered: Sequence[str] = ()
    ) -> tuple[list[ParsedReply], bool]:
        """A multi-turn completion (TRL's assistant/tool messages) -> parsed assistant turns, any outside text.

        TRL parsed the tool calls with the chat template's response parser; a turn without parsed calls is read
        by our format's parser, so a malformed call shows up as an error rather than as a plain answer.
        """
        turns: list[ParsedReply] = []
        outside = False
        for message in messages:
            if message.get("role") != "assistant":
                continue
            content = message.get("content") or ""
            if not isinstance(content, str):
                content = json.dumps(content)
            if message.get("tool_calls"):
                parsed = _parsed_tool_calls(message["tool_calls"], content)
                outside = outside or bool(content.strip())
            else:
                parsed, extra = self.parse_text(content, offered)
                outside = outside or extra
            turns.append(parsed)
        if not turns:
            turns.append(ParsedReply(text="", error="the rollout holds no assistant turn"))
        return turns, outside

    # -- judging ----------------------------------------------------------------------------------------------
    def judge(
        self,
        completion: str | Sequence[dict[str, Any]],
        gold: dict[str, Any],
        expected: str | None,
        offered: Sequence[str] = (),
    ) -> Scored:
        from toolschool.evaluate.metrics import answer_matches, score_item

        if isinstance(completion, str):
            first, outside = self.parse_text(completion, offered)
            turns = [first]
        else:
            turns, outside = self.parse_messages(completion, offered)
            first = turns[0]
        gold_calls = _gold_calls(gold)
        if self.toolkens:
            gold_calls = with_renamed_calls(gold_calls, plain_name)
        item = score_item(first, gold_calls, None, mode="semantic")
        answer_correct: bool | None = None
        if self.mode == "multi_turn" and expected:
            last = turns[-1]
            answer_correct = bool(last.well_formed and not last.calls and answer_matches(last.final, expected))
        return Scored(
            turns=turns,
            outside_text=outside,
            well_formed=all(t.well_formed for t in turns),
            tool_match=item.tool_match,
            gold_called=bool(gold_calls),
            args_correct=bool(gold_calls) and item.args_semantic,
            fine_grained=fine_grained_score(first, gold_calls),
            answer_correct=answer_correct,
            details={"error": first.error, "pred_tools": item.pred_tools, "gold_tools": item.gold_tools},
        )

    def score(
        self,
        completions: Sequence[Any],
        gold: Sequence[str],
        expected_answer: Sequence[str] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        offered: Sequence[str] | None = None,
    ) -> list[Scored]:
        """Judge a batch (cached: TRL calls every component with the same `completions` list).

        `offered`: per completion, the JSON list of the names of the tools its prompt offered (the rows' column)."""
        if self._last is not None and self._last[0] is completions:
            return self._last[1]
        expected = list(expected_answer) if expected_answer is not None else [""] * len(completions)
        names = [_offered(o) for o in (offered if offered is not None else [None] * len(completions))]
        scored = [
            self.judge(c, json.loads(g) if isinstance(g, str) else dict(g or {}), e or None, n)
            for c, g, e, n in zip(completions, gold, expected, names, strict=True)
        ]
        self._last = (completions, scored)
        if log_metric is not None:
            for name, value in batch_metrics(scored).items():
                log_metric(name, value)
        return scored

    # -- the components ---------------------------------------------------------------------------------------
    def functions(self) -> list[Callable[..., list[float | None]]]:
        """One TRL reward function per chosen component, named after it (TRL logs `rewards/<name>/mean`)."""
        return [self._component(name) for name in self.names]

    def _component(self, name: str) -> Callable[..., list[float | None]]:
        value = COMPONENTS[name]

        def reward(
            prompts: list[Any],
            completions: list[Any],
            gold: list[str],
            expected_answer: list[str] | None = None,
            log_metric: Callable[[str, float], None] | None = None,
            offered: list[str] | None = None,
            **_: Any,
        ) -> list[float | None]:
            return [value(s) for s in self.score(completions, gold, expected_answer, log_metric, offered)]

        reward.__name__ = reward.__qualname__ = name
        reward.__doc__ = f"The '{name}' tool-use reward (see toolschool.train.rewards)."
        return reward


def format_reward(s: Scored) -> float:
    return FORMAT_REWARD if s.well_formed else 0.0


def tool_reward(s: Scored) -> float:
    return TOOL_RIGHT if s.tool_match else TOOL_WRONG


def arguments_reward(s: Scored) -> float | None:
    if not s.gold_called:
        return None
    return ARGUMENTS_REWARD if s.args_correct else 0.0


def length_reward(s: Scored) -> float:
    return LENGTH_PENALTY if s.outside_text else 0.0


def answer_reward(s: Scored) -> float | None:
    if s.answer_correct is None:
        return None
    return ANSWER_REWARD if s.answer_correct else 0.0


def fine_grained_reward(s: Scored) -> float:
    return FINE_GRAINED_SCALE * (2.0 * s.fine_grained - 1.0)


COMPONENTS: dict[str, Callable[[Scored], float | None]] = {
    "format": format_reward,
    "tool": tool_reward,
    "arguments": arguments_reward,
    "length": length_reward,
    "answer": answer_reward,
    "fine_grained": fine_grained_reward,
}


def batch_metrics(scored: Sequence[Scored]) -> dict[str, float]:
    """Rates over a batch: valid_format_rate, tool_accuracy, argument_accuracy (gold-call items), answer_accuracy."""
    n = len(scored)
    out: dict[str, float] = {}
    if not n:
        return out
    out["valid_format_rate"] = sum(s.well_formed for s in scored) / n
    out["tool_accuracy"] = sum(s.tool_match for s in scored) / n
    called = [s for s in scored if s.gold_called]
    if called:
        out["argument_accuracy"] = sum(s.args_correct for s in called) / len(called)
    answered = [s for s in scored if s.answer_correct is not None]
    if answered:
        out["answer_accuracy"] = sum(bool(s.answer_correct) for s in answered) / len(answered)
    return out


__all__ = [
    "COMPONENTS",
    "DEFAULT_REWARDS",
    "REWARD_NAMES",
    "RewardSuite",
    "Scored",
    "batch_metrics",
    "check_reward_names",
    "fine_grained_score",
]
