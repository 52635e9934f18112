"""Progress bars (node/client/progress.py): drawn when asked for or on a terminal, silent when piped."""

from __future__ import annotations

import io

from node.client.progress import PROGRESS_ENV, Bar, bars_wanted, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_piped_stream_gets_no_bar_and_no_bytes(monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    piped = io.StringIO()
    assert not bars_wanted(piped) and bars_wanted(Terminal())
    with progress_bar("drill", total=3, stream=piped) as bar:
        bar.advance()
        bar.update(completed=3)
    assert piped.getvalue() == "" and type(bar) is Bar


def test_the_environment_forces_bars_off_or_on(monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "0")
    assert not bars_wanted(Terminal())
    monkeypatch.setenv(PROGRESS_ENV, "1")
    assert bars_wanted(io.StringIO())


def test_a_drawn_bar_names_the_work_and_counts_steps(monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "1")
    shown = io.StringIO()
    with progress_bar("failover drill", total=4, stream=shown) as bar:
        for _ in range(4):
            bar.advance()
    assert "failover drill" in shown.getvalue() and "4/4" in shown.getvalue()
