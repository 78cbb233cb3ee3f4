"""Grammar-constrained decoding with xgrammar: a `Constraint` compiled against a tokenizer, one matcher per row.

How the local backend uses it (the way vLLM and SGLang integrate xgrammar): a request's constraint is compiled
once when the request is submitted (`GrammarCompiler.compile`, cached by structure, so the many requests of an
exploration or evaluation run that offer the same tools compile it once); every row (sample) of the request gets
its own `GrammarMatcher`; before each token is chosen the constrained rows' next-token bitmasks are filled and
applied to their logits (`mask_logits`: -inf for every token the grammar does not allow there), and the chosen
token is fed to the row's matcher (`advance`). Rows without a constraint are not touched.

Why xgrammar (bench/grammar_choice.py, docs/constrained.md): on this CPU it fills a next-token mask 2.5-4x faster
than llguidance at batch 16, the cost paid at every constrained token; its compile (20-35 ms for a tool set)
is paid once per distinct tool set; its grammar literals match the tokenizer's special tokens (Qwen's
`<tool_call>` is one token), and its structural tags express "free text, then calls" directly.

JSON values are held to the layout the formats write (`json.dumps`: `", "` / `": "`, no other whitespace, or
`json.dumps(indent=N)` where a node says `"indent": N`): the structure's JSON-schema nodes are replaced by grammars
compiled that way before the structure is compiled.
A schema the library cannot compile is a `ConstraintError` naming the tool (or response format), where in its
schema, and the construct, before any generation starts.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

import torch

from toolschool.chat.constraints import CODE_KEY, Constraint
from toolschool.errors import ToolschoolError

SEPARATORS = (", ", ": ")
# A program argument (`CODE_KEY`) is compiled as a const of this text, which is then replaced by `CODE_RULES`.
_CODE_MARKER = "toolschool-code-sentinel-7f3c"
# A JSON string holding Python code whose (), [] and {} balance outside string literals and comments, and whose
# string literals close: Python's own lexing, enough to refuse what a small model writes when it closes the call
# before the program (`print(3)}`). Literals: '...' (a " inside is JSON's \"), "..." (JSON \"...\"), a backslash
# escape inside either (JSON \\ then one character); triple quotes read as three literals; comments run to the
# JSON \n. All other JSON string content (escapes included) is free. Written as runs of a character class between
# the special items, not one item per character: xgrammar precomputes a token's fit inside a run, so a mask costs
# ~0.1 ms (SmolLM2) instead of ~70 ms, where every token would cross a rule boundary.
CODE_RULES = r"""
tsc_code_string ::= "\"" tsc_code "\""
tsc_code ::= tsc_run (tsc_special tsc_run)*
tsc_special ::= tsc_escape | tsc_nested | tsc_sq | tsc_dq | tsc_comment
tsc_nested ::= "(" tsc_code ")" | "[" tsc_code "]" | "{" tsc_code "}"
tsc_run ::= [^\0-\x1f\"\\()\[\]{}'#]*
tsc_unicode ::= "u" [0-9A-Fa-f] [0-9A-Fa-f] [0-9A-Fa-f] [0-9A-Fa-f]
tsc_escape ::= "\\" ([nrtbf/\\] | tsc_unicode)
tsc_any ::= [^\0-\x1f\"\\] | "\\" ([\"\\/bfnrt] | tsc_unicode)
tsc_sq ::= "'" [^\0-\x1f\"\\']* (("\\" ([nrtbf/\"] | tsc_unicode) | "\\\\" tsc_any) [^\0-\x1f\"\\']*)* "'"
tsc_dq ::= "\\\"" [^\0-\x1f\"\\]* (("\\" ([nrtbf/] | tsc_unicode) | "\\\\" tsc_any) [^\0-\x1f\"\\]*)* "\\\""
tsc_comment ::= "#" [^\0-\x1f\"\\]* (("\\" ([\"/bfrt] | tsc_unicode) | "\\\\") [^\0-\x1f\"\\]*)*
"""
# xgrammar prefixes its messages with a time and a source location: "[21:26:32] /project/cpp/x.cc:83: "
_LOCATION = re.compile(r"^\s*\[[\d:]+\]\s*\S+:\d+:\s*")


class ConstraintError(ToolschoolError):
    """A constraint cannot be compiled into a grammar (a schema construct the library does not support)."""

    def __init__(self, message: str, *, hint: str | None = None, param: str = "tools") -> None:
        super().__init__(message, hint=hint)
        self.param = param  # the request field at fault, for the server's 400


def _library_message(exc: BaseException) -> str:
    lines = [_LOCATION.sub("", line).strip() for line in str(exc).splitlines()]
    return "; ".join(line for line in lines if line) or type(exc).__name__


class GrammarCompiler:
    """Compiles constraints for one tokenizer (one per local backend); safe to call from several threads."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], *, cache_entries: int = 64) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        # the model's end-of-turn tokens end a constrained reply once its grammar is complete (and only then)
        self.info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids)
        )
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._schema_grammars: dict[str, str] = {}
        self.cache_entries = cache_entries
        self.compiles = 0  # structures compiled (cache misses), for tests and benchmarks

    def compile(self, constraint: Constraint) -> Any:
        """The compiled grammar of `constraint` (cached); ConstraintError if a schema in it cannot be compiled."""
        key = constraint.key()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        structure = self._canonical(constraint)
        try:
            compiled = self._compiler.compile_structural_tag(json.dumps(structure, ensure_ascii=False))
        except Exception as exc:  # noqa: BLE001 - the library raises RuntimeError/ValueError with its reason
            raise ConstraintError(
                f"the {constraint.describe()} constraint cannot be compiled into a grammar: {_library_message(exc)}",
                param=_param(constraint),
            ) from None
        with self._lock:
            self.compiles += 1
            self._cache[key] = compiled
            while len(self._cache) > self.cache_entries:
                self._cache.popitem(last=False)
        return compiled

    def check(self, constraint: Constraint) -> None:
        """ConstraintError if a schema of `constraint` cannot be compiled: every schema node of its structure (the
        tools', and the format's own built from them, such as hermes' fenced call), as `compile` meets them. Each
        schema's grammar is kept, not the whole structure's (which `compile` builds from them when a request needs
        it), so a check costs a request nothing and checking many constraints evicts no compiled grammar."""
        self._canonical(constraint)

    def matcher(self, compiled: Any) -> Any:
        """A fresh matcher (one row's grammar state) for a compiled grammar."""
        return self._xgr.GrammarMatcher(compiled)

    def _canonical(self, constraint: Constraint) -> dict[str, Any]:
        """The structure with each JSON-schema node replaced by its grammar in the formats' JSON layout; each
        schema is compiled alone first, so one the library refuses is named (tool, path, construct)."""
        grammars = {}
        for what, schema in constraint.schemas():
            grammars[_schema_key(schema, None)] = self._schema_grammar(what, schema, _param(constraint))
        structure = constraint.structure()
        for schema, indent in _schemas_in(structure):  # the format's own, and the layouts other than compact
            if _schema_key(schema, indent) not in grammars:
                what = f"the {constraint.format} format"
                grammars[_schema_key(schema, indent)] = self._schema_grammar(what, schema, "tools", indent)
        return _replace_schemas(structure, grammars)

    def _schema_grammar(self, what: str, schema: dict[str, Any], param: str, indent: int | None = None) -> str:
        key = _schema_key(schema, indent)
        with self._lock:
            cached = self._schema_grammars.get(key)
        if cached is not None:
            return cached
        try:
            ebnf = self._ebnf(schema, indent)
        except Exception as exc:  # noqa: BLE001 - see ConstraintError
            where = _failing_path(schema, self._ebnf)
            at = f" at {where}" if where else ""
            raise ConstraintError(
                f"{what}: its JSON schema cannot be compiled into a grammar{at}: {_library_message(exc)}",
                hint="simplify that part of the schema, or generate without constraints (--no-constrained)",
                param=param,
            ) from None
        with self._lock:
            self._schema_grammars[key] = ebnf
        return ebnf

    def _ebnf(self, schema: Any, indent: int | None = None) -> str:
        layout = {"separators": SEPARATORS} if indent is None else {"indent": indent, "separators": (",", ": ")}
        placed = _place_code(schema)
        grammar = self._xgr.Grammar.from_json_schema(
            json.dumps(placed, ensure_ascii=False), any_whitespace=False, **layout
        )
        if placed != schema:  # the program arguments: their const sentinel becomes the code grammar
            text = str(grammar).replace(f'\\"{_CODE_MARKER}\\"', '" tsc_code_string "')
            if _CODE_MARKER in text:  # the library printed the const another way: say so, never force the marker
                raise ValueError("a program argument's sentinel was not found in the compiled grammar")
            return text + CODE_RULES
        return str(grammar)


def _place_code(node: Any) -> Any:
    """`node` with every program argument's schema (marked `CODE_KEY`) replaced by a const sentinel."""
    if isinstance(node, dict):
        if node.get(CODE_KEY) is True:
            return {"const": _CODE_MARKER}
        return {key: _place_code(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_place_code(value) for value in node]
    return node


def _param(constraint: Constraint) -> str:
    """The request field a constraint comes from (the server names it in its 400)."""
    return "response_format" if constraint.response_format is not None else "tools"


def _schema_key(schema: Any, indent: int | None) -> str:
    return json.dumps([schema, indent], sort_keys=True, ensure_ascii=False)


def _schemas_in(node: Any) -> list[tuple[Any, int | None]]:
    """(schema, indent) of every JSON-schema node in a structure."""
    if isinstance(node, dict):
        if node.get("type") == "json_schema" and "json_schema" in node:
            return [(node["json_schema"], node.get("indent"))]
        return [schema for value in node.values() for schema in _schemas_in(value)]
    if isinstance(node, list):
        return [schema for value in node for schema in _schemas_in(value)]
    return []


def _replace_schemas(node: Any, grammars: dict[str, str]) -> Any:
    if isinstance(node, dict):
        if node.get("type") == "json_schema" and "json_schema" in node:
            return {"type": "grammar", "grammar": grammars[_schema_key(node["json_schema"], node.get("indent"))]}
        return {k: _replace_schemas(v, grammars) for k, v in node.items()}
    if isinstance(node, list):
        return [_replace_schemas(v, grammars) for v in node]
    return node


def _failing_path(schema: Any, compile_one: Any, path: str = "") -> str:
    """The deepest sub-schema (as a path like `properties.when.pattern`) that fails to compile on its own, or ""
    when only the whole fails. Sub-schemas that refer elsewhere ($ref) are not tried alone."""
    if not isinstance(schema, dict):
        return ""
    children: list[tuple[str, Any]] = []
    for key in ("properties", "patternProperties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            children += [(f"{key}.{name}", sub) for name, sub in schema[key].items()]
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            children.append((key, schema[key]))
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(schema.get(key), list):
            children += [(f"{key}[{i}]", sub) for i, sub in enumerate(schema[key])]
    for name, sub in children:
        if not isinstance(sub, dict) or "$ref" in json.dumps(sub):
            continue
        try:
            compile_one(sub)
        except Exception:  # noqa: BLE001 - this child fails alone: look deeper
            deeper = _failing_path(sub, compile_one, f"{path}{name}.")
            return deeper or f"{path}{name}"
    for key in ("pattern", "format", "type"):  # the node's own construct
        if key in schema and path:
            return f"{path}{key}"
    return path.rstrip(".")


# What closes what a constrained reply left open when its tokens run out (`closing_text`), tried in this order: a
# JSON string's quote, an object's and an array's bracket, a program's brackets and its literals' quotes (a '...'
# literal, and a "..." one, which is JSON's \"), the separator before a required key not yet written (the grammar
# then forces the key: `find_jump_forward_string`), the shortest value of a required number, boolean, array or
# object (1 for a number whose minimum is 1), a line end (a comment in a program, a react thought).
CLOSERS = ('"', "}", "]", ")", "'", '\\"', ", ", "0", "1", "false", "[", "{", "\n")


def _as_plain_strings(text: str) -> str:
    """`text` with its JSON strings' code read as plain text: brackets and quotes inside a string open nothing."""
    out, in_string, i = [], False, 0
    while i < len(text):
        char = text[i]
        if in_string and char == "\\":
            out.append("\\" + text[i + 1 : i + 2])
            i += 2
            continue
        if char == '"':
            in_string = not in_string
        out.append(char if not in_string or char in '"' else "x")
        i += 1
    return "".join(out)


# Where a call starts in a reply (hermes' tag, a react action's arguments, a fenced call): what is open is read from
# the last of them on (text before it is free, its quotes and braces open nothing).
_CALL_STARTS = ("<tool_call>", "Action Input:", "```json")
_PAIRS = {"(": ")", "[": "]", "{": "}"}


def open_structure_closing(text: str) -> str:
    """What closes the JSON (and, inside its string, the Python code) that `text` leaves open, read from its last
    call start (`_CALL_STARTS`) on: a comment's line end, a code literal's quote, the code's brackets, the string's
    quote, the objects' and arrays' brackets — innermost first. A guess to check against the grammar (a string that
    is not code reads its brackets as code too; `closing_text` checks it first), never used unchecked."""
    start = max((text.rfind(mark) + len(mark) for mark in _CALL_STARTS if mark in text), default=0)
    containers: list[str] = []  # JSON objects and arrays
    in_string = False
    code: list[str] = []  # inside a string: the code's open brackets
    literal: str | None = None  # inside a string: the open code literal, "'" or '\\"'
    comment = False
    i = start
    while i < len(text):
        char = text[i]
        if not in_string:
            if char == '"':
                in_string, code, literal, comment = True, [], None, False
            elif char in "{[":
                containers.append(char)
            elif char in "}]" and containers and _PAIRS[containers[-1]] == char:
                containers.pop()
            i += 1
            continue
        if char == "\\":  # a JSON escape: \" is a double quote of the code, \n a line end, \\ a backslash
            escaped = text[i + 1 : i + 2]
            if comment and escaped == "n":
                comment = False
            elif not comment and escaped == '"' and literal in (None, '\\"'):
                literal = None if literal else '\\"'
            i += 2
            continue
        if char == '"':
            in_string = False
        elif comment:
            pass
        elif literal == "'":
            literal = None if char == "'" else literal
        elif literal is None:
            if char == "#":
                comment = True
            elif char == "'":
                literal = "'"
            elif char in _PAIRS:
                code.append(char)
            elif char in ")]}" and code and _PAIRS[code[-1]] == char:
                code.pop()
        i += 1
    closing = ""
    if in_string:
        closing = ("\\n" if comment else "") + (literal or "") + "".join(_PAIRS[c] for c in reversed(code)) + '"'
    return closing + "".join(_PAIRS[c] for c in reversed(containers))


def _completes(matcher: Any, text: str) -> str | None:
    """`text` and then the grammar's forced text, when accepting them lets the grammar end; else None."""
    fork = matcher.fork()
    if not fork.accept_string(text):
        return None
    while not fork.is_completed():
        forced = fork.find_jump_forward_string()
        if not forced or not fork.accept_string(forced):
            return None
        text += forced
    return text


def closing_text(matcher: Any, reply: str | None = None, *, max_depth: int = 8, max_nodes: int = 4000) -> str | None:
    """A short text that completes what `matcher`'s grammar has open (so the reply may end); "" when it may end now;
    None when none is found. The matcher itself is not changed (all of it runs on forks).

    With the `reply` written so far, what its open structure needs (`open_structure_closing`: a program's
    brackets and quotes, then the JSON's) is tried first, checked against the grammar; otherwise the shortest
    text made of the grammar's forced text and `CLOSERS` (iterative deepening, within `max_depth` closers and
    `max_nodes` tries; none when `max_nodes` is 0): how required keys not yet written are filled in, and what no
    reading of the text covers.

    Why: a small model sampled at temperature 1 can write one string argument until max_tokens, and the reply is
    then no call at all; the local backend ends such a call with this text in the reply's last tokens instead
    (`LocalBackend`, a wrap-up of the call), so a constrained reply is complete whenever this finds an ending."""
    if reply is not None and not matcher.is_completed():
        for guess in (open_structure_closing(reply), open_structure_closing(_as_plain_strings(reply))):
            if guess and (checked := _completes(matcher, guess)) is not None:
                return checked
    fork = matcher.fork()
    nodes = 0

    def search(depth: int) -> str | None:
        nonlocal nodes
        forced = fork.find_jump_forward_string()
        jumped = bool(forced) and fork.accept_string(forced)
        prefix = forced if jumped else ""
        try:
            if fork.is_completed():
                return prefix
            if depth == 0:
                return None
            for closer in CLOSERS:
                nodes += 1
                if nodes > max_nodes:
                    return None
                if fork.accept_string(closer):
                    rest = search(depth - 1)
                    fork.rollback(1)
                    if rest is not None:
                        return prefix + closer + rest
            return None
        finally:
            if jumped:
                fork.rollback(1)

    if max_nodes <= 0:  # the reading of the reply only
        return "" if matcher.is_completed() else None
    for depth in range(max_depth + 1):  # iterative deepening: the first ending found is a shortest one
        found = search(depth)
        if found is not None or nodes > max_nodes:
            return found
    return None


class RowMasks:
    """The next-token masks of the constrained rows of a batch: a bitmask buffer reused from step to step."""

    def __init__(self, vocab_size: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def masked(self, logits_BV: torch.Tensor, matchers_B: list[Any]) -> torch.Tensor | None:
        """A copy of the logits with each constrained row's disallowed tokens at -inf (None if no row is
        constrained: the caller chooses from the logits as they are)."""
        rows = [i for i, m in enumerate(matchers_B) if m is not None]
        if not rows:
            return None
        batch = len(matchers_B)
        if self._bitmask.shape[0] < batch:
            self._bitmask = self._xgr.allocate_token_bitmask(batch, self.vocab_size)
        bitmask = self._bitmask[:batch]
        for i in rows:
            matchers_B[i].fill_next_token_bitmask(bitmask, i)
        masked_BV = logits_BV.float().clone() if logits_BV.dtype != torch.float32 else logits_BV.clone()
        if masked_BV.device.type != "cpu":
            bitmask = bitmask.to(masked_BV.device)
        self._xgr.apply_token_bitmask_inplace(masked_BV, bitmask, vocab_size=self.vocab_size, indices=rows)
        return masked_BV

    @staticmethod
    def advance(matchers_B: list[Any], tokens_B: list[int]) -> None:
        """Feed each constrained row its chosen token (a masked choice is always accepted)."""
        for matcher, token in zip(matchers_B, tokens_B, strict=True):
            if matcher is not None and not matcher.is_terminated():
                matcher.accept_token(token)
