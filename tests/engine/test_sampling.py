"""Per-row next-token choice: greedy, top_p, seeded draws, raw log-probs."""

from __future__ import annotations

import torch

from toolschool.engine.sampling import sample_next


def test_sampling_greedy_top_p_and_logprobs() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0], [5.0, 0.0, 4.9]])
    gens = [None, torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)]
    tokens, logprobs = sample_next(logits, [0.0, 1.0, 1.0], [1.0, 1e-6, 1.0], gens)
    assert tokens[0] == 1 and tokens[1] == 1  # greedy; top_p that small keeps only the top token
    assert tokens[2] in (0, 2)
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(3), torch.tensor(tokens)]
    assert torch.allclose(torch.tensor(logprobs), expected)


def test_sampling_draws_the_distribution_and_never_a_zero_probability_token() -> None:
    """The draw (one uniform a row, inverted through the cumulative distribution) follows the probabilities,
    never picks a token top_p cut (or one of probability 0 at either end), and a row's draw depends only on its
    own generator, not on the rows beside it."""
    probs = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0])
    logits = torch.log(probs).expand(4000, -1).contiguous()
    gens = [torch.Generator().manual_seed(i) for i in range(4000)]
    tokens, _ = sample_next(logits, [1.0] * 4000, [1.0] * 4000, gens)
    counts = torch.bincount(torch.tensor(tokens), minlength=6).double() / 4000
    assert counts[0] == counts[2] == counts[5] == 0
    assert torch.allclose(counts, probs.double(), atol=0.03)
    cut, _ = sample_next(logits[:500], [1.0] * 500, [0.8] * 500, [torch.Generator().manual_seed(i) for i in range(500)])
    assert set(cut) == {3, 4}  # top_p 0.8 keeps 0.6 + 0.3, drops the 0.1
    alone = [sample_next(logits[:1], [1.0], [1.0], [torch.Generator().manual_seed(i)])[0][0] for i in range(50)]
    assert alone == tokens[:50]
