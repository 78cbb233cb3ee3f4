"""A finished explore stage's trial lines, for the tests that run the stages after it (a random tiny model
explores nothing usable)."""

from __future__ import annotations

from toolschool.tools.registry import build_registry

with build_registry(only=["calculator"]) as _registry:
    CALCULATOR = _registry.schemas()[0]  # as the explore stage logs it


def _trial(index: int, a: int, b: int) -> dict:
    expr = f"{a} * {b}"
    observation = {"text": str(a * b), "value": a * b, "is_error": False, "error_kind": None}
    return {
        "v": 1,
        "tool": "calculator",
        "episode": index,
        "slot": 0,
        "status": "ok",
        "query": f"How much is {a} times {b}?",
        "steps": [
            {
                "calls": [
                    {"name": "calculator", "arguments": {"expression": expr}, "id": "c1", "observation": observation}
                ]
            }
        ],
        "final_answer": f"It is {a * b}.",
        "reflection": "Yes",
        "solved": True,
        "tools": [CALCULATOR],
        "model": "test",
    }
