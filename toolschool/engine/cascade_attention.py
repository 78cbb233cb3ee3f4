"""Shared-prefix ("cascade") attention for batched decoding on the CPU.

Concurrent conversations of one workload start alike: 16 exploration episodes share a system prompt and tool
list of ~800-1,000 tokens, GRPO's samples of a prompt share the whole prompt, evaluation items share the
instructions. In a batched decode step each row's one query attends over its own copy of those keys, and
torch's CPU flash-attention kernel runs single-query rows at a fraction of its speed on query blocks (on a
2-core Xeon, 10 rows x 2,000 keys take ~1 ms a layer, about half of a decode step at that length). Cascade
attention (as in vLLM and FlashInfer) splits each row's attention in two:
- the shared prefix, read once for a whole group of rows: their queries become one query block against one
  copy of the prefix's keys (the kernel's efficient shape: 10 rows x 1,000 shared keys take 0.12 ms);
- the rest of each row (its own tokens), one batched pass over the columns after the shared prefixes;
and merges the two softmax-weighted sums with their log-sum-exps. The result is the same attention up to float
rounding.

`plan_groups` finds the groups (rows whose prompts share a long enough token prefix that lies in one contiguous
run of their cache); `CascadePlan.build` turns them into column ranges for one step; `attention_forward` is the
attention function (registered with transformers as `ATTENTION_NAME`) that uses a plan when one is passed as
the `cascade` keyword of the model's forward and otherwise runs ordinary SDPA (with grouped-query attention done
by the kernel instead of repeating keys and values). `use_cascade_attention` points a model view's attention
layers at it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - the usual name
from torch import nn

ATTENTION_NAME = "toolschool_cascade"
MIN_SHARED = 64  # shorter common prefixes are not worth a separate pass


@dataclass
class Group:
    rows: list[int]  # batch rows sharing the prefix
    length: int  # shared positions (the first `length` real positions of each row)


def plan_groups(prompts: list[list[int]], runs: list[int], min_shared: int = MIN_SHARED) -> list[Group]:
    """Group rows whose token sequences share at least `min_shared` leading tokens.

    `runs[i]` is how many of row i's first real positions are contiguous in its cache (a prefilled row has
    padding between its cached prefix and its suffix); a shared prefix never reaches past it. Rows are sorted by
    their tokens and cut into groups where the common prefix of neighbours drops below `min_shared`; a group's
    length is the common prefix of all its rows.
    """
    # a row whose contiguous run is too short can share nothing: leaving it out keeps it from cutting its neighbours
    order = sorted((i for i in range(len(prompts)) if runs[i] >= min_shared), key=lambda i: prompts[i])
    arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
    groups: list[Group] = []
    current: list[int] = []
    length = 0
    for i in order:
        if current:
            prev = arrays[current[-1]]
            n = min(len(prev), len(arrays[i]), length)
            mismatch = np.flatnonzero(prev[:n] != arrays[i][:n])
            common = int(mismatch[0]) if len(mismatch) else n
            common = min(common, runs[i])
            if common >= min_shared:
                current.append(i)
                length = common
                continue
            if len(current) > 1:
                groups.append(Group(rows=current, length=length))
        current, length = [i], min(len(arrays[i]), runs[i])
    if len(current) > 1:
        groups.append(Group(rows=current, length=length))
    return groups


@dataclass
class CascadePlan:
    """One decode step's split of the batch's key columns (the attention of every layer uses it)."""

    groups: list[tuple[torch.Tensor, int, int, int]]  # (rows, representative row, its first column, length)
    start: int  # first column of the per-row pass
    mask: torch.Tensor  # [B, 1, 1, L - start] additive mask of the per-row pass (0 or -inf)

    @classmethod
    def build(cls, groups: list[Group], mask_BL: torch.Tensor, dtype: torch.dtype) -> CascadePlan | None:
        """The plan for a batch whose real positions are `mask_BL` (rows right-aligned, the new token's column
        included), or None when the per-row pass would not be shorter by at least MIN_SHARED columns."""
        B, L = mask_BL.shape  # noqa: N806
        real = mask_BL.bool()
        first_B = real.to(torch.int8).argmax(dim=1)  # each row's first real column
        shared_B = torch.zeros(B, dtype=torch.long, device=mask_BL.device)
        for group in groups:
            shared_B[group.rows] = group.length
        ends_B = first_B + shared_B
        start = int(ends_B.min())
        if start < MIN_SHARED:
            return None
        columns = torch.arange(start, L, device=mask_BL.device)
        keep = real[:, start:] & (columns[None, :] >= ends_B[:, None])
        mask = torch.zeros(keep.shape, dtype=dtype, device=mask_BL.device).masked_fill_(~keep, float("-inf"))
        firsts = first_B.tolist()
        planned = [
            (torch.tensor(g.rows, device=mask_BL.device), g.rows[0], firsts[g.rows[0]], g.length) for g in groups
        ]
        return cls(groups=planned, start=start, mask=mask[:, None, None, :])


def attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cascade: CascadePlan | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: [B, H, q, D] queries, [B, Hkv, L, D] keys/values -> [B, q, H, D]."""
    if any(kwargs.get(name) is not None for name in ("softcap", "sliding_window", "position_bias", "s_aux")):
        # what plain SDPA does with these (softcap: refuse) is transformers' to decide
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    B, H, Q, D = query.shape  # noqa: N806
    Hkv = key.shape[1]  # noqa: N806
    if cascade is None or Q != 1:
        is_causal = Q > 1 and attention_mask is None and getattr(module, "is_causal", True)
        out = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=dropout,
            scale=scaling,
            is_causal=is_causal,
            enable_gqa=H != Hkv,
        )
        return out.transpose(1, 2).contiguous(), None
    g = H // Hkv  # query heads per key/value head: they ride as g queries of the key/value head
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q_BKgD = query.reshape(B, Hkv, g, D)
    out, lse = flash(
        q_BKgD,
        key[:, :, cascade.start :],
        value[:, :, cascade.start :],
        attn_mask=cascade.mask.to(query.dtype),
        scale=scaling,
    )
    out, lse = out.float(), lse.float()
    for rows, rep, first, length in cascade.groups:
        n = len(rows)
        q_shared = q_BKgD.index_select(0, rows).permute(1, 0, 2, 3).reshape(1, Hkv, n * g, D)
        keys = key[rep : rep + 1, :, first : first + length]
        values = value[rep : rep + 1, :, first : first + length]
        s_out, s_lse = flash(q_shared, keys, values, scale=scaling)
        s_out = s_out.float().reshape(Hkv, n, g, D).permute(1, 0, 2, 3)
        s_lse = s_lse.float().reshape(Hkv, n, g).permute(1, 0, 2)
        r_out, r_lse = out.index_select(0, rows), lse.index_select(0, rows)
        top = torch.maximum(s_lse, r_lse)
        w_shared, w_rest = torch.exp(s_lse - top), torch.exp(r_lse - top)
        merged = (s_out * w_shared[..., None] + r_out * w_rest[..., None]) / (w_shared + w_rest)[..., None]
        out = out.index_copy(0, rows, merged)
    return out.to(query.dtype).reshape(B, H, 1, D).transpose(1, 2).contiguous(), None


def register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, attention_forward)


def use_cascade_attention(view: nn.Module) -> bool:
    """Point the attention layers of a model view (`packed_weights.packed_view`, whose modules are its own) at
    `attention_forward`; return whether any layer was switched. Only attention layers of the usual
    transformers shape (a `config`, a `layer_idx` and grouped key/value heads) are switched; the original model
    and its config are untouched."""
    register()
    switched = False
    configs: dict[int, Any] = {}
    for module in view.modules():
        config = getattr(module, "config", None)
        if config is None or not hasattr(module, "layer_idx") or not hasattr(module, "num_key_value_groups"):
            continue
        if getattr(config, "_attn_implementation", None) != "sdpa":
            continue
        if id(config) not in configs:
            own = copy.copy(config)
            own._attn_implementation_internal = ATTENTION_NAME
            configs[id(config)] = own
        module.config = configs[id(config)]
        switched = True
    return switched
