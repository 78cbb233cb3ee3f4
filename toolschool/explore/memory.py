"""Long-term memory of exploration: per tool, the queries already explored and whether each was solved.

STE shows this list only when the explorer imagines a new query (pushing it toward new ground) and never keeps
it in the conversation. Episodes run concurrently here, so the memory also holds queries of trials still in
flight ("solved: not yet known"): a concurrent episode then avoids imagining the same query at the same time,
which is what the sequential original gets for free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from toolschool.explore.trial import Trial


@dataclass
class MemoryEntry:
    query: str
    solved: bool | None = None  # None: reflection off, unclear, or trial still running
    pending: bool = False
    values: str | None = None  # imagine = "values_first": the argument values the query was written from (JSON)

    def label(self, *, with_outcome: bool) -> str:
        if self.pending:
            return "not yet known"
        if not with_outcome or self.solved is None:
            return "unknown"
        return "Yes" if self.solved else "No"


class LongTermMemory:
    """Queries explored per tool, in the order they were imagined."""

    def __init__(self, max_shown: int = 0) -> None:
        self.max_shown = max_shown  # 0: show all (the paper); >0: only the most recent (small contexts)
        self._entries: dict[str, list[MemoryEntry]] = {}

    @classmethod
    def from_records(cls, trials: list[Trial], max_shown: int = 0) -> LongTermMemory:
        """Rebuild from a trial log (resume): every logged query with its reflection outcome."""
        memory = cls(max_shown)
        for trial in trials:
            if trial.query:
                values = trial.imagined_values
                memory.add(
                    trial.tool,
                    trial.query,
                    trial.solved,
                    values=None if values is None else json.dumps(values, ensure_ascii=False),
                )
        return memory

    def add(
        self, tool: str, query: str, solved: bool | None = None, *, pending: bool = False, values: str | None = None
    ) -> MemoryEntry:
        entry = MemoryEntry(query=query, solved=solved, pending=pending, values=values)
        self._entries.setdefault(tool, []).append(entry)
        return entry

    @staticmethod
    def resolve(entry: MemoryEntry, solved: bool | None) -> None:
        entry.solved = solved
        entry.pending = False

    def discard(self, tool: str, entry: MemoryEntry) -> None:
        """Forget a pending query whose trial never finished (it is not in the log either)."""
        entries = self._entries.get(tool, [])
        if any(e is entry for e in entries):
            entries[:] = [e for e in entries if e is not entry]

    def entries(self, tool: str) -> list[MemoryEntry]:
        return list(self._entries.get(tool, []))

    def shown(self, tool: str, *, with_outcome: bool = True) -> list[dict[str, str]]:
        """What the imagination prompt lists: `[{query, solved, values}]` (`values`: JSON text, or None), most
        recent `max_shown` when limited."""
        entries = self._entries.get(tool, [])
        if self.max_shown > 0:
            entries = entries[-self.max_shown :]
        return [{"query": e.query, "solved": e.label(with_outcome=with_outcome), "values": e.values} for e in entries]
