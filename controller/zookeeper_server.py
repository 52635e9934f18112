"""A standalone ZooKeeper server from the Debian ``zookeeper`` package, run as a child process.

    with ZooKeeperServer(tmp_path / "zk", tick_ms=250) as zk:
        client = KazooClient(hosts=zk.hosts)
        ...
        zk.stop()            # outage: SIGTERM, then SIGKILL after a grace period
        zk.start()           # same port, same data directory: sessions and znodes survive

Everything lives under ``base_dir``: ``conf/zoo.cfg``, ``conf/log4j.properties``,
``data/`` (snapshots and transaction log), ``zookeeper.log`` (log4j) and ``stdout.log``
(the JVM's own output, where a failure before logging starts shows up). The server binds
127.0.0.1 only, with the admin HTTP server off and the ``srvr``/``ruok`` four-letter words
allowed; ``start`` returns once ``srvr`` reports a serving mode.

The session timeouts the server grants are clamped to [2, 20] x ``tick_ms``, so a test that
wants 1-2 s sessions uses a tick of 250-500 ms.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from .errors import ZooKeeperServerError

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
# zookeeper.jar's manifest names its own dependencies (Class-Path); these two add a log4j
# binding so the server writes its log instead of slf4j's "no binding" notice.
LOGGING_JARS = ("/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar")
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

_START_ATTEMPTS_MAX = 3        # a port picked by port=0 can be taken before java binds it
_PR_SET_PDEATHSIG = 1


class ZooKeeperServer:
    """One standalone ZooKeeper on 127.0.0.1; ``start``/``stop`` may be repeated (data is kept)."""

    def __init__(self, base_dir, port: int = 0, tick_ms: int = 500, *, java: str = "java",
                 start_timeout_s: float = 30.0, stop_timeout_s: float = 10.0,
                 heap_mb: int = 128, die_with_parent: bool = False) -> None:
        """``die_with_parent`` asks Linux to SIGKILL the server when the thread that started it
        exits (PR_SET_PDEATHSIG): right for a test suite that starts it from the main thread,
        wrong when ``start`` runs in a short-lived worker thread."""
        self.base_dir = Path(base_dir).absolute()
        self.tick_ms = tick_ms
        self._requested_port = port
        self._port: int | None = None
        self._java = java
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._heap_mb = heap_mb
        self._die_with_parent = die_with_parent
        self._process: subprocess.Popen | None = None
        self._stdout = None
        for jar in (ZOOKEEPER_JAR, *LOGGING_JARS):
            if not os.path.exists(jar):
                raise ZooKeeperServerError(f"{jar} is missing: install Debian's zookeeper package "
                                           f"(apt-get install zookeeper)")

    # -- public API ---------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise ZooKeeperServerError("the ZooKeeper server has not been started yet, so it has no port")
        return self._port

    @property
    def hosts(self) -> str:
        """The connect string for clients, ``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self.running else None

    @property
    def log_path(self) -> Path:
        return self.base_dir / "zookeeper.log"

    def start(self) -> None:
        """Start the server and return once it serves; a restart reuses the first port and data."""
        if self.running:
            return
        fixed_port = self._port or self._requested_port
        last_error: ZooKeeperServerError | None = None
        for _ in range(1 if fixed_port else _START_ATTEMPTS_MAX):
            try:
                self._start_once(fixed_port or _free_loopback_port())
                return
            except ZooKeeperServerError as error:
                last_error = error
                self._kill()
                if not fixed_port:
                    self._port = None
        assert last_error is not None
        raise last_error

    def stop(self) -> None:
        """SIGTERM, wait up to ``stop_timeout_s``, then SIGKILL. Safe to call when not running."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=self._stop_timeout_s)
        self._close()

    def kill(self) -> None:
        """SIGKILL at once (a crash rather than a shutdown)."""
        self._kill()

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 80) -> str:
        """The last ``lines`` lines of the server log and of the JVM's own output."""
        parts = []
        for path in (self.log_path, self.base_dir / "stdout.log"):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                if text:
                    parts.append(f"--- {path} ---\n" + "\n".join(text))
        return "\n".join(parts) if parts else f"(no ZooKeeper log under {self.base_dir})"

    def four_letter_word(self, word: str, timeout_s: float = 2.0) -> str:
        """Send a four-letter command (``srvr`` or ``ruok``) and return the reply."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s) as sock:
            sock.sendall(word.encode())
            chunks = []
            for _ in range(64):    # replies are a few hundred bytes
                chunk = sock.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def __enter__(self) -> "ZooKeeperServer":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------------------

    def _write_config(self, port: int) -> Path:
        conf = self.base_dir / "conf"
        data = self.base_dir / "data"
        conf.mkdir(parents=True, exist_ok=True)
        data.mkdir(parents=True, exist_ok=True)
        (conf / "zoo.cfg").write_text(
            f"tickTime={self.tick_ms}\n"
            f"dataDir={data}\n"
            f"clientPort={port}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=srvr,ruok,conf,stat,cons,mntr\n"
            "maxClientCnxns=0\n"
            "autopurge.snapRetainCount=3\n"
            "autopurge.purgeInterval=0\n")
        (conf / "log4j.properties").write_text(
            "log4j.rootLogger=INFO, FILE\n"
            "log4j.appender.FILE=org.apache.log4j.FileAppender\n"
            f"log4j.appender.FILE.File={self.log_path}\n"
            "log4j.appender.FILE.Append=true\n"
            "log4j.appender.FILE.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n\n")
        return conf

    def launch_command(self, port: int) -> list[str]:
        """Write ``conf/`` for ``port`` and return the JVM's argv, for a caller that runs the
        server as its own detached process (``hastore cluster up``) instead of through ``start``."""
        conf = self._write_config(port)
        classpath = ":".join([str(conf), ZOOKEEPER_JAR, *LOGGING_JARS])
        return [self._java, f"-Xmx{self._heap_mb}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-Dzookeeper.jmx.log4j.disable=true", "-cp", classpath, MAIN_CLASS, str(conf / "zoo.cfg")]

    def _start_once(self, port: int) -> None:
        command = self.launch_command(port)
        self._stdout = open(self.base_dir / "stdout.log", "ab")
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self._stdout,
                                         stderr=subprocess.STDOUT, cwd=self.base_dir,
                                         preexec_fn=_die_with_parent if self._die_with_parent else None)
        deadline = time.monotonic() + self._start_timeout_s
        self._port = port   # four_letter_word needs it
        try:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    raise ZooKeeperServerError(f"ZooKeeper exited with status {self._process.returncode} "
                                               f"while starting on port {port}:\n{self.log_tail(30)}")
                if self._serving():
                    return
                time.sleep(0.05)
        except BaseException:
            self._kill()        # never leave a half-started java behind (Ctrl-C included)
            raise
        raise ZooKeeperServerError(f"ZooKeeper did not serve on 127.0.0.1:{port} within "
                                   f"{self._start_timeout_s} s:\n{self.log_tail(30)}")

    def _serving(self) -> bool:
        # ``conf`` names the data directory: the answer must come from this server, not from
        # another one that already holds the port
        try:
            return ("Mode:" in self.four_letter_word("srvr", timeout_s=0.5)
                    and f"dataDir={self.base_dir / 'data'}" in self.four_letter_word("conf", timeout_s=0.5))
        except OSError:
            return False

    def _kill(self) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
            process.wait(timeout=self._stop_timeout_s)
        self._close()

    def _close(self) -> None:
        self._process = None
        if self._stdout is not None:
            self._stdout.close()
            self._stdout = None


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
