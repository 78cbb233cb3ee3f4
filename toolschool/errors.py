"""User-facing errors.

A `ToolschoolError` is something the user caused and can fix (a bad config key, a missing file, an unknown
model). The CLI prints its message as one line, without a traceback, and exits non-zero; `--debug` shows the
traceback. Library code raises it with the file/field/value at fault and the fix, so the message alone is
enough to act on.
"""

from __future__ import annotations


class ToolschoolError(Exception):
    """An error the user can fix; its message names what was tried and how to fix it."""

    exit_code: int = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message} — {hint}")

    def __str__(self) -> str:
        return self.message if self.hint is None else f"{self.message} — {self.hint}"


class ConfigError(ToolschoolError):
    """A configuration file or flag has an unknown key, a wrong type or a bad value."""


class ModelLoadError(ToolschoolError):
    """A model could not be resolved or loaded."""


class DataError(ToolschoolError):
    """A data file is missing or has bad lines."""


class ResumeRefused(ToolschoolError):
    """Checkpoints or logs in an output folder were made otherwise (data, settings, base model) than a resume asks.

    `keep` is what to keep the same to resume ("the same training file"); the hint adds the command's own way to
    start over (`fresh`), which `toolschool run` replaces with its --from."""

    def __init__(self, message: str, *, keep: str, fresh: str = "train into a new --out folder") -> None:
        self.keep = keep
        super().__init__(message, hint=f"resume with {keep}, or {fresh}")
