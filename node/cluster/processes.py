"""The one process supervisor: start a process with its output in a log file, learn that it
is ready, signal it, tell by pid whether it still runs, and stop it within a bound
(SIGTERM, then SIGKILL).

    process = spawn(argv, "/tmp/x/node.log", ready_pipe=True)   # stdout kept for the ready line
    ready = read_ready_line(process, 60)                         # {"client_address": ...}
    [ending] = stop([process], timeout_s=30)                     # SIGTERM, SIGKILL after 30 s
    ending.exit_status                                           # 0 after a clean shutdown

Both ways hastore runs processes go through it:

- ``LocalCluster`` (supervisor.py) spawns ZooKeeper, controllers and nodes ``detached`` (their
  own session, output appended to a log), records their pids in cluster.json, and a later
  command finds them again with ``SupervisedProcess.adopt``: a pid counts as that process
  only while /proc shows it running with its config path in its argv, or in its work
  directory (pids get reused).
- ``NodeProcess`` (process.py) runs one node as a child of the caller, stderr to a file,
  ready when it prints its JSON ready line on stdout.

Synchronous: waits poll every ``EXIT_POLL_INTERVAL_S`` and are bounded by their timeouts.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Sequence

from ..errors import NodeProcessError

EXIT_POLL_INTERVAL_S = 0.05
STOP_POLL_INTERVAL_S = 0.001
KILL_WAIT_S = 5.0
READY_LINE_BYTES_MAX = 64 * 1024
LOG_TAIL_BYTES_MAX = 256 * 1024


class SupervisedProcess:
    """A process under supervision: its pid and how to tell the pid is still that process.

    ``popen`` is set for a process this interpreter started (its exit status is then known);
    otherwise the process was found in a state file and ``argv_marker`` / ``work_dir`` identify it.
    """

    def __init__(self, pid: int, *, popen: subprocess.Popen | None = None, argv_marker: str | None = None,
                 work_dir: str | None = None) -> None:
        self.pid = pid
        self.popen = popen
        self.argv_marker = argv_marker
        self.work_dir = work_dir

    @classmethod
    def adopt(cls, pid: int, argv_marker: str, work_dir: str) -> "SupervisedProcess":
        """A process another command started and recorded by pid: it is this one while /proc
        shows ``argv_marker`` in its argv, or ``work_dir`` as its working directory."""
        return cls(pid, argv_marker=argv_marker, work_dir=work_dir)

    def alive(self) -> bool:
        """Whether the process runs (a zombie does not; our own child's exit is collected)."""
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_runs(self.pid, self.argv_marker, self.work_dir)

    @property
    def exit_status(self) -> int | None:
        """The exit status (negative: the signal) once a child has exited; None for an adopted one."""
        return self.popen.returncode if self.popen is not None else None

    def signal(self, sig: int) -> bool:
        """Send ``sig``; False when the process is already gone (a pid that is no longer this
        process is never signalled)."""
        if not self.alive():
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        """Release the pipe of a child started with ``ready_pipe``."""
        if self.popen is not None and self.popen.stdout is not None:
            self.popen.stdout.close()


@dataclass(frozen=True, slots=True)
class Ending:
    """How one process ended in ``stop``."""

    exited_at: float | None     # time.monotonic() when it was seen gone; None: it survived SIGKILL
    killed: bool                # it needed SIGKILL
    exit_status: int | None     # known for children only


def spawn(argv: Sequence[str], log_path: str, *, header: str | None = None, append: bool = True,
          ready_pipe: bool = False, detached: bool = False, work_dir: str | None = None,
          env: dict[str, str] | None = None) -> SupervisedProcess:
    """Start ``argv`` with stdin from /dev/null and its output in ``log_path``.

    ``ready_pipe``: stdout stays a pipe for ``read_ready_line`` and only stderr goes to the log;
    otherwise both go to the log. ``append`` keeps earlier runs' lines (after a ``header`` line
    that ``log_tail`` can start from); else the log is truncated. ``detached``: its own session,
    so it outlives the caller and a Ctrl-C at the caller's terminal.
    """
    with open(log_path, "ab" if append else "wb") as log:
        if header is not None:
            log.write(f"{header}\n".encode())
            log.flush()
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE if ready_pipe else log,
                                 stderr=log if ready_pipe else subprocess.STDOUT,
                                 start_new_session=detached, cwd=work_dir, env=env)
    return SupervisedProcess(popen.pid, popen=popen)


def read_ready_line(process: subprocess.Popen | SupervisedProcess, timeout_s: float) -> dict:
    """The JSON line a process prints on stdout once it serves; NodeProcessError if none in time."""
    popen = process.popen if isinstance(process, SupervisedProcess) else process
    deadline = time.monotonic() + timeout_s
    fd = popen.stdout.fileno()
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise NodeProcessError(f"no ready line within {timeout_s} s")
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            raise NodeProcessError(f"the process exited before it was ready (exit status {popen.wait(5)})")
        line += chunk
        if len(line) > READY_LINE_BYTES_MAX:
            raise NodeProcessError("the ready line is too long: not a node's ready line")
    try:
        return json.loads(line)
    except ValueError:
        raise NodeProcessError(f"the ready line is not JSON: {line[:200]!r}") from None


def wait_exit(processes: Sequence[SupervisedProcess], timeout_s: float) -> dict[int, float]:
    """Poll until each process has exited or ``timeout_s`` passes; index in ``processes`` ->
    the monotonic time it was seen gone."""
    exited: dict[int, float] = {}
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / EXIT_POLL_INTERVAL_S) + 2):
        for index, process in enumerate(processes):
            if index not in exited and not process.alive():
                exited[index] = time.monotonic()
        if len(exited) == len(processes) or time.monotonic() >= deadline:
            break
        time.sleep(EXIT_POLL_INTERVAL_S)
    return exited


def stop(processes: Sequence[SupervisedProcess], timeout_s: float,
         kill_wait_s: float = KILL_WAIT_S) -> list[Ending]:
    """Stop every process at once: SIGCONT (a paused process cannot act on SIGTERM) and SIGTERM,
    wait up to ``timeout_s`` for all, SIGKILL the rest and wait up to ``kill_wait_s`` more.
    One ``Ending`` per process, in order; one already gone ends at once, not killed."""
    for process in processes:
        process.signal(signal.SIGCONT)
        process.signal(signal.SIGTERM)
    exited = wait_exit(processes, timeout_s)
    survivors = [index for index in range(len(processes)) if index not in exited]
    for index in survivors:
        processes[index].signal(signal.SIGKILL)
    after_kill = wait_exit([processes[index] for index in survivors], kill_wait_s)
    exited.update({survivors[position]: at for position, at in after_kill.items()})
    return [Ending(exited.get(index), index in survivors, process.exit_status)
            for index, process in enumerate(processes)]


def stop_child(process: subprocess.Popen | SupervisedProcess, timeout_s: float,
               kill_wait_s: float = KILL_WAIT_S) -> int:
    """``stop`` for one child process; its exit status (-9 when killed). NodeProcessError if it
    survived SIGKILL for ``kill_wait_s``."""
    supervised = process if isinstance(process, SupervisedProcess) else SupervisedProcess(process.pid, popen=process)
    ending = stop([supervised], timeout_s, kill_wait_s)[0]
    if ending.exit_status is None:
        raise NodeProcessError(f"process {supervised.pid} still runs {kill_wait_s:g} s after SIGKILL")
    return ending.exit_status


def thread_states(pid: int, proc: str = "/proc") -> list[str]:
    """The state letter of each thread of ``pid`` (``R``, ``S``, ``T`` stopped, ...); [] if
    it is gone. A thread that ends while they are read is left out."""
    states = []
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    for tid in tids:
        try:
            states.append(_stat_state(f"{proc}/{pid}/task/{tid}/stat").decode())
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
    return states


def _stat_state(path: str) -> bytes:
    """The state field of a /proc ``stat`` file: after the name's last parenthesis (a name
    may hold any)."""
    with open(path, "rb") as handle:
        return handle.read().rsplit(b")", 1)[1].split()[0]


def wait_stopped(pid: int, stopped: bool, timeout_s: float, proc: str = "/proc") -> bool:
    """Poll until every thread of ``pid`` is stopped by a signal (``stopped``; after SIGSTOP)
    or none is (after SIGCONT), or ``timeout_s`` passes; whether it came to that. The kill
    returns once the signal is sent: a process of several threads (a node's loop, its
    follow thread, flusher, preallocator) stops one thread at a time after it."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = thread_states(pid, proc)
        if not states:
            return False   # gone
        if all(state in "Tt" for state in states) if stopped else not any(state in "Tt" for state in states):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(STOP_POLL_INTERVAL_S)


def pid_runs(pid: int, argv_marker: str | None, work_dir: str | None) -> bool:
    """Whether ``pid`` runs (not a zombie) with ``argv_marker`` in its argv or ``work_dir`` as
    its working directory (a recorded pid may since belong to another process)."""
    try:
        state = _stat_state(f"/proc/{pid}/stat")
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
        return False
    if state in (b"Z", b"X"):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # our own zombie (started by another object here): reap it
        return False
    return (argv_marker is not None and os.fsencode(argv_marker) in argv) or cwd == work_dir


def log_tail(path: str, *, lines: int | None = None, bytes_max: int = LOG_TAIL_BYTES_MAX,
             after: str | None = None, missing: str | None = None) -> str:
    """The end of a log file as text: its last ``bytes_max`` bytes, from the last ``after``
    marker in them, and of those the last ``lines`` lines when given. A missing or unreadable
    file gives ``missing`` (default: a sentence naming the path)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - bytes_max))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return f"(no log at {path})" if missing is None else missing
    if after is not None and (marker := text.rfind(after)) >= 0:
        text = text[marker:]
    return "\n".join(text.splitlines()[-lines:]) if lines is not None else text

