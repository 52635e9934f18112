"""The unit layer's guard: a test not marked ``integration`` may start no process.

``pytest -m "not integration"`` is the fast, deterministic layer; it stays so only if a
test that starts a process (a node, ZooKeeper, ``hastore`` in a subprocess, a fork) is
marked. While a :class:`SpawnGuard` is active, every way this interpreter has to start a
process raises :class:`UnmarkedSpawnError` instead, and the attempt is recorded so that
the test fails even when the code under test catches the error (tests/conftest.py checks
the record after each phase).
"""

from __future__ import annotations

import os
import subprocess

import _posixsubprocess

MARK_ADVICE = ('mark it: `pytestmark = pytest.mark.integration` at module level, or '
               '`@pytest.mark.integration` on the test')


class UnmarkedSpawnError(RuntimeError):
    """A test outside the integration layer tried to start a process."""

    def __init__(self, test_id: str, how: str) -> None:
        super().__init__(f"{test_id} started a process ({how}) but is not marked integration; {MARK_ADVICE}")
        self.test_id = test_id
        self.how = how


# (owner, attribute, name shown): every entry point that creates a process. Popen's
# _execute_child covers subprocess.run/check_output, os.popen, trio.run_process and
# asyncio's subprocesses; fork_exec covers multiprocessing's spawn and forkserver;
# os.fork covers multiprocessing's fork, os.spawn* and pty.fork.
_SPAWNERS = (
    (subprocess.Popen, "_execute_child", "subprocess.Popen"),
    (_posixsubprocess, "fork_exec", "_posixsubprocess.fork_exec"),
    (os, "fork", "os.fork"),
    (os, "forkpty", "os.forkpty"),
    (os, "posix_spawn", "os.posix_spawn"),
    (os, "posix_spawnp", "os.posix_spawnp"),
    (os, "system", "os.system"),
)


_active: list[str] = []


def active_test_ids() -> tuple[str, ...]:
    """The test ids of the guards entered and not yet exited, innermost last."""
    return tuple(_active)


class SpawnGuard:
    """While entered, starting a process raises :class:`UnmarkedSpawnError` naming
    ``test_id``; ``attempts`` lists what was tried, in order. Restores every entry point
    on exit. Guards nest (each restores what it found)."""

    def __init__(self, test_id: str) -> None:
        self.test_id = test_id
        self.attempts: list[str] = []
        self._saved: list[tuple[object, str, object]] = []

    def __enter__(self) -> SpawnGuard:
        for owner, attribute, how in _SPAWNERS:
            if hasattr(owner, attribute):
                self._saved.append((owner, attribute, getattr(owner, attribute)))
                setattr(owner, attribute, self._refuse(how))
        _active.append(self.test_id)
        return self

    def __exit__(self, *exc_info) -> None:
        _active.pop()
        while self._saved:
            owner, attribute, original = self._saved.pop()
            setattr(owner, attribute, original)

    def _refuse(self, how: str):
        def refuse(*_args, **_kwargs):
            self.attempts.append(how)
            raise UnmarkedSpawnError(self.test_id, how)
        return refuse
