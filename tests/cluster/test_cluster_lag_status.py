"""`hastore cluster status` names each slave's lag status, as its master judges it."""

from __future__ import annotations

from node.cluster.cli import ProcessSpec, ProcessStatus, render_status


def spec(name: str, role: str) -> ProcessSpec:
    return ProcessSpec(name=name, kind="node", phase=0, argv=("hastore",), config_path="c", log_path="l",
                       data_path="d", group="g1", role=role, client_address="127.0.0.1:1")


def test_the_status_shows_each_slaves_lag_status_under_the_group_table():
    master = {"role": "master", "epoch": 2, "store": {"max_physical_offset": 900},
              "replication": {"role": "master", "sync_state_set": ["m", "s1"], "slaves": [
                  {"node_id": "s1", "lag_bytes": 0, "lag_status": "OK"},
                  {"node_id": "s2", "lag_bytes": 400, "lag_status": "STALLED"}]}}
    slave = {"role": "slave", "epoch": 2, "store": {"max_physical_offset": 500}, "replication": {"role": "slave"}}
    lines = render_status([ProcessStatus(spec("m", "master"), "up", 11, master, None),
                           ProcessStatus(spec("s1", "slave"), "up", 12, slave, None)])
    assert "  lag status (master m): s1 OK, s2 STALLED" in lines
    assert lines.index("  lag status (master m): s1 OK, s2 STALLED") < lines.index("  replication (m):")


def test_no_lag_line_without_slaves_or_statuses():
    bare = {"role": "master", "epoch": 1, "store": {"max_physical_offset": 0},
            "replication": {"role": "master", "slaves": [{"node_id": "s1", "lag_bytes": 0}]}}
    lines = render_status([ProcessStatus(spec("m", "master"), "up", 11, bare, None)])
    assert not any(line.lstrip().startswith("lag status") for line in lines)
