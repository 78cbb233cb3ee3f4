"""Examples shown at the end of each command's `--help`: the README's command lines, so that `toolschool sft
--help` shows how the flags are used together, not only their list (tests/scenarios/test_config.py keeps the
"Every command, by example" block of docs/pipeline.md and these in step)."""

from __future__ import annotations

from rich.markup import escape

EXAMPLES: dict[str, tuple[str, ...]] = {
    "run": (
        "toolschool run configs/demo.toml",
        "toolschool run configs/demo.toml --from sft",
        'toolschool run configs/demo.toml --run strong --explorer "openai:http://127.0.0.1:8000/v1#Qwen/Qwen2.5-7B-Instruct"',
    ),
    "explore": (
        "toolschool explore configs/demo.toml --tools calculator",
        "toolschool explore --toolbox builtin --tools calculator,weekday --model smollm2-135m --episodes 15 "
        "--stm-slots 3 --max-turns 4 --concurrency 16 --run demo",
        "toolschool explore --config run.toml --resume",
        "toolschool explore --model openai:http://127.0.0.1:8000/v1#teacher --format react --no-reflection",
    ),
    "distill": (
        "toolschool distill --run demo",
        "toolschool distill --trials runs/demo/explore/trials.jsonl --out runs/demo/distill",
        "toolschool distill --run demo --judge-model smollm2-135m --paraphrase-model "
        "openai:http://127.0.0.1:8000/v1#teacher --target-per-tool 30 --max-paraphrases 3",
    ),
    "dataset build-calc-python": (
        "toolschool dataset build-calc-python --gsm8k train.jsonl --cruxeval cruxeval.jsonl --instructions flan.json "
        "--out data/",
        "toolschool dataset build-calc-python --gsm8k gsm8k/train.jsonl --cruxeval cruxeval/cruxeval.jsonl "
        "--instructions ste/flan_v2_2k.json --size 1000 --ratio calculator=0.4 --ratio python_exec=0.3 "
        "--ratio no_tool=0.3 --formats hermes,json --seed 0 --out data/calc_python",
    ),
    "dataset validate": ("toolschool dataset validate data/calc_python/hermes/train.jsonl",),
    "dataset stats": ("toolschool dataset stats data/calc_python/json/train.jsonl --json",),
    "dataset heldout": ("toolschool dataset heldout --out heldout.jsonl --per-tool 6 --no-tool 4",),
    "sft": (
        "toolschool sft --train data/hermes/train.jsonl --validation data/hermes/validation.jsonl --num-steps 100",
        "toolschool sft run.toml --batching padding_free",
        "toolschool sft run.toml --resume",
        "accelerate launch --num_processes 8 -m toolschool sft run.toml --model Qwen/Qwen2.5-1.5B-Instruct "
        "--method full",
    ),
    "rl": (
        "toolschool rl --model runs/default/sft/merged --train data/hermes/train.jsonl --steps 50",
        "accelerate launch --num_processes 8 -m toolschool rl run.toml --model runs/big/sft/merged --use-vllm",
    ),
    "eval": (
        "toolschool eval --model smollm2-135m --model runs/default/sft/merged --data data/hermes/validation.jsonl "
        "--execute",
        "toolschool eval -b bfcl:simple_python,multiple,parallel,parallel_multiple,irrelevance --limit 20",
        "toolschool eval --data test.jsonl --format json --icl 3 --demos train.jsonl",
        "toolschool eval --benchmark ste --data ../shared/data/ste/tool_test_dev.json",
        "toolschool eval -m runs/default/sft/checkpoints/checkpoint-100 -n 50",
    ),
    "report": ("toolschool report runs/default",),
    "continual": (
        "toolschool continual --batches batches.json --data data.jsonl --compare",
        "toolschool continual --batches batches.json --data data.jsonl --steps-per-round 200",
        "toolschool continual --batches batches.json --data data.jsonl --no-replay",
    ),
    "tools list": (
        'toolschool tools list --mcp "mcp-server-time"',
        "toolschool tools list --json",
        "toolschool tools list --toolbox builtin --module my_tools --mcp mcp-server-time --only calculator",
    ),
    "tools call": (
        """toolschool tools call calculator '{"expression": "1234 * 5678"}'""",
        'toolschool tools call get_current_time \'{"timezone": "Asia/Tokyo"}\' --mcp mcp-server-time',
    ),
    "models list": ("toolschool models list",),
    "models install": ("toolschool models install qwen2.5-coder-1.5b",),
    "models info": ('toolschool models info --model smollm2-135m --prompt "What is 1234 * 5678?"',),
    "serve": (
        "toolschool serve --model runs/default/sft/merged --served-name default --port 8000",
        "toolschool serve --model smollm2-135m --port 8000",
    ),
    "generate": (
        'toolschool generate --model openai:http://127.0.0.1:8000/v1#default --prompt "What is 17 * 23?" '
        "--tool calculator",
        'toolschool generate --model smollm2-135m --prompt "What is 1234 * 5678?" --tool calculator',
    ),
    "config show": ("toolschool config show configs/demo.toml",),
}


def epilog(command: str) -> str | None:
    """The `--help` epilog of `command` ("sft", "tools call"): its examples, one a line (rich markup escaped)."""
    lines = EXAMPLES.get(command)
    if not lines:
        return None
    return "Examples:\n" + "\n".join(f"  {escape(line)}" for line in lines)
