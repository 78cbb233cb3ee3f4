"""The exploration prompts: editable Jinja template files, one folder per format.

Why files: the prompts are the part of STE a user most wants to tune (wording for a small model, another
language, a domain), so they live as plain text in `toolschool/explore/prompts/<format>/` and a run can point
`[explore] prompts = "DIR"` at a folder whose files replace the packaged ones by name. A file a format's folder
lacks comes from the `hermes` folder: `json` has its own only for the prompts that show how to write a call or
an answer (`trial`, `trial_followup`, `parse_error`), which must match what its parser reads.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2

from toolschool.errors import ConfigError

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
FALLBACK_FORMAT = "hermes"
TEMPLATE_NAMES = (
    "system",  # system message of every exploration conversation
    "imagine",  # first query of a conversation; gets the long-term memory
    "imagine_followup",  # later queries of an episode: build on what was discovered
    "imagine_values",  # imagine = "values_first": argument values for the tool; gets the long-term memory
    "imagine_request",  # imagine = "values_first": the request a person with those values would send
    "imagine_task",  # values_first, a tool that takes only a program: the request first; gets the long-term memory
    "imagine_program",  # ... then the program that answers it, written in a fresh conversation
    "trial",  # ask to solve the query just imagined (first trial of a conversation)
    "trial_followup",  # same for later trials
    "parse_error",  # fed back when a reply could not be parsed
    "call_retry",  # values first: fed back with a call the tool refused or that returned nothing, for the redraw
    # (fenced: a program tool's, redrawn as a ```python block)
    "no_feedback",  # what the model sees instead of observations in the no-execution-feedback ablation
    "answer",  # after the last call the trial allows: reply with the final answer now
    "call_limit",  # the answer to a call past the trial's budget of max_turns calls (not run)
    "reflect",  # "did you fulfil the query? Yes or No"
)


DEMONSTRATIONS_FILE = "demonstrations.json"
PERSONAS_FILE = "personas.json"
PROGRAMS_FILE = "programs.json"
CALCULATIONS_FILE = "calculations.json"

# The variables each template is rendered with (see toolschool.explore.episode), and sample values to try them
# with when the prompts are loaded: an override using one its template does not get fails before any work.
_TOOL_VARIABLES = ("tool", "description", "parameters", "tool_names", "max_turns", "code")
TEMPLATE_VARIABLES: dict[str, tuple[str, ...]] = {
    "system": ("tool",),
    "imagine": (*_TOOL_VARIABLES, "memory", "persona"),
    "imagine_followup": (*_TOOL_VARIABLES, "memory", "persona"),
    "imagine_values": (*_TOOL_VARIABLES, "memory", "persona", "situation", "fenced"),
    "imagine_request": ("description", "persona", "values", "code", "program"),
    "imagine_task": ("memory", "persona", "situation"),
    "imagine_program": ("query",),
    "trial": (*_TOOL_VARIABLES, "query"),
    "trial_followup": (*_TOOL_VARIABLES, "query"),
    "parse_error": (*_TOOL_VARIABLES, "error"),
    "call_retry": (*_TOOL_VARIABLES, "error", "fenced"),
    "no_feedback": (),
    "answer": (*_TOOL_VARIABLES, "result"),
    "call_limit": ("max_turns", "tool"),
    "reflect": _TOOL_VARIABLES,
}
_DEMONSTRATION_FIELDS: dict[str, type] = {
    "tool": str,
    "description": str,
    "parameters": dict,
    "query": str,
    "arguments": dict,
    "result": str,
    "answer": str,
}
_SAMPLE_VALUES: dict[str, Any] = {
    "tool": "example_tool",
    "description": "An example tool.",
    "parameters": '{"type": "object", "properties": {"x": {"type": "string"}}}',
    "tool_names": ["example_tool", "other_tool"],
    "max_turns": 4,
    "code": False,
    "memory": [{"query": "An earlier request.", "solved": "Yes"}, {"query": "Another one.", "solved": "No"}],
    "query": "A request.",
    "error": "the reply could not be parsed",
    "persona": "a baker scaling a recipe",
    "values": '{"x": "a value"}',
    "program": "print(7 * 250)",
    "fenced": False,
    "result": "42",
    "situation": "today is 2024-05-01; numbers at hand: 7, 250, 1200",
}


def template_environment(searchpath: list[str]) -> jinja2.Environment:
    """How every prompt template of the project is read: plain text (no escaping), a variable a template uses but
    is not given is an error rather than empty text, the file's last newline is not part of the prompt."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(searchpath),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        autoescape=False,
    )


def format_prompt_dir(format_name: str) -> Path:
    directory = PROMPTS_DIR / format_name
    return directory if directory.is_dir() else PROMPTS_DIR / FALLBACK_FORMAT


class PromptSet:
    """Renders the exploration templates for one format, with optional user overrides."""

    def __init__(self, format_name: str, override_dir: str | Path | None = None) -> None:
        searchpath: list[str] = []
        if override_dir is not None:
            override = Path(override_dir).expanduser()
            if not override.is_dir():
                raise ConfigError(
                    f"[explore] prompts = '{override_dir}' is not an existing folder",
                    hint=f"create it with files named like those in {PROMPTS_DIR / FALLBACK_FORMAT}, or unset it",
                )
            searchpath.append(str(override))
        searchpath += [str(format_prompt_dir(format_name)), str(PROMPTS_DIR / FALLBACK_FORMAT)]
        self.searchpath = searchpath
        self.format_name = format_name
        self._examples: list[dict[str, Any]] | None = None  # demonstrations(), read and checked once
        self._lists: dict[str, list[str]] = {}  # personas(), programs(), calculations(): each read, checked once
        self._program_requests: list[tuple[str, str]] | None = None  # program_requests(), read and checked once
        self._env = template_environment(searchpath)
        for name in TEMPLATE_NAMES:  # fail before any work if an override is broken
            try:
                self._env.get_template(f"{name}.jinja")
            except jinja2.TemplateSyntaxError as exc:
                raise ConfigError(f"prompt template {exc.filename}:{exc.lineno}: {exc.message}") from None
            self.render(name, **{key: _SAMPLE_VALUES[key] for key in TEMPLATE_VARIABLES[name]})

    def render(self, name: str, **variables: Any) -> str:
        try:
            return self._env.get_template(f"{name}.jinja").render(**variables).strip()
        except jinja2.UndefinedError as exc:
            available = TEMPLATE_VARIABLES.get(name, tuple(variables))
            raise ConfigError(
                f"prompt template '{name}.jinja' uses an unknown variable: {exc.message}",
                hint=f"{name}.jinja gets: {', '.join(available) or 'no variables'}",
            ) from None

    def fingerprint(self, demonstrations: int) -> str:
        """sha256 of every template this set renders and, when worked examples are shown, of their file: logged
        with each trial, so a resume with other or edited prompts is refused rather than mixed into the log."""
        import hashlib

        digest = hashlib.sha256()
        for name in (*TEMPLATE_NAMES, "memory"):
            source = self._env.loader.get_source(self._env, f"{name}.jinja")[0]  # type: ignore[union-attr]
            digest.update(f"{name}\0{source}\0".encode())
        path = self.demonstrations_path() if demonstrations > 0 else None
        if path is not None:
            digest.update(path.read_bytes())
        for label, name in (
            ("personas", PERSONAS_FILE),
            ("programs", PROGRAMS_FILE),
            ("calculations", CALCULATIONS_FILE),
        ):
            path = self._file_path(name)
            if path is not None:
                digest.update(label.encode() + b"\0" + path.read_bytes())
        return digest.hexdigest()[:16]

    def _file_path(self, name: str) -> Path | None:
        """A prompts data file: the first found on the search path, else the packaged one."""
        for folder in [*self.searchpath, str(PROMPTS_DIR)]:
            path = Path(folder) / name
            if path.is_file():
                return path
        return None

    def demonstrations_path(self) -> Path | None:
        """`demonstrations.json`: the first found on the search path, else the packaged one."""
        return self._file_path(DEMONSTRATIONS_FILE)

    def personas(self) -> list[str]:
        """Who might send an imagined request (`personas.json`), checked once: a ConfigError names the file."""
        return self._text_list(PERSONAS_FILE, "personas", "a baker scaling a recipe", "short descriptions of people")

    def programs(self) -> list[str]:
        """Kinds of program a tool that takes code is offered (`programs.json`), checked once."""
        return self._text_list(PROGRAMS_FILE, "programs", "sorts a list of words", "what a program does")

    def calculations(self) -> list[str]:
        """Kinds of calculation a tool that takes an arithmetic expression is offered (`calculations.json`)."""
        return self._text_list(
            CALCULATIONS_FILE, "calculations", "splits a bill among friends", "what a calculation works out"
        )

    def _text_list(self, name: str, key: str, example: str, what: str) -> list[str]:
        """The non-empty list of strings under `key` of the data file `name` (see `_file_path`), read once."""
        if key not in self._lists:
            import json

            path = self._file_path(name)
            hint = f'write {{"{key}": ["{example}", ...]}} ({what})'
            try:
                items = json.loads(path.read_text(encoding="utf-8"))[key] if path else []
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}: not a {key} file ({exc})", hint=hint) from None
            if not isinstance(items, list) or not items or not all(isinstance(i, str) and i.strip() for i in items):
                raise ConfigError(f'{path}: "{key}" must be a non-empty list of non-empty strings', hint=hint)
            self._lists[key] = [i.strip() for i in items]
        return list(self._lists[key])

    def program_requests(self) -> list[tuple[str, str]]:
        """The worked examples of a program tool's request-first step (`programs.json`'s "requests"): (situation,
        request) pairs, checked once; none when the file has no "requests"."""
        if self._program_requests is None:
            import json

            path = self._file_path(PROGRAMS_FILE)
            hint = 'write "requests": [{"situation": "...; a program that ...", "request": "a question"}, ...]'
            try:
                items = json.loads(path.read_text(encoding="utf-8")).get("requests", []) if path else []
            except (json.JSONDecodeError, AttributeError) as exc:
                raise ConfigError(f"{path}: not a programs file ({exc})", hint=hint) from None
            fields = ("situation", "request")
            if not isinstance(items, list) or not all(
                isinstance(i, dict) and all(isinstance(i.get(f), str) and i[f].strip() for f in fields) for i in items
            ):
                raise ConfigError(
                    f'{path}: "requests" must be a list of objects with a non-empty "situation" and "request"',
                    hint=hint,
                )
            self._program_requests = [(i["situation"].strip(), i["request"].strip()) for i in items]
        return list(self._program_requests)

    def situation(self, seed: int, tool: str, episode: int, slot: int, parameters: dict[str, Any] | None = None) -> str:
        """Details of one trial's situation for values-first imagination: a date and three numbers of different
        sizes, drawn by a hash of where the trial stands. Why: a small explorer picking argument values otherwise
        takes the description's own example every time ("5 km to mile", "1234 * 5678"), and a student trained on
        one value per tool learns the value, not how to read it from a request. They are offered ("you may use"),
        not imposed: units, names and text stay the explorer's choice.

        With the tool's `parameters` (JSON schema), a text argument that lists choices (an `enum`, or two or more
        short one-word examples quoted in its description: "km", "pound", "degC") is offered one of them as well, the
        same position in every such list (descriptions list matching examples side by side: "km" with "mile"),
        because a small explorer otherwise picks the first example every time (every unit request was km to mile);
        a from/to pair of them is offered the other way round half the time (`_paired_choices`).
        A tool that takes a program (`takes_code`) is offered a kind of program (`programs()`): told only to vary its
        programs, the 0.5B wrote the sum of a list in 11 of 16. One that takes an arithmetic expression
        (`takes_expression`) is offered a kind of everyday calculation (`calculations()`): without, the 0.5B wrote a
        product of two numbers stated in symbols ("1234 * 273") in 8 of 10, and a student taught on those read
        "(145 + 285) divided by 13" as 145 + 285."""
        import datetime as dt
        import hashlib
        import random

        key = hashlib.sha256(f"situation/{seed}/{tool}/{episode}/{slot}".encode()).digest()
        rng = random.Random(int.from_bytes(key[:8], "big"))
        date = dt.date(2015, 1, 1) + dt.timedelta(days=rng.randrange(16 * 365))
        numbers = [rng.randint(2, 12), rng.randint(13, 400), rng.randint(401, 9999)]
        rng.shuffle(numbers)
        text = f"today is {date.isoformat()}; numbers at hand: {', '.join(str(n) for n in numbers)}"
        if takes_code(tool, parameters):
            programs = self.programs()
            text += f"; a program that {programs[rng.randrange(len(programs))]}"
        elif takes_expression(tool, parameters):
            calculations = self.calculations()
            text += f"; a calculation that {calculations[rng.randrange(len(calculations))]}"
        picked = self.situation_choices(seed, tool, episode, slot, parameters)
        if picked:
            text += "; " + ", ".join(f'{name} "{value}"' for name, value in picked.items())
        return text

    def situation_choices(
        self, seed: int, tool: str, episode: int, slot: int, parameters: dict[str, Any] | None = None
    ) -> dict[str, str]:
        """The listed choices one trial's situation offers (see `situation`): {argument: value}, empty for a tool
        without any. The values-first step holds its draw to them where decoding is constrained
        (`ExploreContext.values_constraint`): offered only, the 0.5B took "km" to "mile" in 14 of 22 trials whatever
        the situation named, and the student then read "How many kilometers is 273 miles?" as km to mile."""
        import hashlib
        import random

        choices = _text_choices(parameters)
        if not choices:
            return {}
        key = hashlib.sha256(f"situation-choices/{seed}/{tool}/{episode}/{slot}".encode()).digest()
        rng = random.Random(int.from_bytes(key[:8], "big"))
        position = rng.randrange(max(len(options) for options in choices.values()))
        picked = {name: options[position % len(options)] for name, options in choices.items()}
        pairs = _paired_choices(choices)
        if pairs and rng.random() < 0.5:  # the other way round: "mile" to "km" as often as "km" to "mile"
            for first, second in pairs:
                picked[first], picked[second] = picked[second], picked[first]
        return picked

    def persona(self, seed: int, tool: str, episode: int, slot: int) -> str:
        """The persona of one trial: drawn from `personas()` by a hash of where the trial stands, so a resumed run
        draws the same one and each tool's trials spread over the list."""
        import hashlib

        personas = self.personas()
        key = hashlib.sha256(f"{seed}/{tool}/{episode}/{slot}".encode()).digest()
        return personas[int.from_bytes(key[:8], "big") % len(personas)]

    def demonstrations(self) -> list[dict[str, Any]]:
        """The worked examples, each checked for the fields the episode renders (a ConfigError naming the file).

        Read once per prompt set: every episode shows them, and the stage checks them before any work."""
        if self._examples is None:
            self._examples = self._read_demonstrations()
        return list(self._examples)

    def _read_demonstrations(self) -> list[dict[str, Any]]:
        import json

        path = self.demonstrations_path()
        if path is None:
            return []
        hint = (
            'write {"examples": [{"tool", "description", "parameters" (a JSON schema object), "query", '
            '"arguments" (an object), "result", "answer"}, ...]}'
        )
        try:
            examples = json.loads(path.read_text(encoding="utf-8"))["examples"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}: not a demonstrations file ({exc})", hint=hint) from None
        if not isinstance(examples, list):
            raise ConfigError(f'{path}: "examples" must be a list', hint=hint)
        for number, example in enumerate(examples, start=1):
            if not isinstance(example, dict):
                raise ConfigError(f"{path}: example {number} is not an object", hint=hint)
            for key, kind in _DEMONSTRATION_FIELDS.items():
                if key not in example:
                    raise ConfigError(f"{path}: example {number} has no '{key}'", hint=hint)
                if not isinstance(example[key], kind):
                    raise ConfigError(
                        f"{path}: example {number}: '{key}' must be a {'JSON object' if kind is dict else 'string'}",
                        hint=hint,
                    )
        return list(examples)

    def check_demonstrations(self, count: int) -> None:
        """Fail before any work when `count` worked examples cannot be shown as asked."""
        if count <= 0:
            return
        examples = self.demonstrations()
        if len(examples) < count:
            raise ConfigError(
                f"[explore] demonstrations = {count}, but {self.demonstrations_path()} holds {len(examples)} "
                "example(s)",
                hint=f"set demonstrations = {len(examples)} or fewer, or add examples to that file",
            )


_QUOTED_WORD = re.compile(r'"([^"\s]{1,20})"')


def _text_choices(parameters: dict[str, Any] | None) -> dict[str, list[str]]:
    """Each text argument's listed choices (see `PromptSet.situation`): its enum, else the short one-word examples
    quoted in its description when there are two or more."""
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(properties, dict):
        return {}
    choices: dict[str, list[str]] = {}
    for name, spec in properties.items():
        if not isinstance(spec, dict):
            continue
        enum = spec.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            choices[name] = list(enum)
        elif spec.get("type") == "string":
            quoted = list(dict.fromkeys(_QUOTED_WORD.findall(str(spec.get("description") or ""))))
            if len(quoted) >= 2:
                choices[name] = quoted
    return choices


# Argument names that say one value goes from one thing to another: from_unit / to_unit, source_lang / target_lang.
_PAIR_PREFIXES = (("from_", "to_"), ("source_", "target_"), ("src_", "dst_"), ("input_", "output_"))


def _paired_choices(choices: dict[str, list[str]]) -> list[tuple[str, str]]:
    """The pairs of choice arguments (`_text_choices`) whose names differ only by a from/to prefix (`_PAIR_PREFIXES`).
    Why: their examples are listed side by side one way ("km" with "mile"), and offered only that way, the 0.5B
    converted km to mile and never back; a student taught so read "How many kilometers is 273 miles?" as km to
    mile. The situation offers such a pair the other way round half the time."""
    pairs = []
    for start, end in _PAIR_PREFIXES:
        for name in choices:
            other = end + name[len(start) :]
            if name.startswith(start) and other in choices:
                pairs.append((name, other))
    return pairs


def takes_expression(tool: str, parameters: dict[str, Any] | None) -> bool:
    """Whether a tool takes an arithmetic expression (an argument `tools.base.is_expression_argument` calls one):
    its values-first situation names a kind of everyday calculation."""
    from toolschool.tools.base import is_expression_argument

    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(properties, dict):
        return False
    return any(is_expression_argument(tool, str(name), spec) for name, spec in properties.items())


def program_argument(tool: str, parameters: dict[str, Any] | None) -> str | None:
    """The argument of a tool whose only argument is a program (`takes_code`), else None. Values first, such a tool's
    values are asked for as a fenced program rather than a JSON object: a small coder model writes real,
    multi-line programs in a ```python block, but squeezes them onto one line inside a JSON string (the 0.5B's
    `def is_prime(n): if n <= 1: return False ...}`, or a program that only prints a string of numbers)."""
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(properties, dict) or len(properties) != 1 or not takes_code(tool, parameters):
        return None
    return str(next(iter(properties)))


def takes_code(tool: str, parameters: dict[str, Any] | None) -> bool:
    """Whether a tool takes a program (an argument `tools.base.is_code_argument` calls one). The values-first prompts
    ask such a tool for a program that prints a result, and for a request that says what the program must work out
    (`code` in the templates); any other tool gets argument values and a request that never mentions code."""
    from toolschool.tools.base import is_code_argument

    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(properties, dict):
        return False
    return any(is_code_argument(tool, str(name), spec) for name, spec in properties.items())
