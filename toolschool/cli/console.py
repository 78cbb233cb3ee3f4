"""Shared rich consoles: results on stdout, progress and errors on stderr.

Emoji codes are off: rich would otherwise print a user's text such as `a:b:c:d` (a dataset id, a path, a model
spec) as `a🅱c:d`, and toolschool writes no `:emoji:` codes of its own.
"""

from rich.console import Console

console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)
