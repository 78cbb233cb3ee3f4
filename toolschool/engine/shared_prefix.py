"""Forward many sequences that begin with the same tokens by running those tokens once, gradients included.

Tool-use training data repeats a long prefix: every example of a tool set starts with the same system prompt
listing the tools' JSON schemas (~200-700 tokens, most of each sequence), and GRPO's samples of one prompt
share the whole prompt. A plain batch runs that prefix forward and backward once per row. Here each distinct
prefix runs once (with autograd), its per-layer keys and values are gathered for the rows that share it, and
only the rows' own tokens (the suffixes) run on top of them as a batch with `past_key_values`.

This is exact, not an approximation: a suffix token attends to the same keys and values at the same positions
as in the full sequence, and autograd sums the suffixes' gradients into the one prefix computation, which is
the gradient the repeated prefixes would have received (up to float rounding; the tests compare both). The
only difference is stochastic: dropout draws one mask for a shared prefix instead of one per row.

Layout: prefixes are run one at a time without padding (so no query is ever fully masked, which would put NaN
into padded keys) and left-padded with zero keys/values (masked out) to the longest; suffixes are right-padded.
Position ids count real tokens only, so a row's positions are what it would have alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from toolschool.engine.kv_buffer import pad_left


def decoder_and_head(model: Any) -> tuple[Any, Any]:
    """The transformer body (returning hidden states) and the output head of a causal LM, PEFT-wrapped or not.

    LoRA layers are injected into the base model's modules, so calling the body directly keeps them active
    (and `with model.disable_adapter():` still turns them off for a reference pass).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def shared_prefix_hidden_states(
    model: Any,
    prefixes: Sequence[torch.Tensor],
    owner: Sequence[int],
    suffix_ids: torch.Tensor,
    suffix_mask: torch.Tensor,
) -> torch.Tensor:
    """Last hidden states [B, S, H] of `suffix_ids` [B, S] (right-padded, `suffix_mask` 1 for real tokens),
    where row b continues prefix `prefixes[owner[b]]` (a 1-D tensor of real token ids, no padding).

    Gradients flow into the prefixes' computation once per distinct prefix. The hidden state at a suffix's
    first position predicts its second token; to score a suffix's first token too, end the prefix one token
    earlier and start the suffix with that token.
    """
    from transformers import DynamicCache

    if suffix_ids.dim() != 2 or suffix_ids.shape != suffix_mask.shape:
        raise ValueError(f"suffix ids {tuple(suffix_ids.shape)} and mask {tuple(suffix_mask.shape)} must be [B, S]")
    if len(owner) != suffix_ids.shape[0]:
        raise ValueError(f"{len(owner)} owners for {suffix_ids.shape[0]} suffix rows")
    if not prefixes or any(p.dim() != 1 or p.numel() == 0 for p in prefixes):
        raise ValueError("every prefix must be a non-empty 1-D tensor of token ids")
    decoder, _ = decoder_and_head(model)
    device = suffix_ids.device
    lengths = [int(p.numel()) for p in prefixes]
    longest = max(lengths)

    per_prefix: list[Any] = []
    for ids in prefixes:
        cache = DynamicCache(config=model.config)
        decoder(
            input_ids=ids.to(device)[None],
            position_ids=torch.arange(ids.numel(), device=device)[None],
            past_key_values=cache,
            use_cache=True,
        )
        per_prefix.append(cache)

    index = torch.as_tensor(list(owner), device=device)
    cache = DynamicCache(config=model.config)
    for li, layer in enumerate(cache.layers):
        keys = torch.cat([pad_left(c.layers[li].keys, longest) for c in per_prefix]).index_select(0, index)
        values = torch.cat([pad_left(c.layers[li].values, longest) for c in per_prefix]).index_select(0, index)
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values

    prefix_mask = torch.tensor(
        [[0] * (longest - n) + [1] * n for n in lengths], dtype=suffix_mask.dtype, device=device
    ).index_select(0, index)
    suffix_mask = suffix_mask.to(device)
    offsets = torch.tensor(lengths, device=device).index_select(0, index)
    positions = offsets[:, None] + (suffix_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = decoder(
        input_ids=suffix_ids,
        attention_mask=torch.cat([prefix_mask, suffix_mask], dim=1),
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    )
    return out.last_hidden_state


def group_by_prefix(prefix_keys: Sequence[tuple[int, ...]]) -> tuple[list[tuple[int, ...]], list[int]]:
    """Distinct prefixes in first-seen order and, for each row, the index of its prefix among them."""
    distinct: dict[tuple[int, ...], int] = {}
    owner = [distinct.setdefault(tuple(key), len(distinct)) for key in prefix_keys]
    return list(distinct), owner
