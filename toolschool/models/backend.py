"""The generation backend interface: local Hugging Face weights or an OpenAI-compatible endpoint.

Callers (exploration episodes, evaluation items, the server) are many concurrent coroutines; each awaits
`generate` for its own conversation and the backend batches them. A request is a chat conversation plus
the tools offered; the backend renders it with the model's chat template (local) or sends it as is (HTTP).
`stream` is the same generation reported as it goes (the server's `stream: true`); a backend that cannot
report text before it is done (the HTTP one, the format wrappers) reports each completion whole.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal

from toolschool.chat.constraints import Constraint
from toolschool.errors import ToolschoolError

FinishReason = Literal["stop", "length", "error"]


class ContextLengthError(ToolschoolError):
    """A request does not fit in the model's context; `param` names the request field at fault ("messages",
    "max_tokens"), as an OpenAI-style error does."""

    def __init__(self, message: str, *, param: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.param = param


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    # True: a max_tokens larger than the room the prompt leaves in the context is lowered to fit (every stage's
    # budget is an upper bound). False: it is a ContextLengthError, as vLLM answers a request that sends one.
    cap_max_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):  # one stop string, as vLLM and the OpenAI API accept it (not its characters)
            self.stop = [self.stop]
        elif isinstance(self.stop, tuple):
            self.stop = list(self.stop)

    def check(self) -> None:
        """Refuse values no sampler can honour (the bounds vLLM's SamplingParams checks), with one clear line."""
        for name in ("n", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ToolschoolError(f"{name} must be an integer, got {value!r}")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ToolschoolError(f"{name} must be a number, got {value!r}")
        if not isinstance(self.logprobs, bool):
            raise ToolschoolError(f"logprobs must be true or false, got {self.logprobs!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise ToolschoolError(f"stop strings must be strings, got {self.stop!r}")
        if self.n < 1:
            raise ToolschoolError(f"n must be at least 1, got {self.n}")
        if self.max_tokens < 1:
            raise ToolschoolError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not self.temperature >= 0.0:  # also refuses NaN
            raise ToolschoolError(f"temperature must be non-negative, got {self.temperature}", hint="0 is greedy")
        if not 0.0 < self.top_p <= 1.0:
            raise ToolschoolError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool) or not -(2**63) <= self.seed < 2**64
        ):  # what torch.Generator.manual_seed takes
            raise ToolschoolError(f"seed must be an integer in [-2**63, 2**64), got {self.seed!r}")
        if any(not s for s in self.stop):  # "" is in every text: each completion would end before it began
            raise ToolschoolError(f"stop strings must not be empty, got {self.stop!r}", hint="leave the empty one out")


@dataclass
class Completion:
    text: str  # the generated text, without the end-of-turn token
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None  # one per token in token_ids, when requested/available
    finish_reason: FinishReason = "stop"
    # Set when an HTTP server already parsed tool calls out of the text (OpenAI `tool_calls`), canonical form.
    tool_calls: list[dict[str, Any]] | None = None
    prompt_tokens: int = 0
    # An HTTP server returns no token ids, only its count (usage.completion_tokens, split over the choices).
    reported_tokens: int | None = None
    # A constrained reply whose open call the backend ended in its last tokens (its arguments' last value is cut
    # short, required keys it had not written filled in: `engine.local_backend.WRAP_UP_WINDOW`); finish_reason
    # "length"
    closed_at_limit: bool = False

    @property
    def num_tokens(self) -> int:
        """How many tokens were generated: the token ids, or the server's count when it sent none."""
        return len(self.token_ids) if self.reported_tokens is None else self.reported_tokens


@dataclass
class GenerationRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None  # OpenAI function schemas, rendered by the chat template
    params: SamplingParams = field(default_factory=SamplingParams)
    # Text the assistant turn starts with (e.g. "Thought:" for ReAct); included in neither prompt nor output.
    prefill: str = ""
    # What the reply (after the prefill) may be, enforced token by token by a backend that `constrains`; None: free.
    constraint: Constraint | None = None


@dataclass
class StreamEvent:
    """One report of a streamed generation: sample `index`'s text so far, then, once it is done, its completion.

    Successive events of one sample hold successive decodes of its tokens (a character not yet complete left
    out); `completion.text` is the final text, which is cut before a stop string the earlier texts may show.
    """

    index: int
    text: str
    completion: Completion | None = None


class Backend(ABC):
    """Generate completions for chat conversations; safe to call from many coroutines at once."""

    name: str
    # Whether a request's `constraint` is enforced (grammar-constrained decoding); a backend that cannot ignores it.
    constrains: bool = False

    @abstractmethod
    async def generate(self, request: GenerationRequest) -> list[Completion]:
        """Return `request.params.n` completions for one conversation."""

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[StreamEvent, None]:
        """`generate`, reported as it goes: events for each sample, its last one with its completion; ends when
        every sample is done. Closing the iterator early cancels the generation.

        This default waits for `generate` and reports each completion whole; the local backend reports every
        token as it is decoded.
        """
        for index, completion in enumerate(await self.generate(request)):
            yield StreamEvent(index=index, text=completion.text, completion=completion)

    def check_constraint(self, constraint: Constraint) -> None:  # noqa: B027 - nothing to check by default
        """Raise the error a request with `constraint` would end in (a schema the grammar library cannot compile),
        without generating: a run checks its constraints before its first request. A backend that does not
        constrain ignores constraints, so it has none to refuse."""

    async def generate_many(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        import asyncio

        return list(await asyncio.gather(*(self.generate(r) for r in requests)))

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release resources (threads, HTTP connections)."""
