"""One Spark session for the whole test session (a local session costs ~10 s or more to start):
local[2], the venv's Python on the workers, loopback, no UI (pipeline.session)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    """The shared local SparkSession; stopped at the end of the test session."""
    from pipeline.session import start_session
    session = start_session("local[2]", "hastore-pipeline-tests")
    yield session
    session.stop()
