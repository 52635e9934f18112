"""A running Toxiproxy-compatible server for synchronous callers (tests, the chaos runner),
as context managers that yield the API's URL and stop the server on exit.

- ``toxiproxy_in_thread``: the server's own trio loop in a background thread of this process.
- ``toxiproxy_subprocess``: ``hastore chaos toxiproxy serve`` in a child process (its own GIL:
  what a workload in this process does cannot slow the proxies), stopped with SIGTERM.
- ``running_toxiproxy``: the real Toxiproxy named by ``TOXIPROXY_URL`` if set, else one of the
  above.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
from contextlib import contextmanager
from functools import partial
from typing import Iterator

import trio

from .errors import ToxiproxyStartError
from .server import DEFAULT_HOST, serve_toxiproxy

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
TOXIPROXY_URL_ENV = "TOXIPROXY_URL"
_LISTENING = re.compile(r"listening on (http://\S+)")


@contextmanager
def toxiproxy_in_thread(host: str = DEFAULT_HOST, port: int = 0, *, seed: int | None = None) -> Iterator[str]:
    """Run the server in a background thread; yield its URL; stop it on exit."""
    ready: queue.Queue = queue.Queue(maxsize=1)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            try:
                address = await nursery.start(partial(serve_toxiproxy, host, port, seed=seed))
            except BaseException as error:
                ready.put(error)
                raise
            ready.put((address.url, trio.lowlevel.current_trio_token(), nursery.cancel_scope))

    thread = threading.Thread(target=lambda: _run_quietly(main), name="toxiproxy", daemon=True)
    thread.start()
    try:
        started = ready.get(timeout=START_TIMEOUT_S)
    except queue.Empty:
        raise ToxiproxyStartError(f"the Toxiproxy server thread did not start within {START_TIMEOUT_S} s") from None
    if isinstance(started, BaseException):
        thread.join(STOP_TIMEOUT_S)
        raise ToxiproxyStartError(str(started)) from started
    url, token, scope = started
    try:
        yield url
    finally:
        try:
            trio.from_thread.run_sync(scope.cancel, trio_token=token)
        except trio.RunFinishedError:
            pass
        thread.join(STOP_TIMEOUT_S)


def _run_quietly(main) -> None:
    try:
        trio.run(main)
    except ToxiproxyStartError:
        pass  # reported to the caller through the queue


@contextmanager
def toxiproxy_subprocess(host: str = DEFAULT_HOST, port: int = 0) -> Iterator[str]:
    """Run ``hastore chaos toxiproxy serve`` as a child process; yield its URL; SIGTERM it on exit."""
    # -P: the caller's working directory is not put on the child's sys.path (see NodeProcess.start)
    command = [sys.executable, "-P", "-m", "chaos.toxiproxy", "serve", "--host", host, "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = _read_url(process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_S)
        for pipe in (process.stdout, process.stderr):
            pipe.close()


def _read_url(process: subprocess.Popen) -> str:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=START_TIMEOUT_S)
    except queue.Empty:
        raise ToxiproxyStartError(f"the Toxiproxy server process did not report its port within "
                                  f"{START_TIMEOUT_S} s") from None
    match = _LISTENING.search(line)
    if match is None:
        process.kill()
        error = process.stderr.read()[-2000:]
        raise ToxiproxyStartError(f"the Toxiproxy server process did not start: {error.strip() or line.strip()}")
    return match.group(1)


@contextmanager
def running_toxiproxy(*, subprocess_server: bool = False) -> Iterator[str]:
    """The URL of a Toxiproxy: ``TOXIPROXY_URL`` if set (a real Toxiproxy, left running), else
    a server of hastore's own started for the block (in a thread, or a child process)."""
    url = os.environ.get(TOXIPROXY_URL_ENV)
    if url:
        yield url.rstrip("/")
        return
    runner = toxiproxy_subprocess if subprocess_server else toxiproxy_in_thread
    with runner() as started_url:
        yield started_url
