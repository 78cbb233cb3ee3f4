"""The backend for a model name, behind one interface (`toolschool.models.backend.Backend`).

`make_backend(model)` takes a model name as written on the command line (see `toolschool.models.spec`):
`openai:URL#name` gives the OpenAI-compatible HTTP backend (`toolschool.models.openai_http`), anything else loads
local weights into this engine's continuously batching local backend (`toolschool.engine.local_backend`). It lives
here, above both, so that `toolschool.models` never imports the engine.
"""

from __future__ import annotations

from toolschool.models.backend import Backend
from toolschool.models.spec import ModelSpec, parse_model_spec


def make_backend(
    model: str | ModelSpec,
    *,
    dtype: str | None = "auto",
    device: str | None = None,
    max_batch_size: int = 16,
    concurrency: int = 16,
    api_key: str | None = None,
    timeout: float = 120.0,
    max_retries: int = 4,
) -> Backend:
    """Build the backend for a model name.

    Local: `dtype`, `device` and `max_batch_size` (sequences decoded together) apply. HTTP: `concurrency`
    (requests in flight), `api_key` (default: $OPENAI_API_KEY, else a placeholder for local servers),
    `timeout` per request and `max_retries` on 429 / 5xx / timeouts apply; the endpoint is checked on first use.
    """
    spec = parse_model_spec(model) if isinstance(model, str) else model
    if spec.kind == "openai":
        from toolschool.models.openai_http import OpenAIBackend

        return OpenAIBackend(spec, api_key=api_key, concurrency=concurrency, timeout=timeout, max_retries=max_retries)
    from toolschool.engine.local_backend import LocalBackend
    from toolschool.models.loading import load_model

    return LocalBackend(load_model(spec, device=device, dtype=dtype), max_batch_size=max_batch_size)


__all__ = ["make_backend"]
