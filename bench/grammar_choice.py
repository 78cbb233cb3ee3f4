"""xgrammar vs llguidance on this machine, for the grammars toolschool compiles: which library to constrain with.

Measured for each embedded model whose tokenizer is installed (smollm2-135m always; the Qwen ones once fetched):
- `tokenizer_s`: building the library's view of the vocabulary (once per backend);
- `compile_ms`: each built-in tool's arguments schema alone, and the hermes `tool_choice="required"` grammar over
  all six tools (`<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`, one or more), cold (the
  library's cache emptied), JSON written with `, ` / `: ` and no other whitespace in both;
- `mask_us_per_token`: walking one canonical call per tool token by token — fill the next-token bitmask, then
  accept the token — at batch 1 (one matcher) and batch 16 (16 matchers, each at its own point of its own call,
  filled with the library's batch call: xgrammar `BatchGrammarMatcher`, llguidance `LLExecutor`), per row.

Applying a filled bitmask to the logits is the same int32 layout for both and is not part of the comparison.
Each figure is the median of `--repeats` runs.

    .venv/bin/python bench/grammar_choice.py       # writes bench/results/grammar_choice.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import machine  # bench/ is the script's folder, first on sys.path

from toolschool.chat.formats import get_format
from toolschool.models.embedded import embedded_model, ensure_embedded, installed_parts, is_embedded
from toolschool.tools.builtin import BUILTIN_NAMES, builtin_schema

OUT = Path(__file__).parent / "results" / "grammar_choice.json"
HERMES = get_format("hermes")
TOOLS = [builtin_schema(name) for name in BUILTIN_NAMES]
# One realistic call per built-in tool, as the hermes template writes it.
CALLS = {
    "calculator": {"expression": "sqrt(2) * (1234 + 5678) / 3"},
    "python": {"code": "import math\nfor i in range(5):\n    print(i, math.factorial(i))"},
    "unit_convert": {"value": 12.5, "from_unit": "km", "to_unit": "mile"},
    "date_add": {"date": "2024-02-27", "days": -45},
    "date_diff": {"start_date": "2023-12-25", "end_date": "2024-07-04"},
    "weekday": {"date": "1969-07-20"},
}
SEPARATORS = (", ", ": ")


def call_text(name: str) -> str:
    return HERMES.format_reply(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": CALLS[name]}}],
        }
    )


def installed_models() -> dict[str, Path]:
    """The embedded models installed here (converted on first use), by name."""
    out = {}
    for name in ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        if not is_embedded(name):
            continue
        found, parts = installed_parts(embedded_model(name))
        if found == parts:
            out[name] = ensure_embedded(name, progress=False)
    return out


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 3)


# -- xgrammar ------------------------------------------------------------------------------------------------------


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, stop: list[int]) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        start = time.perf_counter()
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop)
        self.tokenizer_s = time.perf_counter() - start
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self.vocab_size = vocab_size

    def compile_schema(self, schema: dict[str, Any]) -> Any:
        self.compiler.clear_cache()
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=SEPARATORS)

    def compile_required(self) -> Any:
        self.compiler.clear_cache()
        tags = []
        for tool in TOOLS:
            function = tool["function"]
            ebnf = str(
                self.xgr.Grammar.from_json_schema(
                    json.dumps(function["parameters"]), any_whitespace=False, separators=SEPARATORS
                )
            )
            tags.append(
                {
                    "type": "tag",
                    "begin": HERMES.call_prefix(function["name"]),
                    "content": {"type": "grammar", "grammar": ebnf},
                    "end": "}\n</tool_call>",
                }
            )
        structure = {
            "type": "structural_tag",
            "format": {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": tags, "at_least_one": True},
        }
        return self.compiler.compile_structural_tag(json.dumps(structure))

    def matchers(self, compiled: Any, count: int) -> list[Any]:
        return [self.xgr.GrammarMatcher(compiled) for _ in range(count)]

    def bitmask(self, rows: int) -> Any:
        return self.xgr.allocate_token_bitmask(rows, self.vocab_size)

    def fill(self, matchers: list[Any], bitmask: Any) -> None:
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(bitmask, 0)
        else:
            self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def accept(self, matcher: Any, token: int) -> bool:
        return matcher.accept_token(token)

    def setup_batch(self) -> None:
        self.batch = self.xgr.BatchGrammarMatcher(max_threads="auto")


# -- llguidance ----------------------------------------------------------------------------------------------------


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab_size: int, stop: list[int]) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.llgt = llguidance.torch
        start = time.perf_counter()
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=stop)
        self.tokenizer_s = time.perf_counter() - start
        self.vocab_size = vocab_size
        self.special = {
            t.content: i
            for i, t in tokenizer.added_tokens_decoder.items()
            if t.content in ("<tool_call>", "</tool_call>")
        }

    @staticmethod
    def _json(schema: dict[str, Any]) -> dict[str, Any]:
        layout = {"whitespace_flexible": False, "item_separator": SEPARATORS[0], "key_separator": SEPARATORS[1]}
        return {**schema, "x-guidance": layout}

    def _literal(self, text: str) -> str:
        """A Lark literal; a tag the tokenizer holds as one special token (Qwen's <tool_call>) is that token: a
        llguidance string literal matches text tokens only, never special ones."""
        parts = []
        for piece in (
            text.replace("</tool_call>", "\0</tool_call>\0").replace("<tool_call>", "\0<tool_call>\0").split("\0")
        ):
            if not piece:
                continue
            token = self.special.get(piece)
            parts.append(f"<[{token}]>" if token is not None else json.dumps(piece))
        return " ".join(parts)

    def _matcher(self, grammar: str) -> Any:
        matcher = self.llg.LLMatcher(self.tokenizer, grammar)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return matcher

    def compile_schema(self, schema: dict[str, Any]) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(self._json(schema))
        self._matcher(grammar)  # llguidance compiles when a matcher is built
        return grammar

    def compile_required(self) -> Any:
        rules, names = [], []
        for i, tool in enumerate(TOOLS):
            function = tool["function"]
            opener = self._literal(HERMES.call_prefix(function["name"]))
            rules.append(f"call{i}: {opener} args{i} {self._literal(chr(125) + chr(10) + '</tool_call>')}")
            rules.append(f"args{i}: %json {json.dumps(self._json(function['parameters']))}")
            names.append(f"call{i}")
        grammar = self.llg.LLMatcher.grammar_from_lark("start: (" + " | ".join(names) + ")+\n" + "\n".join(rules))
        self._matcher(grammar)
        return grammar

    def matchers(self, compiled: Any, count: int) -> list[Any]:
        return [self._matcher(compiled) for _ in range(count)]

    def bitmask(self, rows: int) -> Any:
        return self.llgt.allocate_token_bitmask(rows, self.vocab_size)

    def fill(self, matchers: list[Any], bitmask: Any) -> None:
        if len(matchers) == 1:
            self.llgt.fill_next_token_bitmask(matchers[0], bitmask, 0)
        else:
            self.llgt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def accept(self, matcher: Any, token: int) -> bool:
        return matcher.consume_token(token)

    def setup_batch(self) -> None:
        self.executor = self.llg.LLExecutor()


# -- measurement ---------------------------------------------------------------------------------------------------


def walk(lib: Any, compiled: Any, token_lists: list[list[int]], skip: list[int] | None = None) -> float:
    """Seconds per row-token to fill and accept, walking `token_lists` (one per row) together until each ends;
    row i first accepts its first `skip[i]` tokens untimed, so the rows stand at different points of their calls."""
    skip = skip or [0] * len(token_lists)
    matchers = lib.matchers(compiled, len(token_lists))
    for matcher, tokens, k in zip(matchers, token_lists, skip, strict=True):
        for token in tokens[:k]:
            lib.accept(matcher, token)
    rests = [tokens[k:] for tokens, k in zip(token_lists, skip, strict=True)]
    bitmask = lib.bitmask(len(token_lists))
    steps = max(len(t) for t in rests)
    row_tokens = 0
    start = time.perf_counter()
    for step in range(steps):
        live = [(m, t[step]) for m, t in zip(matchers, rests, strict=True) if step < len(t)]
        lib.fill([m for m, _ in live], bitmask[: len(live)])
        for matcher, token in live:
            if not lib.accept(matcher, token):
                raise RuntimeError(f"{lib.name} refused token {token} at step {step}")
        row_tokens += len(live)
    return (time.perf_counter() - start) / row_tokens


def measure(lib_class: type, tokenizer: Any, vocab_size: int, stop: list[int], repeats: int) -> dict[str, Any]:
    lib = lib_class(tokenizer, vocab_size, stop)
    lib.setup_batch()
    compile_ms: dict[str, float] = {}
    for tool in TOOLS:
        function = tool["function"]
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            lib.compile_schema(function["parameters"])
            times.append(time.perf_counter() - start)
        compile_ms[function["name"]] = median_ms(times)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        required = lib.compile_required()
        times.append(time.perf_counter() - start)
    compile_ms["hermes_required_all_tools"] = median_ms(times)
    calls = [tokenizer(call_text(name), add_special_tokens=False)["input_ids"] for name in BUILTIN_NAMES]
    batch16 = [calls[i % len(calls)] for i in range(16)]
    skip16 = [i // len(calls) * 3 for i in range(16)]  # rows at different points of their calls
    mask_us = {
        "batch_1": round(statistics.median(walk(lib, required, [c]) for c in calls for _ in range(repeats)) * 1e6, 2),
        "batch_16": round(statistics.median(walk(lib, required, batch16, skip16) for _ in range(repeats)) * 1e6, 2),
    }
    return {"tokenizer_s": round(lib.tokenizer_s, 3), "compile_ms": compile_ms, "mask_us_per_token": mask_us}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    from importlib.metadata import version

    from toolschool.models.loading import load_tokenizer

    results: dict[str, Any] = {
        "machine": machine.describe(),
        "versions": {"xgrammar": version("xgrammar"), "llguidance": version("llguidance")},
        "repeats": args.repeats,
        "models": {},
    }
    for model, folder in installed_models().items():
        tokenizer = load_tokenizer(str(folder))
        config = json.loads((Path(folder) / "config.json").read_text())
        vocab_size = int(config["vocab_size"])
        stop = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in stop:
            stop.append(int(tokenizer.eos_token_id))
        results["models"][model] = {
            "vocab_size": vocab_size,
            **{cls.name: measure(cls, tokenizer, vocab_size, stop, args.repeats) for cls in (XGrammar, LLGuidance)},
        }
        print(model, json.dumps(results["models"][model], indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
