"""advertised_client_address / advertised_ha_address: what a node tells others to dial
(NOT_MASTER replies, ZooKeeper records, the replication handshake, status), defaulting to
where it listens; refused with the key named when nobody could dial it."""

from __future__ import annotations

import pytest
import yaml

from node.errors import NodeConfigError
from node.server.busy_poll import BusyPoll
from node.server.config import NodeConfig, config_example, config_from_mapping
from node.server.connections import ConnectionCounts
from node.server.node import StatusSources


def test_by_default_a_node_advertises_the_addresses_it_is_bound_to():
    config = NodeConfig()
    assert (config.advertised_client_address, config.advertised_ha_address) == (None, None)
    # port 0 in the config: the bound port, known only once listening, is what is advertised
    assert config.advertised_addresses("127.0.0.1:40001", "127.0.0.1:40002") == ("127.0.0.1:40001",
                                                                                   "127.0.0.1:40002")


def test_an_advertised_address_replaces_the_bound_one_each_on_its_own():
    config = config_from_mapping({"advertised_client_address": "proxy.example:30111"})
    assert config.advertised_addresses("10.0.0.5:10911", "10.0.0.5:10912") == ("proxy.example:30111",
                                                                               "10.0.0.5:10912")
    both = config_from_mapping({"advertised_client_address": "nat.example:1", "advertised_ha_address": "nat.example:2"})
    assert both.advertised_addresses("10.0.0.5:10911", "10.0.0.5:10912") == ("nat.example:1", "nat.example:2")


@pytest.mark.parametrize(("mapping", "message"), [
    ({"advertised_client_address": "proxy"}, "advertised_client_address: must be 'host:port'"),
    ({"advertised_ha_address": "proxy:99999"}, "advertised_ha_address: must be 'host:port'"),
    ({"advertised_client_address": "proxy:0"}, "advertised_client_address: 'proxy:0' has port 0"),
    ({"advertised_client_address": "0.0.0.0:10911"}, "listen-on-every-interface host"),
    ({"advertised_ha_address": "[::]:10912"}, "advertised_ha_address: '\\[::\\]:10912' is a listen-on-every"),
    ({"advertised_client_address": "h:7", "advertised_ha_address": "h:7"}, "would be advertised for both"),
    ({"advertised_client_address": "127.0.0.1:10912"}, "would be advertised for both"),   # the default HA
    ({"advertised_client_address": 30111}, "advertised_client_address: must be str | None"),
])
def test_an_address_nobody_can_dial_is_refused_with_its_key_named(mapping, message):
    with pytest.raises(NodeConfigError, match=message):
        config_from_mapping(mapping)


def test_the_keys_are_in_the_example_and_load_back_unset():
    example = config_example()
    assert "\nadvertised_client_address: null" in example and "\nadvertised_ha_address: null" in example
    assert "advertised.listeners" in example   # what it is, beside the key
    loaded = config_from_mapping(yaml.safe_load(example))
    assert loaded.advertised_client_address is None and loaded.advertised_ha_address is None


def test_status_names_the_advertised_addresses_beside_the_bound_ones():
    counts, busy_poll = ConnectionCounts(), BusyPoll(0)
    status = StatusSources("127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003", 0, counts, busy_poll,
                           replication=dict, controller=None, advertised=("proxy:30111", "127.0.0.1:1002"))
    reply = status()
    assert (reply["client_address"], reply["advertised_client_address"]) == ("127.0.0.1:1001", "proxy:30111")
    assert reply["advertised_ha_address"] == "127.0.0.1:1002"
    unset = StatusSources("127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003", 0, counts, busy_poll,
                          replication=dict, controller=None)()
    assert (unset["advertised_client_address"], unset["advertised_ha_address"]) == ("127.0.0.1:1001",
                                                                                     "127.0.0.1:1002")
