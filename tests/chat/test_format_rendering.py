"""The chat formats: defects found by using render / parse / the wire helpers as a demanding user would."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import CALC

from toolschool.chat.formats import FORMAT_NAMES, get_format
from toolschool.chat.types import tool_call

PY = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}


def _weighted_text(tokenizer: Any, rendered: Any) -> str:
    return tokenizer.decode([t for t, w in zip(rendered.input_ids, rendered.loss_weights, strict=True) if w == 1.0])


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("method", ["markers", "prefix"])
def test_reply_text_that_looks_like_an_end_token_is_weighted_to_its_end(tokenizer: Any, name: str, method: str) -> None:
    """`</s>` (HTML strikethrough) or `<|endoftext|>` written inside a reply is reply text, not its end: the whole
    reply and its `<|im_end|>` keep weight 1.0 (before the fix the weights stopped at the first such string)."""
    fmt = get_format(name)
    conv = [
        {"role": "user", "content": "How do I strike text in HTML, and what ends a GPT-2 document?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [tool_call("python", {"code": "print('<|endoftext|>' + ' ends it')"}, "c0")],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "<|endoftext|> ends it"},
        {"role": "assistant", "content": "Write <s>old</s> for struck text; <|endoftext|> ends a document."},
    ]
    rendered = fmt.render(conv, [CALC, PY], tokenizer, method=method)
    converted, _ = fmt.to_messages(conv, [CALC, PY])
    replies = [fmt.format_reply(m) if name == "hermes" else m["content"] for m in converted if m["role"] == "assistant"]
    assert _weighted_text(tokenizer, rendered) == "".join(r + "<|im_end|>" for r in replies)


@pytest.mark.parametrize("arguments", ['{"x": NaN}', '{"x": Infinity}', '{"x": 1e400}'])
def test_wire_arguments_that_are_not_json_numbers_are_refused_as_the_parsers_refuse_them(arguments: str) -> None:
    """A client (or the server's caller) sending NaN in arguments got a 200 and invalid JSON written back."""
    from toolschool.chat.types import arguments_from_wire

    with pytest.raises(ValueError, match="is not a JSON value|is out of range"):
        arguments_from_wire(arguments)


@pytest.mark.parametrize(("arguments", "got"), [([1, 2], "list"), (5, "int"), (True, "bool"), ("null", "null")])
def test_wire_arguments_of_a_wrong_type_raise_the_documented_value_error(arguments: Any, got: str) -> None:
    """`arguments_from_wire` promises a ValueError with a precise message (its callers catch ValueError); a list,
    number or boolean used to escape as json's TypeError ("the JSON object must be str, bytes or bytearray")."""
    from toolschool.chat.types import arguments_from_wire
    from toolschool.errors import DataError

    with pytest.raises(ValueError, match=f"tool-call arguments must be a JSON object, got {got}"):
        arguments_from_wire(arguments)
    message = {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": "x", "arguments": arguments}}],
    }
    with pytest.raises(DataError, match="tool call 'x' has arguments that are not a JSON object"):
        get_format("hermes").format_reply(message)


@pytest.mark.parametrize(
    ("name", "text", "error"),
    [
        (
            "hermes",
            '<tool_call>\n{"name": "calculator", "arguments": {"x": NaN}}\n</tool_call>',
            "the text inside <tool_call> is not valid JSON: NaN is not a JSON value",
        ),
        (
            "hermes",
            '<tool_call>\n{"name": "calculator", "arguments": "{\\"x\\": -Infinity}"}\n</tool_call>',
            "tool call 'calculator': \"arguments\" is a string that is not a valid JSON object: -Infinity is not a",
        ),
        ("json", '{"tool": "calculator", "args": {"x": Infinity}}', "the reply is not valid JSON: Infinity is not a"),
        ("json", '{"tool": "calculator", "args": {"x": 1e400}}', "the reply is not valid JSON: the number 1e400 is"),
        ("react", 'Action: calculator\nAction Input: {"x": NaN}', "Action Input is not valid JSON: NaN is not a JSON"),
    ],
)
def test_non_json_numbers_are_a_parse_error_not_arguments(name: str, text: str, error: str) -> None:
    """NaN / Infinity / 1e400 are not JSON (Python's json reads them as float nan/inf): accepted, they became
    arguments that are written back as invalid JSON (`{"x": NaN}`) into logs, datasets and OpenAI responses."""
    reply = get_format(name).parse(text)
    assert reply.error is not None and reply.error.startswith(error), reply.error
    assert not reply.calls


@pytest.mark.parametrize("answer", ["Action: none was needed, it is 4", "Thought: is what comes first"])
def test_react_final_answer_may_start_with_a_step_keyword(answer: str) -> None:
    """Only a keyword at the start of a line begins a new ReAct step; the answer on the `Final Answer:` line
    itself is the answer (it used to be reported as "Final Answer is empty")."""
    reply = get_format("react").parse(f"Thought: I know it.\nFinal Answer: {answer}\nThought: extra")
    assert reply.error is None, reply.error
    assert reply.final == answer


def test_a_template_that_drops_the_tool_schemas_is_not_taken_for_a_tool_template(tokenizer: Any) -> None:
    """The tool's name also appears in the probe's call, so finding it proved nothing: a ChatML template that
    renders calls and results but ignores `tools=` passed the check, and the model was then prompted without
    its tools' descriptions (load_tokenizer keeps a template that passes)."""
    import copy

    from toolschool.models.chat_template import renders_tool_calls

    assert renders_tool_calls(tokenizer) == (True, "tools, tool calls and tool results are rendered")
    no_schemas = copy.deepcopy(tokenizer)
    no_schemas.chat_template = (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
        "{%- for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{%- endfor %}"
        "<|im_end|>\n{%- endfor %}"
    )
    ok, reason = renders_tool_calls(no_schemas)
    assert not ok and reason == "the template drops the tool schema"


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("tool", ["calculator", "wetter_prüfen", "天气"])
def test_call_prefix_is_the_start_of_the_reply_the_model_was_trained_to_write(name: str, tool: str) -> None:
    """A forced call (serve's named tool_choice, explore's force_call) prefills `call_prefix`; it must be the text
    the chat template and format_reply write, or the model continues from a prefix it never saw (the name was
    written as JSON \\u escapes for a non-ASCII tool name while training wrote the name itself)."""
    fmt = get_format(name)
    reply = fmt.format_reply({"role": "assistant", "content": "", "tool_calls": [tool_call(tool, {"a": 1})]})
    assert reply.startswith(fmt.call_prefix(tool)), (reply, fmt.call_prefix(tool))


@pytest.mark.parametrize("tool", ["call", "response"])
def test_a_tool_whose_toolken_is_a_chat_tag_is_refused_with_a_clear_error(tool: str) -> None:
    """toolken('call') was '<tool_call>', the hermes call tag itself: SFT added it as a token and evaluation's
    `plain_names_in_text` turned every `<tool_call>` tag of the model's replies into 'call', so no call parsed."""
    from toolschool.chat.toolkens import plain_names_in_text, toolken
    from toolschool.errors import DataError

    with pytest.raises(DataError, match=f"tool name '{tool}' cannot become a toolken: <tool_{tool}> is a tag"):
        toolken(tool)
    reply = '<tool_call>\n{"name": "<tool_calculator>", "arguments": {}}\n</tool_call>'
    assert get_format("hermes").parse(plain_names_in_text(reply, {"calculator", tool})).calls == [
        tool_call("calculator", {})
    ]


def test_a_tokenizer_with_its_own_tool_call_tags_is_not_a_toolken_model(tokenizer: Any, tmp_path: Any) -> None:
    """Qwen2.5/Qwen3 tokenizers ship `<tool_call>` and `<tool_response>` as added tokens. Read as toolkens, every
    local Qwen folder (a download, or an SFT merged/checkpoint of a Qwen base) was evaluated as a toolken model
    for tools 'call' and 'response': its tools were renamed and each `<tool_call>` tag of its replies became
    'call', so no call parsed."""
    import copy

    from toolschool.chat.toolkens import plain_names_in_text
    from toolschool.evaluate.toolkens import model_toolkens

    qwen_like = copy.deepcopy(tokenizer)
    qwen_like.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tool_weekday>"])
    qwen_like.save_pretrained(tmp_path)
    assert model_toolkens(str(tmp_path)) == {"weekday"}
    reply = '<tool_call>\n{"name": "<tool_weekday>", "arguments": {}}\n</tool_call>'
    names = {"call", "response", "weekday"}  # even if a caller passes the tag names, the tags stay tags
    assert get_format("hermes").parse(plain_names_in_text(reply, names)).calls == [tool_call("weekday", {})]


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_generation_markers_that_leave_the_end_token_outside_still_weight_it(tokenizer: Any, name: str) -> None:
    """Many TRL-patched templates close `{% endgeneration %}` before `<|im_end|>`. The end-of-turn token is what
    teaches the model to stop; with such a template the markers method gave it weight 0 (the prefix method and our
    own template give it 1.0), so a model trained on it ran on to its token budget."""
    import copy

    conv = [
        {"role": "user", "content": "What is 6*7?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("calculator", {"expression": "6*7"}, "c0")]},
        {"role": "tool", "tool_call_id": "c0", "content": "42"},
        {"role": "assistant", "content": "42"},
    ]
    outside = copy.deepcopy(tokenizer)
    template = tokenizer.chat_template.replace(
        "(message.content or '') + '<|im_end|>\\n' }}", "(message.content or '') }}"
    )
    template = template.replace(
        "{{- '<|im_end|>\\n' }}\n        {%- endif %}\n        {%- endgeneration %}",
        "{%- endif %}\n        {%- endgeneration %}\n        {{- '<|im_end|>\\n' }}",
    )
    assert template.count("{%- endgeneration %}\n        {{- '<|im_end|>") == 1
    outside.chat_template = template
    marked = get_format(name).render(conv, [CALC], outside, method="markers")
    assert marked.text == get_format(name).render(conv, [CALC], tokenizer).text  # same text, only the markers moved
    expected = get_format(name).render(conv, [CALC], outside, method="prefix")
    assert _weighted_text(tokenizer, marked).count("<|im_end|>") == 2
    assert (marked.input_ids, marked.loss_weights) == (expected.input_ids, expected.loss_weights)
