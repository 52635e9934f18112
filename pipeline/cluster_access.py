"""Reaching a live cluster from Spark's Python processes: the ``hastore`` source and sink
options that name it, finding the group's master (through ZooKeeper or by asking nodes), and
retrying an idempotent call across a failover.

Spark's Python workers and its driver-side planner are plain processes, never inside a trio
run, so everything here uses the client library's blocking wrappers (``SyncAdmin``,
``SyncProducer``). Options (shared by the source and the sink):

=================  ==========================================================================
bootstrap          client addresses of the group's nodes, ``host:port[,host:port...]``: the
                   master is the node that says it is master (or the one a slave names)
zk                 ZooKeeper hosts instead: the master is read from the controller's record
cluster            cluster name under ZooKeeper (default ``hastore``)
group              the group whose master is wanted (default ``g1`` with ``bootstrap``); with
                   ``zk`` and no ``group`` each topic follows its route in ZooKeeper
                   (``hastore topic create T --zk HOSTS``): its queues in every group that
                   holds some, each group's master found on its own
secret             the cluster secret, if it has one (else ``HASTORE_SECRET`` from the
                   environment of the Spark processes)
requestTimeoutMs   bound of one request (default 10000)
failoverTimeoutMs  how long a read or a send waits for a master before the task fails
                   (default 60000)
=================  ==========================================================================
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Callable, TypeVar

from .errors import OptionError, PipelineError

DEFAULT_CLUSTER = "hastore"
DEFAULT_GROUP = "g1"
REQUEST_TIMEOUT_MS_DEFAULT = 10_000
FAILOVER_TIMEOUT_MS_DEFAULT = 60_000
RETRY_PAUSE_S = (0.05, 0.1, 0.2, 0.4, 0.8)   # then 0.8 s until the deadline

T = TypeVar("T")
log = logging.getLogger(__name__)


class MasterUnavailableError(PipelineError):
    """No master of the group could be found or reached within the failover timeout."""


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    """Where the group lives and how to talk to it (picklable: it travels to executors)."""

    bootstrap: tuple[str, ...]
    zk: str | None
    cluster: str = DEFAULT_CLUSTER
    group: str | None = DEFAULT_GROUP        # None: routed (zk only), topics across their groups
    secret: str | None = None
    request_timeout_ms: int = REQUEST_TIMEOUT_MS_DEFAULT
    failover_timeout_ms: int = FAILOVER_TIMEOUT_MS_DEFAULT

    @property
    def routed(self) -> bool:
        return self.group is None

    def for_group(self, group: str) -> "ClusterTarget":
        """The same cluster, one group of it."""
        return replace(self, group=group)

    def describe(self) -> str:
        where = f"ZooKeeper {self.zk}, cluster {self.cluster}" if self.zk else f"nodes {','.join(self.bootstrap)}"
        return f"group {self.group} ({where})" if self.group else f"the topics' routes ({where})"


def positive_int(options, name: str, default: int | None, low: int = 1, high: int = 2**62) -> int | None:
    """An integer option in ``[low, high]`` (``default`` when absent)."""
    raw = options.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name} must be an integer, not {raw!r}") from None
    if not low <= value <= high:
        raise OptionError(f"option {name} must lie in [{low}, {high}], not {value}")
    return value


def boolean(options, name: str, default: bool) -> bool:
    """A true/false option (``default`` when absent)."""
    value = str(options.get(name, default)).strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, not {options.get(name)!r}")
    return value == "true"


def target_from_options(options) -> ClusterTarget:
    """ClusterTarget from source or sink options; exactly one of ``bootstrap`` and ``zk``."""
    bootstrap = tuple(a.strip() for a in str(options.get("bootstrap") or "").split(",") if a.strip())
    zk = str(options.get("zk") or "").strip() or None
    if bool(bootstrap) == bool(zk):
        raise OptionError("hastore needs exactly one of option bootstrap (host:port of the group's nodes, "
                          "comma-separated) and option zk (ZooKeeper hosts, with cluster and group)")
    for address in bootstrap:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise OptionError(f"option bootstrap: {address!r} is not host:port")
    group = str(options.get("group") or "").strip() or (None if zk else DEFAULT_GROUP)
    return ClusterTarget(bootstrap, zk, str(options.get("cluster") or DEFAULT_CLUSTER), group,
                         options.get("secret") or os.environ.get("HASTORE_SECRET") or None,
                         positive_int(options, "requestTimeoutMs", REQUEST_TIMEOUT_MS_DEFAULT, 100, 600_000),
                         positive_int(options, "failoverTimeoutMs", FAILOVER_TIMEOUT_MS_DEFAULT, 100, 3_600_000))


ROUTES_FRESH_S = 5.0        # a route read from ZooKeeper is used this long (routes only grow)
_ROUTES: dict = {}


def topic_routes(target: ClusterTarget, topics, *, clock: Callable[[], float] = time.monotonic) -> dict:
    """``{topic: {group: (queue ids)}}`` from the routes in ZooKeeper (a routed target);
    read again after ROUTES_FRESH_S. MasterUnavailableError when ZooKeeper cannot be read,
    OptionError for a topic without a route."""
    now = clock()
    key = (target.zk, target.cluster)
    cached = {t: entry[1] for t in topics if (entry := _ROUTES.get((*key, t))) and now - entry[0] < ROUTES_FRESH_S}
    missing = [t for t in topics if t not in cached]
    if missing:
        from controller.errors import ControllerError
        from controller.routes import read_route
        from controller.znodes import make_client, start_client
        timeout_s = min(target.request_timeout_ms, 10_000) / 1000
        client = make_client(target.zk, session_timeout_ms=max(2000, int(timeout_s * 1000)))
        try:
            start_client(client, timeout_s, "the hastore source")
            for topic in missing:
                route = read_route(client, target.cluster, topic, timeout_s)
                if route is None:
                    raise OptionError(f"topic {topic} has no route in cluster {target.cluster} (ZooKeeper "
                                      f"{target.zk}): create it with `hastore topic create {topic} --zk {target.zk}`, "
                                      f"or name the group that holds it with option group")
                cached[topic] = route.as_mapping()
                _ROUTES[(*key, topic)] = (now, cached[topic])
        except ControllerError as error:
            raise MasterUnavailableError(f"cannot read the routes of {', '.join(missing)}: {error}") from None
        finally:
            try:
                client.stop()
                client.close()
            except Exception as error:    # a session that never started: nothing to release
                log.debug("closing the ZooKeeper client: %s", error)
    return {topic: cached[topic] for topic in topics}


def find_master_once(target: ClusterTarget) -> str:
    """The client address of the group's master now; MasterUnavailableError if none is known."""
    if target.zk:
        from controller.errors import ControllerError
        from controller.znodes import find_master
        try:
            record = find_master(target.zk, target.cluster, target.group,
                                 timeout_s=min(target.request_timeout_ms, 10_000) / 1000)
        except ControllerError as error:
            raise MasterUnavailableError(str(error)) from None
        return record.client_address
    from node.client import SyncAdmin
    from node.errors import NodeError
    problems = []
    for address in target.bootstrap:
        try:
            with SyncAdmin(address, secret=target.secret, timeout_ms=min(target.request_timeout_ms, 5000)) as admin:
                status = admin.status()
        except (NodeError, OSError) as error:
            problems.append(f"{address}: {error}")
            continue
        if status.get("role") == "master":
            return address
        if status.get("master_address"):
            return status["master_address"]
        problems.append(f"{address}: {status.get('role')} without a known master")
    raise MasterUnavailableError(f"no master of {target.describe()}: " + "; ".join(problems))


def retrying(target: ClusterTarget, action: Callable[[], T], retry_on: tuple[type[BaseException], ...],
             what: str, *, on_retry: Callable[[BaseException], None] | None = None,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> T:
    """``action()``, again after each error of ``retry_on`` (``on_retry`` told first, so the
    caller can drop a connection and find the master again), until the failover timeout."""
    deadline = clock() + target.failover_timeout_ms / 1000
    attempt = 0
    while True:
        try:
            return action()
        except retry_on as error:
            if on_retry is not None:
                on_retry(error)
            now = clock()
            if now >= deadline:
                raise MasterUnavailableError(f"{what}: {target.describe()} gave no answer within the failover "
                                             f"timeout ({target.failover_timeout_ms} ms); last error: {error}") from error
            sleep(min(RETRY_PAUSE_S[min(attempt, len(RETRY_PAUSE_S) - 1)], max(0.0, deadline - now)))
            attempt += 1
