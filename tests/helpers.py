"""Test data shared by several test files (imported as `helpers`; tests/ is on sys.path under pytest)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolschool.tools.registry import ToolRegistry

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# A tool whose arguments a random model can finish within a few tokens (a few words, a boolean, one digit): what
# the constrained-decoding tests offer.
PICK = {
    "type": "function",
    "function": {
        "name": "pick",
        "description": "Pick a colour.",
        "parameters": {
            "type": "object",
            "properties": {
                "colour": {"enum": ["red", "green", "blue"]},
                "bright": {"type": "boolean"},
                "size": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "required": ["colour", "bright", "size"],
            "additionalProperties": False,
        },
    },
}
HI = [{"role": "user", "content": "hi"}]


def save_tiny_llama(out: Path, tokenizer_dir: Path, *, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """A randomly initialised Llama with the real SmolLM2 tokenizer, saved like any Hugging Face model."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4 if hidden >= 64 else 2,
        num_key_value_heads=2 if hidden >= 64 else 1,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def hanging_and_doubling_tools(release: Any, started: list[Any]) -> ToolRegistry:
    """`stall(text)`, which records its thread in `started` and waits for `release` (a threading.Event) up to
    30 s, and `double(number)`, which answers at once: for tests of calls that hang."""
    import threading

    from toolschool.tools.functions import FunctionTool
    from toolschool.tools.registry import ToolRegistry

    def stall(text: str) -> str:
        """Never answers while the test lasts.

        Args:
            text: anything.
        """
        started.append(threading.current_thread())
        release.wait(30)
        return "late"

    def double(number: int) -> int:
        """Twice the number.

        Args:
            number: a number.
        """
        return 2 * number

    registry = ToolRegistry()
    registry.add(FunctionTool(stall), "test")
    registry.add(FunctionTool(double), "test")
    return registry


def after_result(message: dict) -> bool:
    """Whether a scripted explorer is asked for its final answer: the last message is a tool result, or the
    prompt exploration sends once a trial's calls are spent (prompts/hermes/answer.jinja)."""
    return message["role"] == "tool" or "Now reply to the person who asked" in str(message.get("content") or "")
