"""Progress bars for long commands: drawn with rich on stderr when it is a terminal, nothing at
all when it is piped or redirected (so logs and ``--json`` output stay clean).

    with progress_bar("failover drill", total=rounds) as bar:
        for number in range(rounds):
            ...
            bar.advance()                 # or bar.update(completed=n, total=m)

rich is imported only when a bar is drawn. ``HASTORE_PROGRESS=0`` turns bars off, ``=1`` forces
them on (a terminal that does not say it is one).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator, TextIO

PROGRESS_ENV = "HASTORE_PROGRESS"
REFRESH_PER_S = 4


class Bar:
    """What a command moves forward. The silent one (piped) drops every call."""

    def __init__(self, progress=None, task=None) -> None:
        self._progress = progress
        self._task = task

    def advance(self, count: float = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, count)

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=completed, total=total, description=description)


def bars_wanted(stream: TextIO | None = None) -> bool:
    """True when progress should be drawn on ``stream`` (stderr by default)."""
    forced = os.environ.get(PROGRESS_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    return _is_terminal(stream if stream is not None else sys.stderr)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):   # a closed or replaced stream
        return False


@contextmanager
def progress_bar(description: str, total: float | None = None, *, stream: TextIO | None = None) -> Iterator[Bar]:
    """A progress bar of ``total`` steps (None: unknown, a spinner) on ``stream`` (stderr) when it
    is a terminal; a silent Bar otherwise. The bar stays on screen, complete, when the block ends."""
    if not bars_wanted(stream):
        yield Bar()
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)
    target = stream if stream is not None else sys.stderr
    console = Console(file=target)
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn()]
    # lines the command prints meanwhile (click.echo, err=True or not) go above the bar when they
    # go to the same terminal; a piped stdout is left alone
    with Progress(*columns, console=console, refresh_per_second=REFRESH_PER_S,
                  redirect_stdout=_is_terminal(sys.stdout), redirect_stderr=target is sys.stderr) as progress:
        yield Bar(progress, progress.add_task(description, total=total))
