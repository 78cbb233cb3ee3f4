"""Step 8, split: train / validation by original query, so no request is in both."""

from __future__ import annotations

import random
from collections import defaultdict

from toolschool.data.dataset import same_request_key
from toolschool.data.distill.rules import Candidate
from toolschool.errors import DataError


def split_by_original(
    originals: list[Candidate], fraction: float, seed: int, paraphrases: dict[str, list[str]] | None = None
) -> set[str]:
    """Original ids going to validation, sampled per tool (seeded), so every tool is split the same way.

    An original moves with its paraphrases, and originals whose queries or paraphrases share a `same_request_key`
    (the same request explored for two tools) move together: no query is ever in both splits.
    """
    if not 0.0 <= fraction < 1.0:
        raise DataError(f"validation_fraction {fraction} must be in [0, 1)", hint="e.g. 0.1")
    paraphrases = paraphrases or {}
    parent = {c.id: c.id for c in originals}

    def root(key: str) -> str:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    owner: dict[str, str] = {}
    for c in sorted(originals, key=lambda c: c.id):
        for text in [c.query, *paraphrases.get(c.id, [])]:
            first = owner.setdefault(same_request_key(text), c.id)
            a, b = root(first), root(c.id)
            parent[max(a, b)] = min(a, b)  # a group is named by its smallest id
    tool_of = {c.id: c.tool for c in originals}
    members: dict[str, list[str]] = defaultdict(list)
    for c in originals:
        members[root(c.id)].append(c.id)
    by_tool: dict[str, list[str]] = defaultdict(list)
    for group in members:
        by_tool[tool_of[group]].append(group)
    chosen: set[str] = set()
    for tool, groups in sorted(by_tool.items()):
        groups = sorted(groups)
        random.Random(f"{seed}:{tool}").shuffle(groups)
        for group in groups[: round(len(groups) * fraction)]:
            chosen.update(members[group])
    return chosen
