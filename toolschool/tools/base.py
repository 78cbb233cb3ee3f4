"""The tool contract: a name, a description, a JSON schema of the arguments, and `execute(args)`.

Execution never raises for anything the model can cause: bad arguments, a crashing or hanging tool, an
unreachable server all become an `Observation` with `is_error=True` and a message the model can read
(the "error" half of trial and error).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


@dataclass
class Observation:
    text: str  # what the model sees
    value: Any = None  # structured result when there is one (number, dict, ...)
    is_error: bool = False
    error_kind: str | None = None  # e.g. "invalid_arguments", "timeout", "memory", "execution", "unknown_tool"

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "value": self.value, "is_error": self.is_error, "error_kind": self.error_kind}


class Tool(ABC):
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object

    def schema(self) -> dict[str, Any]:
        """OpenAI function schema."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @abstractmethod
    def execute(self, args: dict[str, Any]) -> Observation:
        """Validate `args` against `parameters`, run, and return an observation (never raise)."""

    async def aexecute(self, args: dict[str, Any]) -> Observation:
        """Async execution; the default runs `execute` in a worker thread so the event loop keeps going."""
        return await asyncio.to_thread(self.execute, args)
