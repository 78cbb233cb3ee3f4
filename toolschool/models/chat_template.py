"""The ChatML tool-calling chat template and its response parser.

SmolLM2's own template cannot render tools, tool calls or tool results. We give such tokenizers a
Hermes/Qwen2.5-style ChatML template (`chatml_tools.jinja`, with `{% generation %}` markers so TRL can
mask the loss to assistant tokens) and a transformers `response_template` so that
`tokenizer.parse_response(...)` (used by transformers serving and TRL) turns generated text back into an
OpenAI-style assistant message with `tool_calls`.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

CHATML_TOOLS_TEMPLATE: str = (
    resources.files("toolschool.models").joinpath("chatml_tools.jinja").read_text(encoding="utf-8")
)

# transformers >= 5.13 `response_template`: same grammar as the Qwen2.5/Qwen3 Hermes-style tool calls.
CHATML_TOOLS_RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {
            "close_pattern": r"<\|im_end\|>\s*",
            "content": "text",
        },
    },
}

_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool_zq",
        "description": "Probe tool used to check that a chat template renders tools.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def renders_tool_calls(tokenizer: Any) -> tuple[bool, str]:
    """Check whether the tokenizer's chat template renders tools, an assistant tool call and a tool result.

    Returns (ok, reason). The check renders a small conversation and looks for the tool's name, the call's
    argument value and the tool's output in the text: a template that silently drops any of them would
    teach or prompt the model without the information.
    """
    if not getattr(tokenizer, "chat_template", None):
        return False, "the tokenizer has no chat template"
    messages = [
        {"role": "user", "content": "What is 6*7?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "probe_tool_zq", "arguments": {"expression": "6*7 + 0.123"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "name": "probe_tool_zq", "content": "42.123 probe-output"},
    ]
    try:
        text = tokenizer.apply_chat_template(messages, tools=[_PROBE_TOOL], tokenize=False)
    except Exception as exc:  # a third-party template can fail in many ways; report, never crash
        return False, f"rendering failed: {type(exc).__name__}: {exc}"
    # The schema is looked for by its description: the tool's name is also in the call, so it proves nothing.
    missing = [
        what
        for what, needle in (
            ("tool schema", _PROBE_TOOL["function"]["description"]),
            ("call arguments", "6*7 + 0.123"),
            ("tool result", "42.123 probe-output"),
        )
        if needle not in text
    ]
    if missing:
        return False, "the template drops the " + ", ".join(missing)
    return True, "tools, tool calls and tool results are rendered"


def install_chatml_tools_template(tokenizer: Any) -> None:
    """Give a ChatML tokenizer our tool template, response parser and <|im_end|> as eos/pad."""
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    tokenizer.response_template = json.loads(json.dumps(CHATML_TOOLS_RESPONSE_TEMPLATE))
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|im_end|>"
