"""The unit layer's guard (tests/spawn_guard.py, wired in tests/conftest.py): an unmarked
test that starts a process fails with advice to mark it, even when the refusal is caught;
a test marked integration is left alone; and while guarded, no process really starts."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

import spawn_guard
from spawn_guard import SpawnGuard, UnmarkedSpawnError

TESTS_DIR = Path(__file__).resolve().parents[1]


def _noop() -> None:
    pass


def test_every_way_to_start_a_process_is_refused_and_none_starts(tmp_path):
    witness = tmp_path / "ran"
    with SpawnGuard("the-test") as guard:
        with pytest.raises(UnmarkedSpawnError, match=r"the-test started a process \(subprocess.Popen\).*"
                                                     r"pytest.mark.integration"):
            subprocess.run(["touch", str(witness)], check=False)
        with pytest.raises(UnmarkedSpawnError):
            subprocess.Popen(["touch", str(witness)], stdout=subprocess.PIPE)
        with pytest.raises(UnmarkedSpawnError):
            os.system(f"touch {witness}")
        with pytest.raises(UnmarkedSpawnError):
            os.fork()
        with pytest.raises(UnmarkedSpawnError):
            os.posix_spawnp("touch", ["touch", str(witness)], dict(os.environ))
        for method in ("fork", "spawn"):
            with pytest.raises(UnmarkedSpawnError):
                multiprocessing.get_context(method).Process(target=_noop).start()
    assert not witness.exists()
    assert guard.attempts[:5] == ["subprocess.Popen", "subprocess.Popen", "os.system", "os.fork", "os.posix_spawnp"]
    assert len(guard.attempts) == 7


def test_the_entry_points_are_restored_and_guards_nest():
    before = (subprocess.Popen._execute_child, os.fork, os.system)
    with SpawnGuard("outer") as outer:
        with SpawnGuard("inner") as inner:
            assert spawn_guard.active_test_ids()[-2:] == ("outer", "inner")
            with pytest.raises(UnmarkedSpawnError, match="inner"):
                os.fork()
        with pytest.raises(UnmarkedSpawnError, match="outer"):
            os.fork()
    assert (subprocess.Popen._execute_child, os.fork, os.system) == before
    assert (outer.attempts, inner.attempts) == (["os.fork"], ["os.fork"])


def test_a_session_fails_unmarked_spawning_tests_and_leaves_marked_ones_alone(pytester):
    witness = pytester.path / "ran"
    pytester.makeini(textwrap.dedent("""\
        [pytest]
        markers =
            integration: starts real processes
        """))
    pytester.makeconftest((TESTS_DIR / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_inner=textwrap.dedent(f"""\
        import os
        import subprocess

        import pytest

        import spawn_guard


        def test_plain():
            assert spawn_guard.active_test_ids()[-1].endswith("test_plain")


        def test_spawns():
            subprocess.run(["touch", {str(witness)!r}])


        def test_swallows():
            try:
                os.fork()
            except Exception:
                pass


        @pytest.fixture
        def spawning():
            subprocess.Popen(["touch", {str(witness)!r}])


        def test_spawning_fixture(spawning):
            pass


        @pytest.mark.integration
        def test_marked():
            assert not spawn_guard.active_test_ids()[-1].endswith("test_marked")
        """))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2, errors=1)
    result.stdout.fnmatch_lines(["*test_inner.py::test_swallows started a process (os.fork) but is not marked "
                                 "integration; mark it*"])
    assert not witness.exists()
