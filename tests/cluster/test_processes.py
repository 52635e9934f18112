"""The process supervisor (node/cluster/processes.py) that LocalCluster and NodeProcess share:
bounded stops, liveness by pid, ready lines and log tails, on small real child processes."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from node.cluster.processes import (SupervisedProcess, log_tail, read_ready_line, spawn, stop, stop_child,
                                    thread_states, wait_stopped)
from node.errors import NodeProcessError

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
SLEEPS = "import time; time.sleep(60)"
SAYS_UP_AND_SLEEPS = "import time; print('up', flush=True); time.sleep(60)"
# four threads, each busy in a loop of its own, then "up": SIGSTOP stops them one by one
FOUR_BUSY_THREADS = ("import threading, time\n"
                     "def spin():\n    while True: time.sleep(0)\n"
                     "for _ in range(3): threading.Thread(target=spin, daemon=True).start()\n"
                     "print('up', flush=True)\nspin()")


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


@pytest.mark.integration
def test_a_stopped_process_is_waited_for_until_every_thread_has_stopped_and_then_until_none_is(tmp_path):
    busy = spawn(_python(FOUR_BUSY_THREADS), str(tmp_path / "x.log"), ready_pipe=True)
    try:
        assert busy.popen.stdout.readline() == b"up\n"
        assert len(thread_states(busy.pid)) == 4
        os.kill(busy.pid, signal.SIGSTOP)
        assert wait_stopped(busy.pid, True, 5.0)
        assert set(thread_states(busy.pid)) == {"T"}
        os.kill(busy.pid, signal.SIGCONT)
        assert wait_stopped(busy.pid, False, 5.0)
        assert "T" not in thread_states(busy.pid)
        assert not wait_stopped(busy.pid, True, 0.05)   # running: it never stops by itself
    finally:
        stop([busy], timeout_s=5.0)
        busy.close()
    assert thread_states(busy.pid) == [] and not wait_stopped(busy.pid, True, 0.05)   # gone


def _fake_proc(root, pid: int, states: dict[int, str]) -> str:
    for tid, state in states.items():
        task = root / str(pid) / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "stat").write_text(f"{tid} (a (strange) name) {state} 1 2 3")
    return str(root)


def test_thread_states_are_read_past_the_last_parenthesis_of_the_name(tmp_path):
    proc = _fake_proc(tmp_path, 41, {41: "S", 42: "T", 43: "R"})
    assert sorted(thread_states(41, proc)) == ["R", "S", "T"]
    assert thread_states(40, proc) == []


def test_wait_stopped_wants_every_thread_stopped_or_none(tmp_path):
    mixed = _fake_proc(tmp_path / "mixed", 7, {7: "T", 8: "S"})
    assert not wait_stopped(7, True, 0.01, mixed) and not wait_stopped(7, False, 0.01, mixed)
    stopped = _fake_proc(tmp_path / "stopped", 7, {7: "T", 8: "t"})
    assert wait_stopped(7, True, 0.01, stopped) and not wait_stopped(7, False, 0.01, stopped)
