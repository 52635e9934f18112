"""Suite-wide pytest set-up.

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

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _TESTS_DIR]
_shadow = sys.modules.get("store")
if _shadow is not None and getattr(_shadow, "__file__", None) is None:
    del sys.modules["store"]
importlib.invalidate_caches()

import store  # noqa: E402

assert store.__file__ is not None and hasattr(store, "MessageStore"), (
    f"tests import the wrong 'store': {store!r}")
