"""Step 6, dedupe: near-identical requests of a tool are kept once."""

from __future__ import annotations

import re
from collections import defaultdict

from toolschool.data.dataset import same_request_key
from toolschool.data.distill.rules import Candidate

# Queries are compared as the tokens of `same_request_key` (toolschool.data.dataset), the project's one definition
# of "the same request": what distill calls one request, the dataset builds, the held-out set and ICL retrieval do.


def jaccard(a: str, b: str) -> float:
    """Token-set Jaccard similarity of two requests' `same_request_key` tokens."""
    sa, sb = set(same_request_key(a).split()), set(same_request_key(b).split())
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


_ATOM = re.compile(r"\d+|[-+*/×÷^%=<>]")


def _atoms(norm: str) -> list[str]:
    """The numbers and operators of a `same_request_key`, in order: what a word set cannot see."""
    return [token for token in norm.split() if _ATOM.fullmatch(token)]


def near_duplicate(text: str, others: list[str], threshold: float) -> bool:
    """The same request (`same_request_key`), or word-set Jaccard >= threshold with the same numbers and operators
    in the same order ("12 - 5" and "5 - 12", or 2024-05-01 and 2024-01-05, share every word but ask for other
    calls)."""
    norm = same_request_key(text)
    atoms = _atoms(norm)
    for other in others:
        other_norm = same_request_key(other)
        if norm == other_norm or (atoms == _atoms(other_norm) and jaccard(text, other) >= threshold):
            return True
    return False


def dedupe(candidates: list[Candidate], threshold: float) -> tuple[list[Candidate], list[Candidate]]:
    """Keep the first of each group of near-identical queries (per tool); return (kept, removed)."""
    kept: list[Candidate] = []
    removed: list[Candidate] = []
    seen: dict[str, list[str]] = defaultdict(list)
    for candidate in candidates:
        if near_duplicate(candidate.query, seen[candidate.tool], threshold):
            removed.append(candidate)
        else:
            seen[candidate.tool].append(candidate.query)
            kept.append(candidate)
    return kept, removed
