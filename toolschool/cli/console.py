"""Shared rich consoles: results on stdout, progress and errors on stderr.

Emoji codes are off: rich would otherwise print a user's text such as `a:b:c:d` (a dataset id, a path, a model
spec) as `a🅱c:d`, and toolschool writes no `:emoji:` codes of its own.

Results are not wrapped at the console width (`soft_wrap`): piped or redirected, rich would break lines at 80
columns, so `toolschool config show run.toml > resolved.toml` gave TOML that did not parse back and long paths
came out in pieces. Tables still fit the width. The same holds for warnings and errors on stderr: a log file
kept a path in a warning ("no checkpoint in /long/path/checkpoints") broken over two lines.
"""

from pathlib import Path

from rich.console import Console
from rich.markup import escape

console = Console(emoji=False, soft_wrap=True)
err_console = Console(stderr=True, emoji=False, soft_wrap=True)


def say_if_resume_starts_over(out_dir: Path) -> None:
    """`--resume` into a folder with no checkpoint (a typo in --out, say) trains from step 0: say so first."""
    from toolschool.train.common import latest_checkpoint

    if latest_checkpoint(out_dir) is None:
        where = escape(str(out_dir / "checkpoints"))
        err_console.print(f"[yellow]no checkpoint in {where}: starting at step 0[/yellow]")


def say_if_resume_finds_no_trials(directory: Path) -> None:
    """`explore --resume` into a folder holding no trials (a typo in --out, say) explores from the start: say so
    first, as `say_if_resume_starts_over` does for training."""
    from toolschool.run_state import TRIALS_FILE

    path = directory / TRIALS_FILE
    if not path.is_file() or path.stat().st_size == 0:
        err_console.print(f"[yellow]no trials in {escape(str(path))}: --resume starts a new exploration[/yellow]")
