"""The peer hastore's sync replication is compared with: a Redis primary and two replicas.

    if redis_server_path() is None: ...                  # INSTALL_HINT says what to do
    with RedisGroup.start(directory) as group:           # primary + 2 replicas, online
        figures = run_batched(group.primary_client(), "s1", seconds=5, messages_max=200_000)
        figures = run_single(group.primary_client(), "s2", samples=1000, seconds=60)
        group.stored_counts("s1")                        # XLEN on every member
    # left the block: each redis-server gets SIGTERM (SIGKILL after a bound), by pid

Each ``redis-server`` is its own process on 127.0.0.1, on a port free when it starts, in
its own directory: AOF on with ``appendfsync everysec`` (what hastore's async flush does:
the page cache now, the disk within a second), no RDB snapshots, and no automatic AOF
rewrite (a compaction fork that hastore's append-only log has no counterpart of; it would
land at a random point of a round). Replicas also keep their own AOF. The system service
is never touched.

The workloads, with redis-py (its hiredis parser when installed) and 1 KiB messages:

    batched   pipelines of ``XADD`` x 100 followed by ``WAIT 2 timeout``, one round trip each;
              a pipeline's messages count as acked only when WAIT reports both replicas
    single    ``XADD`` + ``WAIT 2 timeout`` per message (one round trip), one at a time:
              p50 / p99 of that round trip
    alone     ``XADD`` alone per message: what WAIT adds, by difference

Every loop is bounded by a count and a deadline.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import time

from ..cluster.process import free_port
from ..errors import BenchPeerError

INSTALL_HINT = ("redis-server is not installed; install it with `apt-get install redis-server` (Debian/Ubuntu) "
                "and do not start its system service: the bench starts its own on free loopback ports")
REPLICAS = 2
PIPELINE_MESSAGES = 100
WAIT_TIMEOUT_MS = 3_000          # as hastore's slave_timeout_ms
START_TIMEOUT_S = 30
ONLINE_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20
LOG_TAIL_BYTES = 3000
BODY = b"r" * 1024
SERVER_SETTINGS = ("--bind", "127.0.0.1", "--protected-mode", "yes", "--daemonize", "no",
                   "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                   "--auto-aof-rewrite-percentage", "0", "--repl-diskless-sync", "yes")


def peer_problem() -> str | None:
    """Why the Redis peer cannot run here (what to install), or None when it can."""
    if redis_server_path() is None:
        return INSTALL_HINT
    try:
        import redis  # noqa: F401  (redis-py, with hiredis when installed)
    except ImportError:
        return "redis-py is not installed; install it with `pip install 'redis[hiredis]'` (or the test extra)"
    return None


def redis_server_path() -> str | None:
    """Where ``redis-server`` is, or None when it is not installed."""
    return shutil.which("redis-server")


def redis_version() -> str:
    """``redis-server --version``'s version (``v=7.0.15`` -> ``7.0.15``), '' when unknown."""
    path = redis_server_path()
    if path is None:
        return ""
    output = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    for word in output.split():
        if word.startswith("v="):
            return word[2:]
    return output.strip()


def _log_tail(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - LOG_TAIL_BYTES))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


class RedisServer:
    """One ``redis-server`` process, known by its pid, its port and its directory."""

    def __init__(self, process: subprocess.Popen, port: int, directory: str) -> None:
        self.process = process
        self.port = port
        self.directory = directory
        self.log_path = os.path.join(directory, "redis.log")

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, directory: str, *extra: str) -> "RedisServer":
        """Run a redis-server in ``directory`` on a free loopback port until it answers PING."""
        path = redis_server_path()
        if path is None:
            raise BenchPeerError(INSTALL_HINT)
        os.makedirs(directory, exist_ok=True)
        port = free_port()   # below the ephemeral range: no outgoing connection takes it first
        command = [path, "--port", str(port), "--dir", directory, "--logfile", os.path.join(directory, "redis.log"),
                   *SERVER_SETTINGS, *extra]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        server = cls(process, port, directory)
        try:
            server._wait_answering()
        except BaseException:
            server.stop()
            raise
        return server

    def client(self):
        """A redis-py client of this server (RESP over TCP on loopback)."""
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=WAIT_TIMEOUT_MS / 1000 + 30)

    def _wait_answering(self) -> None:
        import redis
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise BenchPeerError(f"redis-server on port {self.port} exited with status "
                                     f"{self.process.returncode}:\n{_log_tail(self.log_path)}")
            try:
                with self.client() as client:
                    if client.ping():
                        return
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise BenchPeerError(f"redis-server on port {self.port} did not answer within {START_TIMEOUT_S} s:\n"
                                     f"{_log_tail(self.log_path)}")
            time.sleep(0.02)

    def stop(self) -> int:
        """SIGTERM (Redis flushes its AOF and exits), SIGKILL after a bound; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(STOP_TIMEOUT_S)


class RedisGroup:
    """A primary and its replicas, started together and stopped together."""

    def __init__(self, primary: RedisServer, replicas: list[RedisServer]) -> None:
        self.primary = primary
        self.replicas = replicas

    @property
    def members(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    @property
    def pids(self) -> dict[str, int]:
        """Each member's pid, by role name (``primary``, ``replica0``, ...)."""
        return {"primary": self.primary.pid, **{f"replica{i}": r.pid for i, r in enumerate(self.replicas)}}

    @classmethod
    def start(cls, directory: str, replicas: int = REPLICAS) -> "RedisGroup":
        """Start the primary, then its replicas, and wait until every replica is online."""
        primary = RedisServer.start(os.path.join(directory, "primary"))
        group = cls(primary, [])
        try:
            for index in range(replicas):
                group.replicas.append(RedisServer.start(os.path.join(directory, f"replica{index}"),
                                                        "--replicaof", "127.0.0.1", str(primary.port)))
            group.wait_online()
        except BaseException:
            group.stop()
            raise
        return group

    def primary_client(self):
        return self.primary.client()

    def wait_online(self, timeout_s: float = ONLINE_TIMEOUT_S) -> None:
        """Until the primary lists every replica as ``online`` and each replica's link is up."""
        deadline = time.monotonic() + timeout_s
        with self.primary.client() as primary:
            while True:
                info = primary.info("replication")
                online = sum(1 for key, value in info.items()
                             if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online")
                if online >= len(self.replicas) and all(self._link_up(r) for r in self.replicas):
                    return
                if time.monotonic() > deadline:
                    raise BenchPeerError(f"{online} of {len(self.replicas)} Redis replicas online after {timeout_s} s;"
                                         f" the primary's log:\n{_log_tail(self.primary.log_path)}")
                time.sleep(0.05)

    @staticmethod
    def _link_up(replica: RedisServer) -> bool:
        with replica.client() as client:
            return client.info("replication").get("master_link_status") == "up"

    def stored_counts(self, key: str) -> dict[str, int]:
        """XLEN of stream ``key`` on every member, by role name."""
        counts = {}
        for name, member in zip(self.pids, self.members):
            with member.client() as client:
                counts[name] = int(client.xlen(key))
        return counts

    def delete(self, key: str) -> None:
        """Drop stream ``key`` (on the primary; the replicas follow): memory stays flat across rounds."""
        with self.primary.client() as client:
            client.delete(key)

    def stop(self) -> None:
        """Stop the replicas, then the primary, each by its pid."""
        for member in reversed(self.members):
            member.stop()

    def __enter__(self) -> "RedisGroup":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def run_batched(client, key: str, *, seconds: float, messages_max: int, replicas: int = REPLICAS,
                pipeline_messages: int = PIPELINE_MESSAGES) -> dict:
    """Pipelines of XADD x ``pipeline_messages`` (100) + ``WAIT replicas``, back to back on
    one connection, until ``seconds`` pass or ``messages_max`` are sent; acked messages per
    second."""
    acked = failed = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline and acked + failed < messages_max:
        pipe = client.pipeline(transaction=False)
        for _ in range(pipeline_messages):
            pipe.xadd(key, {"body": BODY})
        pipe.execute_command("WAIT", replicas, WAIT_TIMEOUT_MS)
        replies = pipe.execute()
        if replies[-1] >= replicas:
            acked += pipeline_messages
        else:
            failed += pipeline_messages
    elapsed = time.perf_counter() - started
    return {"acked": acked, "failed": failed, "seconds": round(elapsed, 3), "msgs_per_s": round(acked / elapsed, 1)}


def run_single(client, key: str, *, samples: int, seconds: float, replicas: int = REPLICAS,
               wait: bool = True) -> dict:
    """One XADD (+ ``WAIT replicas`` when ``wait``) at a time, as one round trip, for
    ``samples`` messages or ``seconds``; p50 / p99 of the round trip in µs."""
    times, failed = run_single_times(client, key, samples=samples, deadline=time.perf_counter() + seconds,
                                     replicas=replicas, wait=wait)
    return latency_figures(times, failed)


def run_single_times(client, key: str, *, samples: int, deadline: float, replicas: int = REPLICAS,
                     wait: bool = True) -> tuple[list[float], int]:
    """``samples`` single sends (or fewer, once ``time.perf_counter()`` passes ``deadline``):
    the acked ones' round trips in µs, and how many were not acked."""
    times = []
    failed = 0
    while len(times) + failed < samples and time.perf_counter() < deadline:
        began = time.perf_counter()
        if wait:
            pipe = client.pipeline(transaction=False)
            pipe.xadd(key, {"body": BODY})
            pipe.execute_command("WAIT", replicas, WAIT_TIMEOUT_MS)
            ok = pipe.execute()[-1] >= replicas
        else:
            ok = client.xadd(key, {"body": BODY}) is not None
        if ok:
            times.append((time.perf_counter() - began) * 1e6)
        else:
            failed += 1
    return times, failed


def latency_figures(times_us: list[float], failed: int) -> dict:
    """p50 / p99 (µs) of the acked sends' round trips, with the counts."""
    if not times_us:
        return {"acked": 0, "failed": failed, "p50_us": None, "p99_us": None}
    ordered = sorted(times_us)
    return {"acked": len(ordered), "failed": failed, "p50_us": round(statistics.median(ordered), 1),
            "p99_us": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1)}
