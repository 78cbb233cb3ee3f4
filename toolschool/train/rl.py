"""Reinforcement learning from tool-use rewards, with TRL's GRPOTrainer.

GRPO samples `num_generations` completions per prompt from the current weights (on-policy: one optimisation pass
per generation batch), scores them with our rewards (toolschool.train.rewards, built on the evaluation module's
checks), turns rewards into group-relative advantages and optimises the clipped policy-gradient objective with a
KL penalty (`beta`) to the reference model. With LoRA (the default) the reference is the starting model itself,
obtained by disabling the adapter, so no second copy is held in memory.

Two modes:
- single_turn: the prompt is the conversation up to the first assistant turn, rendered by our chat format (any
  of hermes/json/react, each example with its own tools) as plain text; the gold is that assistant turn. Gold and
  expected answer travel through the dataset as JSON strings so the Arrow table stays one simple schema.
- multi_turn: the prompt is passed as messages and the run's tools (toolschool.tools.registry) as Python
  callables; TRL executes the calls the model writes, appends the observations and lets the model continue
  (`max_tool_iterations` rounds), masking the tool-output tokens from the loss. The final answer is rewarded
  against `meta.expected_answer`. TRL reads the calls with the chat template's response parser, so this mode
  needs the hermes format (`<tool_call>` JSON inside ChatML), which is what our template writes.

Everything a user can get wrong (an unknown reward, a dataset without expected answers in multi-turn mode, a
reference model with another tokenizer, a prompt too long) is refused before the model is trained.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolschool.chat.formats.base import offered_names
from toolschool.config import TRAIN_DTYPES, RLSection, ToolschoolConfig, dump_toml
from toolschool.errors import ConfigError, DataError, ToolschoolError
from toolschool.evaluate.items import scored_turn
from toolschool.evaluate.toolkens import model_toolkens
from toolschool.run_state import read_jsonl, write_text_atomic
from toolschool.train.common import (
    JsonlLogger,
    TrainingInputs,
    adapter_base_callback,
    base_identity,
    check_checkpoints,
    check_lora_targets,
    check_training_file,
    checkpoint_state,
    latest_checkpoint,
    log_callbacks,
    lora_config,
    refuse_existing_checkpoints,
    restart_log_at,
    save_final,
    sha256_file,
    training_lock,
)
from toolschool.train.rewards import RewardSuite, check_reward_names
from toolschool.train.validation import (
    build_validation_items,
    last_validation,
    load_validation_examples,
    validation_callback,
)

META_FILE = "toolschool_rl.json"
MODES = ("single_turn", "multi_turn")
# The loss formulations TRL's GRPOTrainer implements; GRPOConfig accepts any string and the trainer only fails at
# the first loss computation, after the model is loaded and a batch sampled.
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")


@dataclass
class RLResult:
    out_dir: Path
    adapter_dir: Path | None
    merged_dir: Path | None
    steps: int
    seconds: float
    last_log: dict[str, Any] = field(default_factory=dict)
    final_validation: dict[str, float] | None = None  # the last held-out validation's rates (None: no validation)
    # share of prompt groups whose completions' rewards differed (the only groups GRPO learns from); None: not logged
    groups_with_reward_spread: float | None = None
    precision: str = "fp32"  # what `[rl] dtype` resolved to here (`models.device.train_precision`): fp32 | bf16
    main_process: bool = True  # False in the other processes of an `accelerate launch` run (they save nothing)


# ------------------------------------------------------------------------------------------- checks


def check_settings(settings: RLSection, fmt: str, *, device: str | None = None, machine: bool = True) -> None:
    """Settings that do not need the model or the data (`fmt`: the student's format, `[model] format`): refused
    before anything is loaded. `machine=False` leaves out what depends on this machine (vLLM installed, a CUDA
    device), as `toolschool config show` does."""
    if settings.mode not in MODES:
        raise ConfigError(f"rl.mode = '{settings.mode}' is not a mode", hint=f"use one of: {', '.join(MODES)}")
    check_reward_names(settings.rewards, mode=settings.mode, weights=settings.reward_weights)
    if settings.method not in ("lora", "full"):
        raise ConfigError(f"rl.method = '{settings.method}' is not supported", hint="use lora or full")
    if settings.dtype not in TRAIN_DTYPES:
        raise ConfigError(f"rl.dtype = '{settings.dtype}' is not supported", hint=f"use {', '.join(TRAIN_DTYPES)}")
    if settings.loss_type not in LOSS_TYPES:
        raise ConfigError(
            f"rl.loss_type = '{settings.loss_type}' is not a TRL GRPO loss", hint=f"use one of: {', '.join(LOSS_TYPES)}"
        )
    if settings.scale_rewards not in ("group", "batch", "none"):
        raise ConfigError(
            f"rl.scale_rewards = '{settings.scale_rewards}' is not supported", hint="group | batch | none"
        )
    if settings.batch_size % settings.num_generations:
        raise ConfigError(
            f"rl.batch_size = {settings.batch_size} is not a multiple of "
            f"rl.num_generations = {settings.num_generations}",
            hint="each step holds whole groups: batch_size = prompts per step x num_generations",
        )
    if settings.mode == "multi_turn" and fmt != "hermes":
        raise ConfigError(
            f"rl.mode = 'multi_turn' needs the hermes format, not model.format = '{fmt}': TRL reads the calls during "
            "rollouts with the chat template's <tool_call> parser",
            hint="use --format hermes, or --mode single_turn for json/react",
        )
    if settings.ref_model and settings.beta == 0.0:
        raise ConfigError(
            f"rl.ref_model = '{settings.ref_model}' is unused with rl.beta = 0 (no KL penalty)",
            hint="set --beta above 0 or drop --ref-model",
        )
    if settings.use_vllm and machine:
        if device is not None and not device.startswith("cuda"):
            raise ConfigError(f"rl.use_vllm needs a CUDA GPU; this run is on '{device}'", hint="drop --use-vllm")
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise ConfigError(
                "rl.use_vllm is set but vllm is not installed", hint="pip install vllm, or drop --use-vllm"
            ) from None


# What RL is handed: the model it starts from (`toolschool run`: the SFT stage's), its training and validation files.
RLInputs = TrainingInputs

TRAIN_HINT = (
    "pass --train PATH or set [rl] train in the run's TOML (a JSONL of conversations; the [sft] train file serves "
    "too), or run `toolschool distill` first"
)


def check_train_file(path: Path) -> None:
    """RL's training file exists (`toolschool run` checks it before its first stage, the stage when it starts)."""
    check_training_file(path, TRAIN_HINT)


def expected_answer_of(example: dict[str, Any]) -> str | None:
    value = (example.get("meta") or {}).get("expected_answer")
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _line(lines: Sequence[int] | None, index: int) -> int:
    """The file line of the example at 1-based `index` (the reader skips blank lines, so they can differ)."""
    return lines[index - 1] if lines else index


def check_expected_answers(
    examples: Sequence[dict[str, Any]], source: str, *, lines: Sequence[int] | None = None
) -> None:
    missing = [_line(lines, i) for i, ex in enumerate(examples, 1) if expected_answer_of(ex) is None]
    if missing:
        shown = ", ".join(f"{source}:{i}" for i in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise DataError(
            f"multi-turn RL rewards the final answer, but {len(missing)} example(s) have no meta.expected_answer: "
            f"{shown}{more}",
            hint="add meta.expected_answer to every line, or use --mode single_turn",
        )


def check_reference_tokenizer(tokenizer: Any, ref_name: str) -> Any:
    """The KL compares token log-probabilities, so the reference must share the policy's tokenizer exactly."""
    from toolschool.models.loading import load_tokenizer

    ref_tokenizer = load_tokenizer(ref_name)
    if ref_tokenizer.get_vocab() != tokenizer.get_vocab():
        ours, theirs = len(tokenizer), len(ref_tokenizer)
        raise ConfigError(
            f"reference model '{ref_name}' uses another tokenizer than the model being trained "
            f"({theirs} tokens vs {ours}, different ids), so their token log-probabilities cannot be compared "
            "for the KL",
            hint="pass a reference with the same tokenizer (e.g. the SFT model you start from), or drop --ref-model",
        )
    return ref_tokenizer


# ------------------------------------------------------------------------------------------- datasets


def written_format(example: dict[str, Any]) -> str | None:
    """The text format a line is already written in (`meta.format` json/react, as `dataset build-calc-python`
    writes its json/ and react/ files: the system message holds the format's instructions and tools, the replies
    hold their calls as text), or None for a canonical (hermes) line."""
    value = (example.get("meta") or {}).get("format")
    return None if value in (None, "hermes") else str(value)


def check_written_format(
    examples: Sequence[dict[str, Any]], fmt_name: str, source: str, *, lines: Sequence[int] | None = None
) -> None:
    """Lines already written in another text format than the run's would be prompted and scored in the wrong one."""
    wrong = [(i, w) for i, ex in enumerate(examples, 1) if (w := written_format(ex)) is not None and w != fmt_name]
    if wrong:
        shown = ", ".join(f"{source}:{_line(lines, i)}" for i, _ in wrong[:5])
        more = f" and {len(wrong) - 5} more" if len(wrong) > 5 else ""
        written = wrong[0][1]
        raise DataError(
            f"{len(wrong)} example(s) are already written in the '{written}' format (meta.format), but RL uses "
            f"'{fmt_name}': {shown}{more}",
            hint=f"pass --format {written}, or train on the dataset's hermes (canonical) file",
        )


def check_start_model(model: str, settings: RLSection, fmt: str) -> None:
    """RL continues what SFT taught: a start model trained to write another format than `fmt` (`model.format`) would be
    rewarded for replies it never learned to write, and one with STE toolkens cannot run TRL's tool loop."""
    from toolschool.train.common import trained_format

    found = trained_format(model)
    if found is not None and found[0] != fmt:
        raise ToolschoolError(
            f"'{model}' was trained with the {found[0]} format ({found[1]}), but model.format = '{fmt}': "
            f"its replies would be read as {fmt} and rewarded as malformed",
            hint=f'pass --format {found[0]} (or set [model] format = "{found[0]}")',
        )
    if settings.mode == "multi_turn" and model_toolkens(model):
        raise ToolschoolError(
            f"rl.mode = 'multi_turn' cannot train a toolken model ('{model}' names its tools <tool_NAME>): TRL's tool "
            "loop runs the calls by the names the model writes",
            hint="use --mode single_turn, which reads its toolken calls as evaluation does",
        )


def toolken_examples(examples: Sequence[dict[str, Any]], toolkens: set[str]) -> Sequence[dict[str, Any]]:
    """For a start model trained with STE toolkens (`toolkens`: its tools), copies of the examples whose prompts
    offer and whose gold calls name each tool as `<tool_NAME>`, as SFT trained it and evaluation prompts it; the
    reward maps its `<tool_NAME>` calls back to the plain names. Other models get the examples as they are."""
    if not toolkens:
        return examples
    import copy

    from toolschool.chat.toolkens import rename_tools_and_calls, toolken

    out = copy.deepcopy(list(examples))
    for example in out:
        rename_tools_and_calls(example.get("tools") or [], example["messages"], toolken)
    return out


def build_single_turn_rows(
    examples: Sequence[dict[str, Any]],
    fmt: Any,
    tokenizer: Any,
    max_prompt_tokens: int,
    source: str,
    *,
    lines: Sequence[int] | None = None,
) -> list[dict[str, str]]:
    """One row per example: the format-rendered prompt text (with the generation prompt and prefill), the gold.

    A line already written in the format (`written_format`) is sent as it is: converting it again would add a
    second block of the format's instructions (with no tools), and its gold calls are read from the text."""
    rows, too_long = [], []
    for line, example in enumerate(examples, 1):
        item = scored_turn(example, line)
        # a line written in a text format: its gold calls read from the text (`gold_message`), its prompt sent as is
        prompt, gold = item.messages, item.gold_message
        if written_format(example) is None:
            messages, tools = fmt.to_messages(prompt, example.get("tools") or None)
        else:
            messages, tools = prompt, None
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        text += fmt.prefill
        length = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if length > max_prompt_tokens:
            too_long.append(f"{source}:{_line(lines, line)} ({length} tokens)")
            continue
        rows.append(
            {
                "prompt": text,
                "gold": json.dumps(gold),
                "expected_answer": expected_answer_of(example) or "",
                "offered": json.dumps(sorted(offered_names(example.get("tools")))),
            }
        )
    _refuse_too_long(too_long, max_prompt_tokens)
    return rows


def build_multi_turn_rows(
    examples: Sequence[dict[str, Any]],
    tokenizer: Any,
    tools: list[Callable[..., str]],
    max_prompt_tokens: int,
    source: str,
    *,
    lines: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """One row per example: the opening messages (system/user, as TRL renders them with the tools), gold, answer."""
    rows, too_long = [], []
    for line, example in enumerate(examples, 1):
        item = scored_turn(example, line)
        prompt, gold = item.messages, item.gold_turn
        messages = [{"role": m["role"], "content": str(m.get("content") or "")} for m in prompt]
        ids = tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        if len(ids) > max_prompt_tokens:
            too_long.append(f"{source}:{_line(lines, line)} ({len(ids)} tokens)")
            continue
        rows.append(
            {
                "prompt": messages,
                "gold": json.dumps(gold),
                "expected_answer": expected_answer_of(example),
                "offered": json.dumps(sorted(offered_names(example.get("tools")))),
            }
        )
    _refuse_too_long(too_long, max_prompt_tokens)
    return rows


def _refuse_too_long(too_long: list[str], limit: int) -> None:
    if too_long:
        more = f" and {len(too_long) - 5} more" if len(too_long) > 5 else ""
        raise DataError(
            f"{len(too_long)} prompt(s) are longer than rl.max_prompt_tokens = {limit}: "
            f"{', '.join(too_long[:5])}{more}",
            hint="raise --max-prompt-tokens or shorten those conversations",
        )


# ------------------------------------------------------------------------------------------- tools as callables

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def tool_callable(tool: Any, timeout: float | None = None) -> Callable[..., str]:
    """A Tool as the Python function TRL wants: typed signature + Google docstring; returns the observation text.

    TRL renders tools into the prompt through transformers' `get_json_schema(func)` and calls `func(**arguments)`.
    The signature and docstring are built from the tool's JSON schema so the rendered schema says what the tool
    says (types, descriptions, enums as "(choices: [...])", optional parameters defaulting to None). The body
    passes the arguments on unchanged, so the tool's own validation answers bad or unknown arguments with an
    error observation the model reads, as at evaluation time.
    """
    from toolschool.tools.registry import execute_with_timeout

    properties: dict[str, Any] = (tool.parameters or {}).get("properties") or {}
    required = set((tool.parameters or {}).get("required") or [])
    parameters, annotations, arg_docs = [], {}, []
    for name in sorted(properties, key=lambda n: n not in required):  # required first, as Python demands
        spec = properties[name] if isinstance(properties[name], dict) else {}
        kind = spec.get("type")
        py_type = _JSON_TYPES.get(kind[0] if isinstance(kind, list) and kind else kind, str)
        annotation = py_type if name in required else py_type | None
        default = inspect.Parameter.empty if name in required else None
        parameters.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        )
        annotations[name] = annotation
        doc = _one_line(spec.get("description") or f"the {name} argument")
        if spec.get("enum"):
            doc += f" (choices: {json.dumps(spec['enum'])})"
        arg_docs.append(f"    {name}: {doc}")

    def call(**kwargs: Any) -> str:
        arguments = {k: v for k, v in kwargs.items() if v is not None or k in required}
        return execute_with_timeout(tool, arguments, timeout).text  # a hung tool must not hang training

    description = _one_line(tool.description or tool.name)
    args_section = "\n\nArgs:\n" + "\n".join(arg_docs) if arg_docs else ""
    call.__doc__ = f"{description}{args_section}\n\nReturns:\n    The tool's output as text."
    call.__name__ = call.__qualname__ = tool.name
    call.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    call.__annotations__ = {**annotations, "return": str}
    return call


def multi_turn_tools(config: ToolschoolConfig, examples: Sequence[dict[str, Any]], source: str) -> tuple[Any, list]:
    """The run's registry restricted to the tools the dataset offers; every one must exist to be executed."""
    from toolschool.tools.registry import registry_for

    registry = registry_for(config.tools)
    wanted = sorted({t["function"]["name"] for ex in examples for t in ex.get("tools") or []})
    known = set(registry.names())
    missing = [n for n in wanted if n not in known]
    if missing:
        registry.close()
        raise ConfigError(
            f"multi-turn RL executes the calls, but {source} offers tool(s) {', '.join(missing)} that the run's tool "
            f"set does not have (it has: {', '.join(sorted(known)) or 'none'})",
            hint="add them with [tools] modules/mcp/toolbox, or train those examples with --mode single_turn",
        )
    names = wanted or sorted(known)
    return registry, [tool_callable(registry.get(n), registry.call_timeout) for n in names]


def _set_response_parser(tokenizer: Any) -> None:
    """TRL reads tool calls with the tokenizer's response template; ours writes Qwen/Hermes `<tool_call>` JSON."""
    _decode_string_arguments(tokenizer)
    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None):
        return
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    if "<tool_call>" not in template or "<|im_start|>" not in template:
        raise ConfigError(
            "multi-turn RL needs a ChatML chat template that writes tool calls as <tool_call> JSON (hermes); "
            "this model's template does not",
            hint="start from the embedded model or an SFT model toolschool saved, or use --mode single_turn",
        )
    from trl.chat_template_utils import add_response_schema, qwen3_template

    try:
        add_response_schema(tokenizer)
    except ValueError:
        tokenizer.response_template = qwen3_template


def _decode_string_arguments(tokenizer: Any) -> None:
    """Calls whose arguments are the JSON text of an object come back from the parser with those arguments as dicts.

    Our format parser (and so evaluation, which runs such a call) accepts `"arguments": "{...}"`; the template's
    parser keeps the string, and TRL's tool loop then calls `tool(**string)`, which only yields an error observation.
    Arguments that are no JSON object stay as they are (the format reward counts that call malformed).

    The parser is not given the tools: with them, transformers types each argument by the tool's schema ("7"
    becomes 7 for an integer), so the call would run where evaluation, which runs the arguments as written, gets
    the tool's "not of type" error; RL must reward what evaluation counts, not a call repaired for it.
    """
    from toolschool.chat.formats.base import coerce_arguments

    parse = tokenizer.parse_response
    if getattr(parse, "decodes_string_arguments", False):
        return

    def parse_response(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("tools", None)
        parsed = parse(*args, **kwargs)
        for call in (parsed.get("tool_calls") or []) if isinstance(parsed, dict) else []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                arguments, error = coerce_arguments(function["arguments"], "arguments")
                if error is None:
                    function["arguments"] = arguments
        return parsed

    parse_response.decodes_string_arguments = True  # type: ignore[attr-defined]
    tokenizer.parse_response = parse_response


# ------------------------------------------------------------------------------------------- logging


def flatten_log(logs: dict[str, Any]) -> dict[str, Any]:
    """TRL's `rewards/<name>/mean` also as `rewards/<name>` (the field the issue and our plots use)."""
    out = dict(logs)
    for key, value in logs.items():
        if key.startswith("rewards/") and key.endswith("/mean"):
            out[key[: -len("/mean")]] = value
    return out


def resume_settings(config: ToolschoolConfig) -> dict[str, Any]:
    """The settings a checkpoint and the run's data order depend on, as `rl.KEY` / `model.format` / `lora.KEY` /
    `run.seed` -> value.

    Another LoRA shape cannot load the checkpoint; another batch size, group size or seed makes the trainer skip
    other prompts than the ones the checkpoint trained on, and another format renders other prompts. Others
    (num_steps, learning rate, beta, rewards, temperature, intervals) may change, as with SFT.
    """
    settings, adapter = config.rl, config.lora
    lora = settings.method == "lora"
    return {
        "lora.rank": adapter.rank if lora else None,
        "lora.alpha": adapter.alpha if lora else None,
        "lora.target_modules": list(adapter.target_modules) if lora else None,
        "model.format": config.model.format,
        "rl.batch_size": settings.batch_size,
        "rl.num_generations": settings.num_generations,
        "run.seed": config.run.seed,
    }


def _check_resume(
    out_dir: Path,
    identity: dict[str, Any],
    mode: str,
    method: str,
    train: tuple[Path, str] | None = None,
    settings: dict[str, Any] | None = None,
) -> None:
    """Refuse to resume checkpoints of another base, mode or method (a LoRA checkpoint holds an adapter, a full one
    the whole model: the trainer cannot load one as the other), or (`train`: path, sha256; `settings`:
    `resume_settings`, both given when there is a checkpoint to resume) on other data or with other settings."""
    meta_path = out_dir / META_FILE
    if not meta_path.is_file():
        return
    saved = json.loads(meta_path.read_text())
    continued = settings is not None
    kept = {"rl.mode": saved.get("mode"), "rl.method": saved.get("method")}
    before = checkpoint_state(
        saved["base"],
        {**kept, **(saved.get("resume_settings") or {})} if continued else kept,
        saved.get("train_sha256") if train is not None else None,
    )
    now = checkpoint_state(
        identity, {"rl.mode": mode, "rl.method": method, **(settings or {})}, train[1] if train is not None else None
    )
    check_checkpoints(out_dir, before, now, base_model=saved["base"].get("model"))


# ------------------------------------------------------------------------------------------- the stage


def run_rl(
    config: ToolschoolConfig, inputs: RLInputs, out_dir: Path, *, resume: bool = False, progress: bool = True
) -> RLResult:
    """Train `inputs.start_model` on `inputs.train` with the config's settings into `out_dir`: checkpoints,
    train_log.jsonl, tensorboard/, adapter/ and merged/. It reads no other file than its inputs (and `out_dir`)."""
    with ExitStack() as held:  # the folder's lock, from when the run first looks into the folder
        return _run_rl(config, inputs, out_dir, resume=resume, progress=progress, held=held)


def _run_rl(
    config: ToolschoolConfig, inputs: RLInputs, out_dir: Path, *, resume: bool, progress: bool, held: ExitStack
) -> RLResult:
    from datasets import Dataset
    from trl import GRPOConfig

    from toolschool.chat.formats import get_format
    from toolschool.data.dataset import load_dataset_jsonl
    from toolschool.engine.shared_prompt_grpo import SharedPromptGRPOTrainer
    from toolschool.models.device import resolve_device, train_precision
    from toolschool.models.loading import load_model
    from toolschool.train.sft import check_has_assistant

    settings = config.rl
    device = resolve_device(config.model.device)
    check_settings(settings, config.model.format, device=device)
    fmt = get_format(config.model.format)
    start_model = inputs.start_model
    check_start_model(start_model, settings, fmt.name)
    toolkens = model_toolkens(start_model)
    inputs.check_files(TRAIN_HINT)
    train_path, validation_path = inputs.train, inputs.validation
    examples, report = load_dataset_jsonl(train_path, on_error="stop")
    train_sha256 = sha256_file(train_path)
    lines = report.kept_lines
    if not examples:
        raise DataError(f"training data '{train_path}' holds no examples")
    check_has_assistant(examples, str(train_path))
    check_written_format(examples, fmt.name, str(train_path), lines=lines)
    if settings.mode == "multi_turn":
        check_expected_answers(examples, str(train_path), lines=lines)
    validation_examples, validation_lines = load_validation_examples(
        validation_path, required=not inputs.validation_optional
    )
    check_written_format(validation_examples, fmt.name, str(validation_path), lines=validation_lines)
    checkpoint = latest_checkpoint(out_dir) if resume else None
    if not resume:
        refuse_existing_checkpoints(out_dir)  # an incomplete one too: a fresh run would mix with what it left

    start_adapter = _start_adapter(start_model)

    started = time.perf_counter()
    precision = train_precision(settings.dtype, device)
    # bf16 is mixed precision (`bf16=` below autocasts the products): the weights stay fp32, a LoRA run's base too,
    # since the sampler folds the adapter into its base (`engine.packed_weights`) and a bf16 base drops most of an
    # RL step's small deltas there, so the samples would come from the start model
    loaded = load_model(start_model, device=device, dtype="fp32", merge_adapter=True)
    model, tokenizer = loaded.model, loaded.tokenizer
    if settings.method == "full":
        # a start adapter merged in leaves every weight frozen as PEFT loaded it: full training must unfreeze them
        model.requires_grad_(True)
    else:
        check_lora_targets(model, config.lora.target_modules)
    if settings.ref_model:
        check_reference_tokenizer(tokenizer, settings.ref_model)
    identity = base_identity(loaded, start_model)
    settings_now = resume_settings(config)
    # before the first write (not earlier: a refused setting leaves no folder); a second run at once is refused here
    held.enter_context(training_lock(out_dir, "rl"))
    if resume and checkpoint:
        _check_resume(out_dir, identity, settings.mode, settings.method, (train_path, train_sha256), settings_now)
    elif resume:
        _check_resume(out_dir, identity, settings.mode, settings.method)
    restart_log_at(out_dir / "train_log.jsonl", checkpoint)

    registry = None
    tools: list[Callable[..., str]] = []
    if settings.mode == "multi_turn":
        _set_response_parser(tokenizer)
        registry, tools = multi_turn_tools(config, examples, str(train_path))
        rows: list[dict[str, Any]] = build_multi_turn_rows(
            examples, tokenizer, tools, settings.max_prompt_tokens, str(train_path), lines=lines
        )
    else:
        rows = build_single_turn_rows(
            toolken_examples(examples, toolkens),
            fmt,
            tokenizer,
            settings.max_prompt_tokens,
            str(train_path),
            lines=lines,
        )
    # Each step needs batch_size / num_generations distinct prompts; with fewer examples than that the sampler
    # would yield no batch at all and training would end at step 0. Cycle the examples up to one full step.
    prompts_per_step = settings.batch_size // settings.num_generations
    examples_used = len(rows)  # what the run trains on, as the report states it, not the cycled copies
    if 0 < len(rows) < prompts_per_step:
        rows = [rows[i % len(rows)] for i in range(prompts_per_step)]
    rewards = (
        settings.rewards
        if settings.mode == "single_turn" or "answer" in settings.rewards
        else [*settings.rewards, "answer"]
    )
    weights = (
        settings.reward_weights
        if settings.reward_weights is None or rewards == settings.rewards
        else [*settings.reward_weights, 1.0]
    )
    suite = RewardSuite(fmt, rewards, mode=settings.mode, toolkens=toolkens)
    # Held-out validation scores the first reply of each item as SFT's validation and `toolschool eval` do (each
    # item with its own tools, in the run's format, toolken names mapped back), greedy, in rl.max_tokens tokens.
    validation_items = build_validation_items(
        toolken_examples(validation_examples, toolkens),
        fmt,
        tokenizer,
        settings.validation_samples,
        settings.max_prompt_tokens,
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    # the settings this run trains with; every process of an `accelerate launch` writes them, so atomically
    write_text_atomic(
        out_dir / "config.toml", dump_toml(inputs.recorded(config, "rl", validates=bool(validation_examples)))
    )
    start_info = {
        "examples": examples_used,
        "mode": settings.mode,
        "rewards": rewards,
        "tools": [t.__name__ for t in tools],
        "validation_items": len(validation_items),
        "validation_prompts_over_max_length": sum(item.over_max_length for item in validation_items),
    }
    write_text_atomic(
        out_dir / META_FILE,
        json.dumps(
            {
                "base": identity,
                "mode": settings.mode,
                "format": fmt.name,
                "rewards": rewards,
                "method": settings.method,
                "examples": examples_used,
                "train_sha256": train_sha256,
                "resume_settings": settings_now,
            },
            indent=2,
        ),
    )
    logger = JsonlLogger(out_dir / "train_log.jsonl")
    peft_config = lora_config(config.lora) if settings.method == "lora" else None
    use_cpu = loaded.device == "cpu"
    args = GRPOConfig(
        output_dir=str(out_dir / "checkpoints"),
        max_steps=settings.num_steps,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=1,
        num_generations=settings.num_generations,
        num_iterations=1,  # one optimisation pass per generation batch: always on-policy
        max_completion_length=settings.max_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        beta=settings.beta,
        epsilon=settings.epsilon,
        loss_type=settings.loss_type,
        scale_rewards=settings.scale_rewards,
        reward_weights=weights,
        learning_rate=settings.learning_rate,
        logging_steps=settings.log_interval,
        save_strategy="steps",
        save_steps=settings.checkpoint_interval,
        seed=config.run.seed,
        data_seed=config.run.seed,
        report_to="none",
        use_cpu=use_cpu,
        bf16=precision == "bf16",
        activation_checkpointing=settings.gradient_checkpointing,  # transformers 5 name; the old one warns
        use_vllm=settings.use_vllm,
        vllm_mode="colocate",
        max_tool_calling_iterations=settings.max_tool_iterations if tools else None,
        log_completions=settings.log_completions,
        dataloader_num_workers=0,
        disable_tqdm=not progress,
        save_only_model=False,
        ddp_backend="gloo" if use_cpu and _distributed() else None,
    )
    try:
        trainer = SharedPromptGRPOTrainer(
            model=model,
            reward_funcs=suite.functions(),
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=peft_config,
            tools=tools or None,
            callbacks=[
                *log_callbacks(logger, out_dir / "tensorboard", start_info, flatten=flatten_log),
                validation_callback(
                    logger,
                    out_dir / "tensorboard",
                    tokenizer,
                    fmt,
                    validation_items,
                    interval=settings.validation_interval,
                    max_new_tokens=settings.max_tokens,
                    toolkens=bool(toolkens),
                    at_start=True,
                ),
                *([adapter_base_callback(start_model)] if settings.method == "lora" else []),
            ],
        )
        trainer.share_prompts = settings.share_prompts
        if settings.ref_model:
            _install_reference(trainer, settings.ref_model, device)
        elif start_adapter and settings.method == "full" and settings.beta:
            # TRL rebuilt the reference from the policy's config path: the bare base, without the start adapter
            _install_reference(trainer, start_model, device)
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    finally:
        if registry is not None:
            registry.close()

    adapter_dir, merged_dir = save_final(
        trainer,
        tokenizer,
        out_dir,
        method=settings.method,
        merge=settings.merge,
        model_name=start_model,
    )
    seconds = time.perf_counter() - started
    last = last_train_log(out_dir / "train_log.jsonl")
    main = trainer.is_world_process_zero()  # every process of an `accelerate launch` run gets here
    if main:
        logger.write({"event": "end", "step": trainer.state.global_step, "seconds": round(seconds, 1)})
    return RLResult(
        out_dir,
        adapter_dir,
        merged_dir,
        trainer.state.global_step,
        seconds,
        last,
        final_validation=last_validation(out_dir / "train_log.jsonl"),
        groups_with_reward_spread=reward_spread(out_dir / "train_log.jsonl"),
        precision=precision,
        main_process=main,
    )


def _start_adapter(model_name: str) -> str | None:
    """The LoRA adapter folder the start model is, if it is one.

    The model is loaded with that adapter merged in, and RL's LoRA is trained on top; its `adapter/` and
    checkpoints name the start adapter as their base (`common.adapter_base`), and the loader applies the chain.
    """
    from toolschool.models.loading import resolve_source
    from toolschool.models.spec import parse_model_spec

    spec = parse_model_spec(model_name)
    return resolve_source(spec)[1] if spec.kind == "local" else None


def _distributed() -> bool:
    """Launched by accelerate/torchrun with several processes (gloo is then the CPU backend)."""
    import os

    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _install_reference(trainer: Any, ref_name: str, device: str) -> None:
    """A reference other than the starting model: TRL builds its own only from the policy, so we set it after.

    It gets what TRL gives the references it builds: no dropout, and the fused LM head through which TRL's own
    log-prob pass (`--no-share-prompts`, or a batch the shared-prompt path leaves to TRL) reads `log_probs`.
    """
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    from toolschool.models.loading import load_model

    ref = load_model(ref_name, device=device, dtype="fp32", merge_adapter=True).model  # as the policy's weights
    ref.requires_grad_(False)
    disable_dropout_in_model(ref)
    add_fused_lm_head(ref, temperature=trainer.temperature, cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32)
    trainer.ref_model = trainer.accelerator.prepare_model(ref, evaluation_mode=True)


def last_train_log(path: Path) -> dict[str, Any]:
    """The last training record with a reward (what the run ended at)."""
    if not path.is_file():
        return {}
    for record in reversed(read_jsonl(path, strict=False)):
        if isinstance(record, dict) and "reward" in record:
            return record
    return {}


def reward_spread(path: Path) -> float | None:
    """The share of prompt groups whose rewards were not all equal, over the whole run (the mean of 1 -
    TRL's `frac_reward_zero_std` over the logged steps). A group whose completions all score the same gives
    every completion zero advantage: GRPO learns nothing from it, so a run near 0 here trains nothing."""
    values = [
        1.0 - float(r["frac_reward_zero_std"])
        for r in read_reward_curve(path)
        if isinstance(r.get("frac_reward_zero_std"), int | float)
    ]
    return round(sum(values) / len(values), 4) if values else None


def read_reward_curve(path: Path) -> list[dict[str, Any]]:
    """(step, reward, each component, kl, ...) records of a run's train_log.jsonl, for reports and plots."""
    if not path.is_file():
        return []
    return [r for r in read_jsonl(path, strict=False) if isinstance(r, dict) and "reward" in r]


__all__ = [
    "RLInputs",
    "RLResult",
    "build_multi_turn_rows",
    "build_single_turn_rows",
    "check_expected_answers",
    "check_reference_tokenizer",
    "check_settings",
    "check_train_file",
    "check_written_format",
    "flatten_log",
    "read_reward_curve",
    "run_rl",
    "tool_callable",
]
