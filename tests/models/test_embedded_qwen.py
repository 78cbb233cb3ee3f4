"""Integration: the Qwen2.5-Coder explorer as a user gets it (`toolschool models install qwen2.5-coder-0.5b`).

Skipped, with the reason, where its packages are not installed (`make test` does not need them; `make demo`
installs them). Loads the converted model from the cache and checks what the rest of the project relies on.
"""

from __future__ import annotations

import pytest

from toolschool.models.embedded import is_available

NAME = "qwen2.5-coder-0.5b"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not is_available(NAME),
        reason=f"{NAME} is not installed (toolschool models install {NAME}; make demo installs it)",
    ),
]


@pytest.fixture(scope="module")
def qwen():
    from toolschool.models.loading import load_model

    return load_model(NAME, dtype="fp32")


def test_keeps_its_own_template_and_stops_at_im_end(qwen) -> None:
    from toolschool.models.chat_template import renders_tool_calls

    tokenizer = qwen.tokenizer
    # the GGUF stores the output layer apart from the embeddings (quantised otherwise), so they stay untied: the
    # published 0.49 B counts the embeddings once
    assert 480e6 < qwen.num_parameters - qwen.model.lm_head.weight.numel() < 500e6
    assert tokenizer.eos_token == "<|im_end|>"
    ok, reason = renders_tool_calls(tokenizer)
    assert ok, reason
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "You are Qwen, created by Alibaba Cloud." in text  # its own template, not the project's ChatML one


def test_a_greedy_reply_is_read_as_a_call_to_the_offered_tool(qwen) -> None:
    import torch

    from toolschool.chat.formats import get_format
    from toolschool.tools.builtin import builtin_schema

    tools = [builtin_schema("weekday"), builtin_schema("calculator")]
    ids = qwen.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What day of the week was 2021-03-04?"}],
        tools=tools,
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.inference_mode():
        out = qwen.model.generate(**ids, max_new_tokens=48, do_sample=False)
    reply = qwen.tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    parsed = get_format("hermes").parse(reply, tools)
    assert [c["function"]["name"] for c in parsed.calls] == ["weekday"], reply
    assert parsed.calls[0]["function"]["arguments"] == {"date": "2021-03-04"}, reply
