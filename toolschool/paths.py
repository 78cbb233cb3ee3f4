"""Where toolschool keeps its cache (converted models, downloaded data)."""

from __future__ import annotations

import os
from pathlib import Path


def toolschool_home() -> Path:
    """The cache root: `$TOOLSCHOOL_HOME`, else `~/.cache/toolschool`."""
    env = os.environ.get("TOOLSCHOOL_HOME")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "toolschool"
    return root


def models_cache() -> Path:
    return toolschool_home() / "models"
