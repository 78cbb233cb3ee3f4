"""Render a conversation into token ids and per-token loss weights (1.0 on what the assistant writes).

Why char spans and per-segment tokenization: the tokens the model is trained on must be the tokens it sees and
writes at generation time. At generation the prompt ends with the assistant header (`<|im_start|>assistant\\n`)
and the model writes the reply after it, so the text is cut at the start and end of each assistant reply and
each piece is tokenized on its own; the assistant pieces get weight 1.0. The end-of-turn token (`<|im_end|>`)
is part of the reply (the model must learn to stop); whatever the template puts after it (a newline) is not,
and neither is the role header.

Finding the replies: with `{% generation %}` markers in the template (ours has them, for TRL) the marked
spans are used, trimmed to exclude the assistant header and anything after the end-of-turn token, and
extended over that token when the template writes it just after `{% endgeneration %}`. Without
markers, each reply is the difference between the conversation rendered up to the reply with a generation
prompt and rendered including the reply ("incremental prefix"), which works for any ChatML-like template
whose rendering of a conversation prefix is a prefix of the whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from toolschool.errors import ToolschoolError

Method = Literal["auto", "markers", "prefix"]

# End-of-turn tokens of common chat templates; the tokenizer's own eos token is tried first.
END_OF_TURN_TOKENS: tuple[str, ...] = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "</s>", "<|endoftext|>")

_GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass
class Rendered:
    """A tokenized conversation: `loss_weights[i]` is 1.0 where token i was written by the assistant."""

    input_ids: list[int]
    loss_weights: list[float]
    text: str = ""
    # Character spans of `text` with weight 1.0, one per assistant reply.
    assistant_spans: list[tuple[int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return int(sum(1 for w in self.loss_weights if w > 0))


def _clean(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop None-valued keys, as `apply_chat_template` does (templates crash on `content=None`)."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def _template(tokenizer: Any, tools: list[dict[str, Any]] | None) -> str:
    try:
        return tokenizer.get_chat_template(None, tools)
    except Exception as exc:  # no template at all, or an unknown named template
        raise ToolschoolError(
            f"the tokenizer has no usable chat template: {exc}",
            hint="use a chat (instruct) model, or a ChatML tokenizer that toolschool can give its tool template",
        ) from exc


def _render_text(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool,
    with_markers: bool = False,
) -> tuple[str, list[tuple[int, int]]]:
    """The template's text for a conversation and, with markers, the `{% generation %}` char spans."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = _template(tokenizer, tools)
    try:
        texts, indices = render_jinja_template(
            conversations=[_clean(messages)],
            tools=tools,
            chat_template=template,
            return_assistant_tokens_mask=with_markers,
            add_generation_prompt=add_generation_prompt,
            **tokenizer.special_tokens_map,
        )
    except ToolschoolError:
        raise
    except Exception as exc:  # a template raising (e.g. "roles must alternate") is a data/model mismatch
        raise ToolschoolError(
            f"the chat template failed to render the conversation: {type(exc).__name__}: {exc}",
            hint="check the message roles and order (system?, user, assistant, tool, ...) for this model",
        ) from exc
    return texts[0], [tuple(span) for span in (indices[0] if indices else [])]


def _end_tokens(tokenizer: Any) -> list[str]:
    eos = getattr(tokenizer, "eos_token", None)
    tokens = [eos] if isinstance(eos, str) and eos else []
    return tokens + [t for t in END_OF_TURN_TOKENS if t not in tokens]


def _trim_end(text: str, start: int, end: int, end_tokens: list[str]) -> int:
    """End a reply right after its end-of-turn token (the template's newline after it is not the model's).

    The end token is the one closing the span: a reply may itself contain such text (`</s>` in HTML,
    `<|endoftext|>` in code), which must keep its weight. Only a span that does not end with one (a template
    writing more after it) is cut at the first end token it holds.
    """
    body = text[start:end]
    closed = body.rstrip()
    if any(closed.endswith(tok) for tok in end_tokens):
        return start + len(closed)
    hits = [(body.find(tok), tok) for tok in end_tokens if tok in body]
    if hits:
        pos, tok = min(hits)
        return start + pos + len(tok)
    return start + len(body.rstrip())


def _generation_header(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """What `add_generation_prompt` appends (e.g. "<|im_start|>assistant\\n"), from the first user turn."""
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    probe = messages[: first_user + 1] if first_user is not None else [{"role": "user", "content": "x"}]
    without, _ = _render_text(tokenizer, probe, tools, add_generation_prompt=False)
    with_prompt, _ = _render_text(tokenizer, probe, tools, add_generation_prompt=True)
    return with_prompt[len(without) :] if with_prompt.startswith(without) else ""


def _marker_spans(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> tuple[str, list[tuple[int, int]]]:
    text, marked = _render_text(
        tokenizer, messages, tools, add_generation_prompt=add_generation_prompt, with_markers=True
    )
    header = _generation_header(tokenizer, messages, tools)
    end_tokens = _end_tokens(tokenizer)
    spans = []
    for start, end in marked:
        if header:
            # The marked span may begin inside the header (ours marks the "\n" after "assistant"): skip it.
            lo = max(0, start - len(header))
            pos = text.find(header, lo, min(len(text), start + len(header)))
            if pos != -1 and pos <= start <= pos + len(header) <= end:
                start = pos + len(header)
        spans.append((start, _through_end_token(text, _trim_end(text, start, end, end_tokens), end_tokens)))
    return text, spans


def _through_end_token(text: str, end: int, end_tokens: list[str]) -> int:
    """Extend a marked span over the end-of-turn token right after it (`{% endgeneration %}<|im_end|>`, a common
    way to mark templates): that token is what teaches the model to stop, so it is part of the reply."""
    pos = end
    while pos < len(text) and text[pos].isspace():
        pos += 1
    token = next((tok for tok in end_tokens if text.startswith(tok, pos)), None)
    return pos + len(token) if token is not None else end


def _prefix_spans(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> tuple[str, list[tuple[int, int]]]:
    text, _ = _render_text(tokenizer, messages, tools, add_generation_prompt=add_generation_prompt)
    end_tokens = _end_tokens(tokenizer)
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before, _ = _render_text(tokenizer, messages[:i], tools, add_generation_prompt=True)
        upto, _ = _render_text(tokenizer, messages[: i + 1], tools, add_generation_prompt=False)
        if not (upto.startswith(before) and text.startswith(upto)):
            raise ToolschoolError(
                f"cannot find assistant message {i} in the rendered conversation: the chat template renders "
                "a conversation prefix differently from the whole conversation",
                hint="use a template with {% generation %} markers around assistant replies",
            )
        spans.append((len(before), _trim_end(text, len(before), len(upto), end_tokens)))
    return text, spans


def render_conversation(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    tokenizer: Any,
    *,
    add_generation_prompt: bool = False,
    method: Method = "auto",
) -> Rendered:
    """Messages already in the format's form (`fmt.to_messages`) -> tokens and assistant-only loss weights."""
    if not messages:
        raise ToolschoolError("cannot render an empty conversation", hint="give at least one message")
    if method == "auto":
        method = "markers" if _GENERATION_MARKER.search(_template(tokenizer, tools)) else "prefix"
    if method == "markers":
        text, spans = _marker_spans(tokenizer, messages, tools, add_generation_prompt)
    elif method == "prefix":
        text, spans = _prefix_spans(tokenizer, messages, tools, add_generation_prompt)
    else:
        raise ValueError(f"unknown render method {method!r}; use 'auto', 'markers' or 'prefix'")

    input_ids: list[int] = []
    weights: list[float] = []
    cursor = 0
    for start, end in sorted(spans):
        for piece, weight in ((text[cursor:start], 0.0), (text[start:end], 1.0)):
            if piece:
                ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
                input_ids.extend(ids)
                weights.extend([weight] * len(ids))
        cursor = end
    if cursor < len(text):
        ids = tokenizer(text[cursor:], add_special_tokens=False)["input_ids"]
        input_ids.extend(ids)
        weights.extend([0.0] * len(ids))
    return Rendered(input_ids=input_ids, loss_weights=weights, text=text, assistant_spans=sorted(spans))
