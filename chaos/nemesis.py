"""Nemeses: faults, each a small piece with a heal that undoes it, and a schedule of them that
follows from a seed.

A nemesis starts its fault through a ``ClusterControl`` (process control and, for a proxied
cluster, the Toxiproxy proxies) and returns a ``Fault``: its kind, its target and the undo
actions its heal runs, last first. Faults combine by running several nemeses and healing
each; nothing is remembered anywhere but in the Fault.

Kinds, by family (``--nemesis`` takes family names or kinds):

    kill        kill-master, kill-slave, kill-node        kill -9, heal: start again
    controller  kill-controller                           the active controller
    zookeeper   kill-zookeeper, pause-zookeeper
    pause       pause-master, pause-master-long, pause-slave   SIGSTOP, heal: SIGCONT;
                pause-master-long holds at least twice the ZooKeeper session timeout
    partition   partition-master-zk, partition-master-slaves, partition-master-clients,
                partition-slave (one slave from everything), partition-oneway (master -> slaves
                blackholed, slave -> master acks still flowing)            proxied only
    toxic       ha-latency, ha-bandwidth, ha-reset-peer, ha-blackhole, ha-slicer: on every
                slave -> master HA link                                     proxied only

Proxy names (what a proxied cluster creates): ``client_to_NODE``, ``SLAVE_to_MASTER_ha``,
``NODE_to_zk``, ``CONTROLLER_to_zk``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Protocol

from node.cluster.proxies import client_proxy, ha_proxy, zk_proxy  # noqa: F401  (the names a proxied cluster gives)

from .errors import NemesisError


class ClusterControl(Protocol):
    """What nemeses need from a cluster (chaos.control.LocalControl drives a LocalCluster)."""

    session_timeout_ms: int
    proxied: bool

    def master(self, group: str) -> str: ...
    def slaves(self, group: str) -> list[str]: ...
    def nodes(self) -> list[str]: ...
    def active_controller(self) -> str: ...
    def kill(self, name: str) -> None: ...
    def start(self, name: str) -> None: ...
    def pause(self, name: str) -> None: ...
    def resume(self, name: str) -> None: ...
    def disable_proxy(self, name: str) -> None: ...
    def enable_proxy(self, name: str) -> None: ...
    def add_toxic(self, proxy: str, type: str, name: str, stream: str, attributes: dict) -> None: ...
    def remove_toxic(self, proxy: str, name: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault in force: ``undo`` holds (method of ClusterControl, arguments) run by ``heal``, last first."""

    kind: str
    target: str
    undo: tuple[tuple[str, tuple], ...]


def heal(control: ClusterControl, fault: Fault) -> list[str]:
    """Undo ``fault``, every action even when one fails; the errors of those that failed."""
    errors = []
    for method, args in reversed(fault.undo):
        try:
            getattr(control, method)(*args)
        except Exception as error:  # a heal must try every action; the runner reports what failed
            errors.append(f"{method}{args}: {type(error).__name__}: {error}")
    return errors


def _choose(candidates: list[str], pick: float, what: str) -> str:
    if not candidates:
        raise NemesisError(f"no {what} to fault")
    ordered = sorted(candidates)
    return ordered[min(len(ordered) - 1, int(pick * len(ordered)))]


# --- the pieces --------------------------------------------------------------------------------
def _kill(control: ClusterControl, kind: str, name: str) -> Fault:
    control.kill(name)
    return Fault(kind, name, (("start", (name,)),))


def _pause(control: ClusterControl, kind: str, name: str) -> Fault:
    control.pause(name)
    return Fault(kind, name, (("resume", (name,)),))


def _disable(control: ClusterControl, kind: str, target: str, proxies: list[str]) -> Fault:
    _need_proxies(control, kind)
    undo = []
    for proxy in proxies:
        control.disable_proxy(proxy)
        undo.append(("enable_proxy", (proxy,)))
    return Fault(kind, target, tuple(undo))


def _toxic(control: ClusterControl, kind: str, target: str, proxies: list[str], type_: str, stream: str,
           attributes: dict) -> Fault:
    _need_proxies(control, kind)
    undo = []
    name = f"chaos_{kind}"
    for proxy in proxies:
        control.add_toxic(proxy, type_, name, stream, attributes)
        undo.append(("remove_toxic", (proxy, name)))
    return Fault(kind, target, tuple(undo))


def _need_proxies(control: ClusterControl, kind: str) -> None:
    if not control.proxied:
        raise NemesisError(f"{kind} needs a proxied cluster (`hastore cluster up --proxied`, or --proxied)")


def _ha_links(control: ClusterControl, group: str) -> tuple[str, list[str]]:
    master = control.master(group)
    return master, [ha_proxy(slave, master) for slave in control.slaves(group)]


Starter = Callable[[ClusterControl, str, float], Fault]

# kind -> start(control, group, pick); ``pick`` in [0, 1) chooses among candidates
STARTERS: dict[str, Starter] = {
    "kill-master": lambda c, g, p: _kill(c, "kill-master", c.master(g)),
    "kill-slave": lambda c, g, p: _kill(c, "kill-slave", _choose(c.slaves(g), p, f"slave of {g}")),
    "kill-node": lambda c, g, p: _kill(c, "kill-node", _choose(c.nodes(), p, "node")),
    "kill-controller": lambda c, g, p: _kill(c, "kill-controller", c.active_controller()),
    "kill-zookeeper": lambda c, g, p: _kill(c, "kill-zookeeper", "zookeeper"),
    "pause-zookeeper": lambda c, g, p: _pause(c, "pause-zookeeper", "zookeeper"),
    "pause-master": lambda c, g, p: _pause(c, "pause-master", c.master(g)),
    "pause-master-long": lambda c, g, p: _pause(c, "pause-master-long", c.master(g)),
    "pause-slave": lambda c, g, p: _pause(c, "pause-slave", _choose(c.slaves(g), p, f"slave of {g}")),
    "partition-master-zk": lambda c, g, p: _disable(c, "partition-master-zk", c.master(g), [zk_proxy(c.master(g))]),
    "partition-master-slaves": lambda c, g, p: _disable(c, "partition-master-slaves", *_ha_links(c, g)),
    "partition-master-clients": lambda c, g, p: _disable(c, "partition-master-clients", c.master(g),
                                                         [client_proxy(c.master(g))]),
    "partition-slave": lambda c, g, p: _partition_slave(c, g, p),
    "partition-oneway": lambda c, g, p: _toxic(c, "partition-oneway", *_ha_links(c, g), "timeout", "downstream",
                                               {"timeout": 0}),
    "ha-latency": lambda c, g, p: _toxic(c, "ha-latency", *_ha_links(c, g), "latency", "downstream",
                                         {"latency": 200, "jitter": 150}),
    "ha-bandwidth": lambda c, g, p: _toxic(c, "ha-bandwidth", *_ha_links(c, g), "bandwidth", "downstream",
                                           {"rate": 64}),
    "ha-reset-peer": lambda c, g, p: _toxic(c, "ha-reset-peer", *_ha_links(c, g), "reset_peer", "upstream",
                                            {"timeout": 500}),
    "ha-blackhole": lambda c, g, p: _toxic(c, "ha-blackhole", *_ha_links(c, g), "timeout", "upstream",
                                           {"timeout": 0}),
    "ha-slicer": lambda c, g, p: _toxic(c, "ha-slicer", *_ha_links(c, g), "slicer", "downstream",
                                        {"average_size": 64, "size_variation": 32, "delay": 100}),
}


def _partition_slave(control: ClusterControl, group: str, pick: float) -> Fault:
    master = control.master(group)
    slave = _choose(control.slaves(group), pick, f"slave of {group}")
    return _disable(control, "partition-slave", slave, [zk_proxy(slave), ha_proxy(slave, master), client_proxy(slave)])


FAMILIES: dict[str, tuple[str, ...]] = {
    "kill": ("kill-master", "kill-slave", "kill-node"),
    "controller": ("kill-controller",),
    "zookeeper": ("kill-zookeeper", "pause-zookeeper"),
    "pause": ("pause-master", "pause-master-long", "pause-slave"),
    "partition": ("partition-master-zk", "partition-master-slaves", "partition-master-clients", "partition-slave",
                  "partition-oneway"),
    "toxic": ("ha-latency", "ha-bandwidth", "ha-reset-peer", "ha-blackhole", "ha-slicer"),
}
PROXIED_FAMILIES = ("partition", "toxic")
LONG_PAUSE_SESSIONS = 2.0    # pause-master-long holds at least this many session timeouts


def expand_kinds(names: str | list[str]) -> tuple[str, ...]:
    """``kill,pause`` or ``all`` or single kinds -> the fault kinds, in a stable order without repeats."""
    if isinstance(names, str):
        names = [name.strip() for name in names.split(",") if name.strip()]
    kinds: list[str] = []
    for name in names:
        if name == "all":
            found = [kind for family in FAMILIES.values() for kind in family]
        elif name in FAMILIES:
            found = list(FAMILIES[name])
        elif name in STARTERS:
            found = [name]
        else:
            raise NemesisError(f"unknown nemesis {name!r}: use families {', '.join(FAMILIES)} (or all), or kinds "
                               f"{', '.join(STARTERS)}")
        kinds += [kind for kind in found if kind not in kinds]
    if not kinds:
        raise NemesisError("no nemesis named: pass --nemesis kill,pause,... ")
    return tuple(kinds)


def needs_proxies(kind: str) -> bool:
    return any(kind in FAMILIES[family] for family in PROXIED_FAMILIES)


def start_fault(control: ClusterControl, kind: str, group: str = "g1", pick: float = 0.0) -> Fault:
    """Start a fault of ``kind`` on ``group`` (``pick`` chooses among candidate targets)."""
    if kind not in STARTERS:
        raise NemesisError(f"unknown fault kind {kind!r}")
    return STARTERS[kind](control, group, pick)


# --- the schedule ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PlannedFault:
    """One cycle of a schedule: the fault, how long it holds, the quiet time before it, the pick."""

    cycle: int
    kind: str
    hold_s: float
    rest_s: float
    pick: float

    def to_json(self) -> dict:
        return {"cycle": self.cycle, "kind": self.kind, "hold_s": self.hold_s, "rest_s": self.rest_s,
                "pick": self.pick}


def plan_schedule(seed: int, kinds: tuple[str, ...], cycles: int, *, hold_s: tuple[float, float] = (1.0, 4.0),
                  rest_s: tuple[float, float] = (1.0, 3.0), session_timeout_ms: int = 0) -> tuple[PlannedFault, ...]:
    """``cycles`` faults drawn from ``kinds`` by a generator seeded with ``seed``: the same
    arguments give the same schedule. pause-master-long holds at least LONG_PAUSE_SESSIONS
    session timeouts (plus a second)."""
    if not kinds:
        raise NemesisError("a schedule needs at least one fault kind")
    if cycles < 0:
        raise NemesisError(f"cycles must be >= 0, not {cycles}")
    rng = random.Random(seed)
    planned = []
    for cycle in range(1, cycles + 1):
        kind = rng.choice(kinds)
        hold = round(rng.uniform(*hold_s), 3)
        if kind == "pause-master-long":
            hold = max(hold, round(LONG_PAUSE_SESSIONS * session_timeout_ms / 1000 + 1.0, 3))
        planned.append(PlannedFault(cycle, kind, hold, round(rng.uniform(*rest_s), 3), round(rng.random(), 6)))
    return tuple(planned)
