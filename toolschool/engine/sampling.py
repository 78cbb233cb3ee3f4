"""Choosing the next token for a batch of sequences that each have their own sampling settings.

Each row may be greedy (temperature 0) or sampled with its own temperature, top_p and `torch.Generator`, so a
seeded sample does not depend on which other sequences happen to share the batch. The returned log-prob of a
token is under the model's raw distribution (log-softmax of the logits before temperature / top_p): that is
the policy's own probability, what RL ratios and perplexity need, independent of how the token was drawn.
"""

from __future__ import annotations

import torch

# Below this a temperature decodes greedily, as in vLLM: dividing by it overflows the logits (a tiny float is 0 in
# fp32), and the NaN probabilities would fail the sampling of every row in the batch.
GREEDY_BELOW = 1e-5


def sample_next(
    logits_BV: torch.Tensor,
    temperature_B: list[float],
    top_p_B: list[float],
    generators_B: list[torch.Generator | None],
    masked_BV: torch.Tensor | None = None,
) -> tuple[list[int], list[float]]:
    """Return (token id, raw log-prob) per row. Sampling draws on the CPU with each row's generator.

    `masked_BV`: the logits with the tokens a row's grammar forbids at -inf (`models.grammar`); the token is chosen
    from them, its log-prob is still the raw one (what the model itself gives it)."""
    logits_BV = logits_BV.float()
    choose_BV = logits_BV if masked_BV is None else masked_BV.float()
    tokens_B = torch.argmax(choose_BV, dim=-1)
    sampled_rows = [i for i, t in enumerate(temperature_B) if t >= GREEDY_BELOW]
    if sampled_rows:
        rows = torch.tensor(sampled_rows, device=logits_BV.device)
        temps = torch.tensor([temperature_B[i] for i in sampled_rows], device=logits_BV.device)
        probs_SV = torch.softmax(choose_BV.index_select(0, rows) / temps[:, None], dim=-1)
        top_ps = torch.tensor([top_p_B[i] for i in sampled_rows], device=logits_BV.device)
        if bool((top_ps < 1.0).any()):
            probs_SV = _top_p_filter(probs_SV, top_ps)
        tokens_B[rows] = _draw(probs_SV.cpu(), [generators_B[row] for row in sampled_rows]).to(logits_BV.device)
    logprobs_B = torch.log_softmax(logits_BV, dim=-1).gather(1, tokens_B[:, None]).squeeze(1)
    return tokens_B.tolist(), logprobs_B.tolist()


def _draw(probs_SV: torch.Tensor, generators_S: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row, drawn from its (unnormalised) probabilities by inverting the cumulative distribution at
    one uniform number from the row's own generator.

    `torch.multinomial` draws an exponential number for every vocabulary entry (49k for SmolLM2), about 1 ms a
    row on a small CPU and as much as a batched decode step's attention for 16 rows; this draws one number a row
    and does one batched cumulative sum. The sum runs in float64, so even a 1e-12 probability keeps its own
    interval; a token of probability 0 (cut by top_p) spans an empty interval and is never drawn.
    """
    # 1 - U lies in (0, 1], so the target lies in (0, total]: the first entry whose cumulative sum reaches it is a
    # token of positive probability, and one exists (the last positive token reaches the total)
    uniform_S = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators_S])
    cdf_SV = torch.cumsum(probs_SV.double(), dim=-1)
    target_S1 = ((1.0 - uniform_S) * cdf_SV[:, -1])[:, None]
    return torch.searchsorted(cdf_SV, target_S1).squeeze(1)


def _top_p_filter(probs_SV: torch.Tensor, top_p_S: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches top_p (always at least the top token)."""
    sorted_probs, order = torch.sort(probs_SV, dim=-1, descending=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass strictly above each token
    sorted_probs = sorted_probs.masked_fill(before >= top_p_S[:, None], 0.0)
    filtered = torch.zeros_like(probs_SV).scatter(1, order, sorted_probs)
    return filtered / filtered.sum(dim=-1, keepdim=True)
