import pytest

from node.server.config import NodeConfig, config_from_mapping, load_config
from node.errors import NodeConfigError


def test_defaults_are_complete_and_valid():
    config = config_from_mapping({})
    assert config.client_address.endswith(":10911")
    assert config.ha_address.endswith(":10912")
    assert config.metrics_address.endswith(":10913")
    assert config.role == "master" and config.flush == "async" and config.secret is None


def test_yaml_file_round_trip(tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text("node_id: 7\nrole: slave\nmaster_ha_address: 127.0.0.1:20912\nflush: sync\n"
                    "store:\n  commitlog_segment_bytes: 65536\n  file_reserved_hours: 1\n")
    config = load_config(str(path))
    assert config.node_id == "7" and config.role == "slave" and config.flush == "sync"
    store = config.store_config()
    assert store.commitlog_segment_bytes == 65536 and store.flush == "sync"


@pytest.mark.parametrize("mapping, key", [
    ({"nodeid": "x"}, "nodeid"),
    ({"role": "leader"}, "role"),
    ({"flush": "sometimes"}, "flush"),
    ({"replication": 3}, "replication"),
    ({"client_address": "localhost"}, "client_address"),
    ({"client_address": "127.0.0.1:70000"}, "client_address"),
    ({"role": "slave"}, "master_ha_address"),
    ({"connections_max": 0}, "connections_max"),
    ({"busy_poll_us": -1}, "busy_poll_us"),
    ({"busy_poll_us": 10_001}, "busy_poll_us"),
    ({"busy_poll_us": 0.5}, "busy_poll_us"),
    ({"auto_create_topics": "yes"}, "auto_create_topics"),
    ({"store": {"segment": 1}}, "store.segment"),
    ({"store": {"commitlog_segment_bytes": "big"}}, "store.commitlog_segment_bytes"),
    ({"store": {"commitlog_segment_bytes": 10}}, "store"),
    ({"store": {"flush": "sync"}}, "store.flush"),
])
def test_unknown_keys_and_bad_values_are_refused_with_the_key_named(mapping, key):
    with pytest.raises(NodeConfigError) as caught:
        config_from_mapping(mapping)
    assert key in str(caught.value)


def test_bad_yaml_is_refused(tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text("role: [master\n")
    with pytest.raises(NodeConfigError, match="not valid YAML"):
        load_config(str(path))
    path.write_text("- a\n- b\n")
    with pytest.raises(NodeConfigError, match="mapping"):
        load_config(str(path))


def test_frozen():
    config = NodeConfig()
    with pytest.raises(Exception):
        config.role = "slave"
    assert config.replace(role="slave", master_ha_address="127.0.0.1:1").role == "slave"
