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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _guarded_phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _guarded_phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    return (yield from _guarded_phase(item))
