"""Shared rich consoles: results on stdout, progress and errors on stderr."""

from rich.console import Console

console = Console()
err_console = Console(stderr=True)
