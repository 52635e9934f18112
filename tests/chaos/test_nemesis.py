"""Unit tests of the nemeses and the schedule, against a recording fake of ClusterControl."""

from __future__ import annotations

import pytest

from chaos.errors import NemesisError
from chaos.nemesis import (FAMILIES, Fault, STARTERS, expand_kinds, heal, needs_proxies, plan_schedule, start_fault)


class FakeControl:
    """A cluster of g1-n1 (master), g1-n2, g1-n3, two controllers: records what is done to it."""

    session_timeout_ms = 1500

    def __init__(self, proxied: bool = True) -> None:
        self.proxied = proxied
        self.calls: list[tuple] = []
        self.down: set[str] = set()
        self.paused: set[str] = set()
        self.disabled: set[str] = set()
        self.toxics: set[tuple[str, str]] = set()

    def master(self, group):
        return "g1-n1"

    def slaves(self, group):
        return ["g1-n3", "g1-n2"]

    def nodes(self):
        return ["g1-n1", "g1-n2", "g1-n3"]

    def active_controller(self):
        return "controller-2"

    def kill(self, name):
        self.calls.append(("kill", name))
        self.down.add(name)

    def start(self, name):
        self.calls.append(("start", name))
        self.down.remove(name)

    def pause(self, name):
        self.paused.add(name)

    def resume(self, name):
        self.paused.remove(name)

    def disable_proxy(self, name):
        self.disabled.add(name)

    def enable_proxy(self, name):
        if name == "broken":
            raise OSError("no such proxy")
        self.disabled.remove(name)

    def add_toxic(self, proxy, type, name, stream, attributes):
        self.toxics.add((proxy, name))

    def remove_toxic(self, proxy, name):
        self.toxics.remove((proxy, name))

    def clean(self) -> bool:
        return not (self.down or self.paused or self.disabled or self.toxics)


@pytest.mark.parametrize("kind", sorted(STARTERS))
def test_every_fault_is_undone_by_its_heal(kind):
    control = FakeControl()
    fault = start_fault(control, kind, "g1", pick=0.99)
    assert fault.kind == kind and fault.target
    assert not control.clean()
    assert heal(control, fault) == []
    assert control.clean()


def test_targets_follow_the_pick_and_the_roles():
    control = FakeControl()
    assert start_fault(control, "kill-master").target == "g1-n1"
    assert start_fault(control, "kill-slave", pick=0.0).target == "g1-n2"
    assert start_fault(control, "kill-slave", pick=0.7).target == "g1-n3"
    assert start_fault(control, "kill-controller").target == "controller-2"
    partition = start_fault(control, "partition-slave", pick=0.0)
    assert control.disabled == {"g1-n2_to_zk", "g1-n2_to_g1-n1_ha", "client_to_g1-n2"}
    links = start_fault(control, "partition-master-slaves")
    assert {"g1-n2_to_g1-n1_ha", "g1-n3_to_g1-n1_ha"} <= control.disabled
    heal(control, links)
    heal(control, partition)
    assert not control.disabled


def test_faults_combine_and_heal_reports_every_failed_action():
    control = FakeControl()
    one, two = start_fault(control, "pause-slave"), start_fault(control, "ha-latency")
    assert control.paused and control.toxics
    heal(control, two)
    heal(control, one)
    assert control.clean()
    errors = heal(control, Fault("x", "y", (("enable_proxy", ("broken",)), ("pause", ("g1-n2",)))))
    assert control.paused == {"g1-n2"}      # run although the action undone after it failed
    assert len(errors) == 1 and "no such proxy" in errors[0]


def test_proxied_faults_are_refused_on_an_unproxied_cluster():
    control = FakeControl(proxied=False)
    for kind in FAMILIES["partition"] + FAMILIES["toxic"]:
        assert needs_proxies(kind)
        with pytest.raises(NemesisError, match="proxied"):
            start_fault(control, kind)
    assert not needs_proxies("kill-master")


def test_kinds_expand_from_families_and_refuse_unknown_names():
    assert expand_kinds("kill,pause-slave,kill-master") == ("kill-master", "kill-slave", "kill-node", "pause-slave")
    assert set(expand_kinds("all")) == set(STARTERS)
    with pytest.raises(NemesisError, match="unknown nemesis 'chaos-monkey'"):
        expand_kinds("kill,chaos-monkey")
    with pytest.raises(NemesisError):
        expand_kinds("")


def test_the_schedule_follows_from_the_seed():
    kinds = expand_kinds("kill,pause")
    one = plan_schedule(7, kinds, 20, session_timeout_ms=1500)
    assert one == plan_schedule(7, kinds, 20, session_timeout_ms=1500)
    assert one != plan_schedule(8, kinds, 20, session_timeout_ms=1500)
    assert [p.cycle for p in one] == list(range(1, 21))
    assert all(1.0 <= p.hold_s <= 4.0 or p.kind == "pause-master-long" for p in one)
    long = [p for p in plan_schedule(1, ("pause-master-long",), 5, session_timeout_ms=3000)]
    assert all(p.hold_s >= 7.0 for p in long)
    assert len({p.kind for p in plan_schedule(3, kinds, 60)}) == len(kinds)
