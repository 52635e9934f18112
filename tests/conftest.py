"""Suite-wide pytest set-up: the real ``store`` package on the path, and the unit layer's
guard (a test not marked ``integration`` that starts a process fails, see spawn_guard.py).

pytest's default ("prepend") import mode puts the directory of every ``conftest.py`` that
has no ``__init__.py`` beside it on ``sys.path``: for this file, ``tests/``. There,
``tests/store/`` (the storage engine's tests, a directory without ``__init__.py``) would
be found as a namespace package named ``store`` before the editable install's finder
runs, shadowing the real ``store`` package. Take ``tests/`` back off the path and make
sure the real package is the one imported.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import subprocess
import sys

import pytest

from spawn_guard import SpawnGuard, UnmarkedSpawnError  # imported while tests/ is still on the path

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _TESTS_DIR]
_shadow = sys.modules.get("store")
if _shadow is not None and getattr(_shadow, "__file__", None) is None:
    del sys.modules["store"]
importlib.invalidate_caches()

import store  # noqa: E402

pytest_plugins = ["pytester"]   # tests/suite runs small sessions in-process to check the guard

assert store.__file__ is not None and hasattr(store, "MessageStore"), (
    f"tests import the wrong 'store': {store!r}")


def _warm_matplotlib_font_cache() -> None:
    """matplotlib builds its font list on first use and, with no cache yet (a fresh
    machine or MPLCONFIGDIR), runs ``fc-list`` to find system fonts. Inside a unit test
    that spawn trips the guard, so the first test to draw a chart would fail or pass by
    the order of the suite. Build the cache here, before any guard, where it is allowed."""
    try:
        import matplotlib.font_manager  # noqa: F401  (importing builds or loads the cache)
    except ImportError:   # the pipeline extra is not installed: no test draws
        pass


_warm_matplotlib_font_cache()


def _guarded_phase(item: pytest.Item):
    """Run one phase (setup, call or teardown) of ``item`` under a SpawnGuard unless it is
    marked integration; fail it if it tried to start a process, even if that was caught."""
    if item.get_closest_marker("integration") is not None:
        return (yield)
    with SpawnGuard(item.nodeid) as guard:
        try:
            result = yield
        except BaseException as failure:
            if guard.attempts and not isinstance(failure, UnmarkedSpawnError):
                raise UnmarkedSpawnError(item.nodeid, ", ".join(guard.attempts)) from failure
            raise
    if guard.attempts:   # the code under test caught the refusal: the test still fails
        raise UnmarkedSpawnError(item.nodeid, ", ".join(guard.attempts))
    return result


class SmallDisk(type(pathlib.Path())):
    """A mounted tmpfs (a path) that can be filled up to a given number of free bytes."""

    def fill(self, leave_bytes: int) -> str:
        """Allocate a file taking all but ``leave_bytes`` of the room an unprivileged writer
        has here; returns its path (unlink it to free the room)."""
        filler = str(self / "filler")
        stats = os.statvfs(str(self))
        with open(filler, "wb") as handle:
            os.posix_fallocate(handle.fileno(), 0, max(1, stats.f_bavail * stats.f_frsize - leave_bytes))
        return filler


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(size)`` -> a SmallDisk: a tmpfs of ``size`` ("8m") mounted under tmp_path,
    unmounted at teardown. Mounting starts a process (tests using it are integration) and
    needs root or CAP_SYS_ADMIN: without them the test is skipped, saying why."""
    mounted: list[SmallDisk] = []

    def mount(size: str) -> SmallDisk:
        mount_point = SmallDisk(tmp_path / f"disk{len(mounted)}")
        mount_point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
        mounted.append(mount_point)
        return mount_point

    yield mount
    for mount_point in mounted:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _guarded_phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _guarded_phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    return (yield from _guarded_phase(item))
