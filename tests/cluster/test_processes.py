"""The process supervisor (node/cluster/processes.py) that LocalCluster and NodeProcess share:
bounded stops, liveness by pid, ready lines and log tails, on small real child processes."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from node.cluster.processes import SupervisedProcess, log_tail, read_ready_line, spawn, stop, stop_child
from node.errors import NodeProcessError

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
SLEEPS = "import time; time.sleep(60)"
SAYS_UP_AND_SLEEPS = "import time; print('up', flush=True); time.sleep(60)"


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.mark.integration
def test_stop_sends_sigterm_then_sigkill_to_a_process_that_ignores_it(tmp_path):
    log = str(tmp_path / "x.log")
    polite = spawn(_python(SLEEPS), log)
    stubborn = spawn(_python(IGNORES_TERM), log, ready_pipe=True)
    assert stubborn.popen.stdout.readline() == b"up\n"     # its SIGTERM handler is in place
    started = time.monotonic()
    endings = stop([polite, stubborn], timeout_s=1.0, kill_wait_s=5.0)
    took_s = time.monotonic() - started
    stubborn.close()
    assert [e.killed for e in endings] == [False, True]
    assert [e.exit_status for e in endings] == [-signal.SIGTERM, -signal.SIGKILL]
    assert all(e.exited_at is not None for e in endings)
    assert 1.0 <= took_s < 30                                 # waited for SIGTERM, bounded after SIGKILL
    assert not polite.alive() and not stubborn.alive()
    # stopping again is harmless: both are gone, neither is signalled
    assert [e.killed for e in stop([polite, stubborn], timeout_s=1.0)] == [False, False]


@pytest.mark.integration
def test_an_adopted_pid_counts_only_while_it_is_the_recorded_process(tmp_path):
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    marker = str(tmp_path / "node.yaml")
    child = spawn([*_python(SAYS_UP_AND_SLEEPS), marker], str(work_dir / "log"), ready_pipe=True, detached=True,
                  work_dir=str(work_dir))
    try:
        # Popen returns once exec has closed its error pipe, but the kernel fills in the new
        # program's argv (/proc/PID/cmdline) a moment later: read it once the child has run.
        assert child.popen.stdout.readline() == b"up\n"
        assert SupervisedProcess.adopt(child.pid, marker, "/nowhere").alive()          # by its argv
        assert SupervisedProcess.adopt(child.pid, "/other/node.yaml", str(work_dir)).alive()  # by its cwd
        stranger = SupervisedProcess.adopt(child.pid, "/other/node.yaml", "/nowhere")  # a reused pid
        assert not stranger.alive()
        assert stranger.signal(signal.SIGTERM) is False and child.alive()            # never signalled
        adopted = SupervisedProcess.adopt(child.pid, marker, str(work_dir))
        [ending] = stop([adopted], timeout_s=10)
        assert ending.exited_at is not None and not ending.killed
        assert ending.exit_status is None                      # not our child: no status known
        child.popen.wait(5)
        assert not adopted.alive()
    finally:
        if child.alive():
            child.popen.kill()
            child.popen.wait(5)
        child.close()


@pytest.mark.integration
def test_ready_line_is_read_and_a_process_dying_first_is_reported(tmp_path):
    ready = spawn(_python("import json, time; print(json.dumps({'port': 7}), flush=True); time.sleep(60)"),
                  str(tmp_path / "a.log"), ready_pipe=True, append=False)
    try:
        assert read_ready_line(ready, 30) == {"port": 7}
    finally:
        assert stop_child(ready, 10) == -signal.SIGTERM
        ready.close()
    dying = spawn(_python("import sys; sys.stderr.write('bad config'); sys.exit(3)"), str(tmp_path / "b.log"),
                  ready_pipe=True, append=False)
    with pytest.raises(NodeProcessError, match="exited before it was ready.*3"):
        read_ready_line(dying, 30)
    dying.close()
    assert log_tail(str(tmp_path / "b.log"), missing="") == "bad config"


def test_log_tail_starts_at_the_last_marker_and_keeps_the_last_lines(tmp_path):
    path = tmp_path / "node.log"
    path.write_text("--- start 1\nold\n--- start 2\none\ntwo\nthree\n")
    assert log_tail(str(path), after="--- start") == "--- start 2\none\ntwo\nthree\n"
    assert log_tail(str(path), lines=2, after="--- start") == "two\nthree"
    assert log_tail(str(path), bytes_max=6) == "three\n"
    assert log_tail(str(tmp_path / "missing.log")) == f"(no log at {tmp_path / 'missing.log'})"
    assert log_tail(str(tmp_path / "missing.log"), missing="") == ""
    assert not os.path.exists(tmp_path / "missing.log")
