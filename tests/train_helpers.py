"""Training data, configs and models shared by the SFT and RL tests (on the tiny random model)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import CALC

from toolschool.config import MOVED_KEYS, load_config

# SFT


def _example(a: int, b: int) -> dict:
    expr = f"{a} * {b}"
    return {
        "messages": [
            {"role": "user", "content": f"What is {expr}?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c0",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": {"expression": expr}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c0", "content": str(a * b)},
            {"role": "assistant", "content": f"{expr} = {a * b}."},
        ],
        "tools": [CALC],
        "meta": {"tool": "calculator", "source": "test", "category": "calculator", "expected_answer": str(a * b)},
    }


def _write(path: Path, examples: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in examples))
    return path


def _key(section: str, key: str) -> str:
    """The config key of a helper's keyword: a key of `section`, or one that moved from it to the student's [model]
    or the shared [lora] (`format`, `toolkens`, `lora_rank`, ... as the stage's own keys were written)."""
    return MOVED_KEYS.get(f"{section}.{key}", f"{section}.{key}")


def train_sft(config, out_dir: Path, **kwargs: object):
    """`run_sft` on the inputs `toolschool sft` hands it for this config (`pipeline.training_inputs`)."""
    from toolschool.pipeline import training_inputs
    from toolschool.train.sft import run_sft

    return run_sft(config, training_inputs(config, "sft"), out_dir, **kwargs)


def train_rl(config, out_dir: Path, **kwargs: object):
    """`run_rl` on the inputs `toolschool rl` hands it for this config (`pipeline.training_inputs`)."""
    from toolschool.pipeline import training_inputs
    from toolschool.train.rl import run_rl

    return run_rl(config, training_inputs(config, "rl"), out_dir, **kwargs)


def _config(tmp_path: Path, model: Path, train: Path, validation: Path, **sft: object):
    overrides = {
        "run.root": str(tmp_path / "runs"),
        "run.name": "t",
        "model.name": str(model),
        "sft.train": str(train),
        "sft.validation": str(validation),
        "sft.batch_size": 2,
        "sft.num_steps": 4,
        "sft.max_length": 256,
        "lora.rank": 4,
        "lora.alpha": 8,
        "sft.checkpoint_interval": 2,
        "sft.log_interval": 1,
        "sft.validation_interval": 2,
        "sft.validation_samples": 2,
        "sft.validation_max_tokens": 8,
        "sft.warmup_steps": 0,
    }
    overrides.update({_key("sft", k): v for k, v in sft.items()})
    return load_config(None, overrides)


def _lora_model(tiny_model_dir: Path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear"))
    for name, param in model.named_parameters():
        if "lora_B" in name:  # B starts at zero; non-zero values make the adapter change the prefix's keys/values
            torch.nn.init.normal_(param, std=0.05)
    return model


# RL

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "the expression, e.g. 2*(3+4)"}},
            "required": ["expression"],
        },
    },
}


def calc_example(a: int, b: int) -> dict:
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": f"{a}*{b}"}}}
    return {
        "messages": [
            {"role": "user", "content": f"What is {a} times {b}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": str(a * b)},
            {"role": "assistant", "content": f"{a} times {b} is {a * b}."},
        ],
        "tools": [CALC_TOOL],
        "meta": {"expected_answer": str(a * b)},
    }


def answer_example() -> dict:
    return {
        "messages": [
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
        ],
        "tools": [CALC_TOOL],
        "meta": {"expected_answer": "Paris"},
    }


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rl_config(model: Path, train: Path, **rl: object):
    overrides = {
        "model.name": str(model),
        "model.device": "cpu",
        "rl.train": str(train),
        "rl.num_steps": 2,
        "rl.batch_size": 4,
        "rl.num_generations": 2,
        "rl.max_tokens": 8,
        "rl.log_interval": 1,
        "rl.checkpoint_interval": 1,
        "rl.learning_rate": 1e-3,
    }
    overrides.update({_key("rl", k): v for k, v in rl.items()})
    return load_config(None, overrides)


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def save_sft_like_adapter(base: Path, out: Path) -> Path:
    """A LoRA adapter on `base` that changes the model, as a trained SFT adapter does (saved like one)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    torch.manual_seed(0)
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.5)
    peft_model.save_pretrained(out)
    return out
