"""compose/ agrees with hastore: node configs, ports, Toxiproxy proxies, secret, ZooKeeper,
store volumes, and every metric the Prometheus rules and the Grafana dashboard name.

Unit tests: they read files and build a node's metrics registry; no process, no Docker.
Node configs are loaded through hastore's own loader, so a key the node would refuse fails here.
"""

from __future__ import annotations

import importlib
import itertools
import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose"
COMPOSE_FILE = COMPOSE / "docker-compose.yml"
NODE_CONFIG_IN_CONTAINER = "/etc/hastore/node.yaml"
# Series Prometheus makes itself for each target; no node exports them.
PROMETHEUS_OWN_SERIES = {"up"}
REQUIRED_ALERTS = {"HastoreGroupWithoutMaster", "HastoreReplicationLagBytes", "HastoreReplicationLagTime",
                   "HastoreNodeFenced", "HastoreSyncStateSetBelowMinInSync"}


def _first_module(*names: str):
    """The first of ``names`` that imports (node/ moves modules into node/server/)."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or not name.startswith(error.name):
                raise
    raise ImportError(f"none of {', '.join(names)} imports")


node_config = _first_module("node.server.config", "node.config")
node_metrics = _first_module("node.server.metrics", "node.metrics")


# --- reading the compose files -------------------------------------------------------------
def _load_yaml(path: Path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.fixture(scope="module")
def compose() -> dict:
    return _load_yaml(COMPOSE_FILE)


def _mounts(service: dict) -> list[tuple[str, str]]:
    """(source, target) of a service's short-syntax volumes."""
    mounts = []
    for entry in service.get("volumes", []):
        source, target = entry.split(":")[:2]
        mounts.append((source, target))
    return mounts


def _command(service: dict) -> list[str]:
    return [str(part) for part in service.get("command", [])]


def _option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _node_services(compose: dict) -> dict[str, dict]:
    return {name: service for name, service in compose["services"].items()
            if _command(service)[:2] == ["node", "start"]}


@pytest.fixture(scope="module")
def nodes(compose) -> dict:
    """service name -> the NodeConfig its mounted config file loads to (hastore's own loader)."""
    configs = {}
    for name, service in _node_services(compose).items():
        config_path = _option(_command(service), "--config")
        sources = [source for source, target in _mounts(service) if target == config_path]
        assert len(sources) == 1, f"{name}: mount exactly one file at {config_path}"
        assert sources[0].startswith("./config/"), f"{name}: node configs live in compose/config/"
        configs[name] = node_config.load_config(str(COMPOSE / sources[0]))
    return configs


@pytest.fixture(scope="module")
def proxies() -> list[dict]:
    with open(COMPOSE / "toxiproxy" / "toxiproxy.json", encoding="utf-8") as handle:
        return json.load(handle)


def _env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value
    return values


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _host(address: str) -> str:
    return address.rpartition(":")[0]


# --- node configs against the compose services -----------------------------------------------
def test_two_groups_of_three_nodes_with_unique_ids(compose, nodes):
    assert len(nodes) == 6
    assert all(config.node_id == name for name, config in nodes.items())
    assert len({config.node_id for config in nodes.values()}) == len(nodes)
    groups: dict[str, list] = {}
    for config in nodes.values():
        groups.setdefault(config.group, []).append(config)
    assert sorted(groups) == ["g1", "g2"]
    for group, members in groups.items():
        assert len(members) == 3, group
        assert sorted(config.priority for config in members) == [0, 1, 2], f"{group}: one preferred master"
    assert {config.cluster for config in nodes.values()} == {"hastore"}


def test_nodes_run_in_controller_mode_under_the_two_controllers(compose, nodes):
    controllers = [service for service in compose["services"].values()
                   if _command(service)[:2] == ["controller", "start"]]
    assert len(controllers) == 2
    ids = {_option(_command(service), "--id") for service in controllers}
    assert len(ids) == 2
    for service in controllers:
        argv = _command(service)
        assert _option(argv, "--cluster") == next(iter(nodes.values())).cluster
        assert _option(argv, "--zk") == next(iter(nodes.values())).zk_hosts
    for config in nodes.values():
        assert config.zk_hosts is not None
        # what a local cluster writes in controller mode: sync replication, acks from the whole set
        assert config.replication == "sync" and config.all_ack_in_sync_state_set


def test_listeners_bind_the_service_name_and_their_ports_are_exposed(compose, nodes):
    services = compose["services"]
    for name, config in nodes.items():
        # the node registers its bound address in ZooKeeper: the service name makes it routable
        assert _host(config.client_address) == name
        assert _host(config.ha_address) == name
        exposed = {int(port) for port in services[name]["expose"]}
        assert {_port(config.client_address), _port(config.ha_address), _port(config.metrics_address)} == exposed
        assert services[name].get("hostname", name) == name
        assert "ports" not in services[name], f"{name}: clients reach nodes through toxiproxy, not directly"


def test_every_client_and_ha_link_has_a_toxiproxy_proxy(compose, nodes, proxies):
    upstreams = {proxy["name"]: proxy["upstream"] for proxy in proxies}
    listens = [_port(proxy["listen"]) for proxy in proxies]
    assert len(set(listens)) == len(listens), "two proxies listen on one port"
    assert len(upstreams) == len(proxies), "proxy names must be unique"
    assert all(proxy.get("enabled", True) for proxy in proxies)
    expected = {}
    for name, config in nodes.items():
        expected[f"{name}-client"] = config.client_address
    for slave, master in itertools.permutations(nodes.values(), 2):
        if slave.group == master.group:
            expected[f"{slave.node_id}-to-{master.node_id}-ha"] = master.ha_address
    assert upstreams == expected

    toxiproxy = compose["services"]["toxiproxy"]
    assert toxiproxy["image"].startswith("ghcr.io/shopify/toxiproxy:")
    config_flag = next(part for part in _command(toxiproxy) if part.startswith("-config="))
    assert ("./toxiproxy/toxiproxy.json", config_flag.split("=", 1)[1]) in _mounts(toxiproxy)
    published = {int(str(entry).split(":")[-1]) for entry in toxiproxy["ports"]}
    client_listens = {_port(proxy["listen"]) for proxy in proxies if proxy["name"].endswith("-client")}
    assert client_listens | {8474} == published, "publish the API and every client proxy, nothing else"


def test_every_slave_dials_each_possible_master_through_its_own_ha_proxy(nodes, proxies):
    listens = {proxy["name"]: proxy["listen"] for proxy in proxies}
    for slave, master in itertools.permutations(nodes.values(), 2):
        if slave.group != master.group:
            continue
        dialed = slave.peer_ha_addresses.get(master.ha_address)
        assert dialed is not None, f"{slave.node_id} dials {master.node_id} directly"
        assert _host(dialed) == "toxiproxy"
        assert _port(dialed) == _port(listens[f"{slave.node_id}-to-{master.node_id}-ha"])
    for config in nodes.values():
        peers_in_group = {n.ha_address for n in nodes.values() if n.group == config.group and n is not config}
        assert set(config.peer_ha_addresses) == peers_in_group


def test_secret_is_set_and_the_same_in_every_node_config_and_the_env_file(compose, nodes):
    secrets = {config.secret for config in nodes.values()}
    assert len(secrets) == 1 and None not in secrets
    env = _env_file(COMPOSE / "hastore.env")
    assert env["HASTORE_SECRET"] == secrets.pop()
    for name in ("client", "pipeline", *nodes):
        assert compose["services"][name]["env_file"] == "hastore.env", name


def test_zk_hosts_name_the_three_zookeeper_services(compose, nodes):
    ensemble = {name: service for name, service in compose["services"].items()
                if service["image"].split(":")[0] == "zookeeper"}
    assert len(ensemble) == 3
    assert sorted(int(service["environment"]["ZOO_MY_ID"]) for service in ensemble.values()) == [1, 2, 3]
    for service in ensemble.values():
        servers = service["environment"]["ZOO_SERVERS"].split()
        assert {server.split("=")[1].split(":")[0] for server in servers} == set(ensemble)
    ticks = {int(service["environment"]["ZOO_TICK_TIME"]) for service in ensemble.values()}
    assert len(ticks) == 1, "one tick time across the ensemble"
    tick_ms = ticks.pop()
    for config in nodes.values():
        assert {_host(host) for host in config.zk_hosts.split(",")} == set(ensemble)
        assert {_port(host) for host in config.zk_hosts.split(",")} == {2181}
        # ZooKeeper grants 2 to 20 ticks and would silently change anything else
        assert 2 * tick_ms <= config.zk_session_timeout_ms <= 20 * tick_ms
    for service in compose["services"].values():
        if _command(service)[:2] == ["controller", "start"]:
            assert 2 * tick_ms <= int(_option(_command(service), "--session-timeout-ms")) <= 20 * tick_ms


def test_store_path_is_the_nodes_own_named_volume(compose, nodes):
    volumes = set(compose["volumes"])
    seen = set()
    for name, config in nodes.items():
        sources = [source for source, target in _mounts(compose["services"][name]) if target == config.store_path]
        assert len(sources) == 1, f"{name}: mount a volume at store_path {config.store_path}"
        assert sources[0] in volumes, f"{name}: {sources[0]} is not a named volume"
        assert sources[0] not in seen, f"{name}: shares its store volume"
        seen.add(sources[0])


def test_spark_master_and_worker_see_every_store_read_only(compose, nodes):
    services = compose["services"]
    assert _command(services["spark-master"])[:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    worker = _command(services["spark-worker"])
    assert worker[:2] == ["spark-class", "org.apache.spark.deploy.worker.Worker"]
    master_port = _option(_command(services["spark-master"]), "--port")
    assert f"spark://spark-master:{master_port}" in worker
    for service in ("spark-worker", "pipeline"):
        for name in nodes:
            assert f"{name}-store:/stores/{name}:ro" in services[service]["volumes"], (service, name)
    assert services["pipeline"]["entrypoint"] == ["hastore", "pipeline"]


def test_dockerfile_builds_the_node_without_java_and_spark_with_it():
    stages: dict[str, str] = {}
    current = None
    for line in (COMPOSE / "Dockerfile").read_text(encoding="utf-8").splitlines():
        match = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line)
        if match:
            current = match.group(2)
            stages[current] = match.group(1) + "\n"
        elif current:
            stages[current] += line + "\n"
    assert stages["wheel"].startswith("python:3.11-slim") and stages["node"].startswith("python:3.11-slim")
    assert "jre" not in stages["node"] and "[pipeline]" not in stages["node"]
    assert "default-jre-headless" in stages["spark"] and "[pipeline]" in stages["spark"]
    services = _load_yaml(COMPOSE_FILE)["services"]
    assert {services[name]["build"]["target"] for name in ("controller-1", "g1-n1", "client")} == {"node"}
    assert {services[name]["build"]["target"] for name in ("spark-master", "spark-worker", "pipeline")} == {"spark"}


# --- Prometheus and Grafana ---------------------------------------------------------------------
_PROMQL_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                    "offset", "bool", "inf", "nan", "atan2"}


def promql_metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels, Grafana
    variables, durations and strings left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expression)       # strings
    text = re.sub(r"\{[^}]*\}", " ", text)                                            # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                                           # ranges, subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)                                          # Grafana variables
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", text):
        word, is_call = match.group(1), match.group(2)
        if not is_call and word.lower() not in _PROMQL_KEYWORDS:
            names.add(word)
    return names


def test_promql_metric_names_are_found_and_the_rest_left_out():
    assert promql_metric_names('count by (group) (up{job="a b"}) unless on (group) '
                               '(x_is_master == 1 unless on (instance) x_fenced == 1)') == {"up", "x_is_master",
                                                                                            "x_fenced"}
    assert promql_metric_names("histogram_quantile(0.99, sum by (group, le) "
                               "(rate(lat_bucket{group=~\"$group\"}[$__rate_interval])))") == {"lat_bucket"}
    assert promql_metric_names("a - a offset 1m > 0 and bool 1e6") == {"a"}
    assert promql_metric_names("sum(avg_over_time(f[$__range])) * $__range_s / 1000") == {"f"}


def exported_metric_names() -> set[str]:
    """Every sample name a node's metrics registry renders, on a master with a slave and on a
    slave (the replication collector exports different families for each role)."""
    master = {"role": "master", "fenced": None, "confirm_offset": 100, "sync_state_set": ["n1", "n2"],
              "slaves": [{"node_id": "n2", "address": "10.0.0.2:10912", "connected": True, "ack_offset": 100,
                          "lag_bytes": 0, "lag_ms": 0, "in_sync": True, "rate_bytes_per_s": 0.0,
                          "last_ack_age_ms": 0, "lag_status": "OK"}]}   # lag_status: the node's lag sampler
    slave = {"role": "slave", "fenced": None, "master_max_offset": 100, "lag_bytes": 0, "connected": True}
    names: set[str] = set()
    for status in (master, slave):
        metrics = node_metrics.NodeMetrics("n1")
        metrics.watch_replication(lambda status=status: status)
        for family in text_string_to_metric_families(metrics.render().decode()):
            names.update(sample.name for sample in family.samples)
    return names


def _rules() -> list[dict]:
    rules = []
    for path in sorted((COMPOSE / "prometheus" / "rules").glob("*.yml")):
        for group in _load_yaml(path)["groups"]:
            rules.extend(group["rules"])
    return rules


def _dashboard() -> dict:
    with open(COMPOSE / "grafana" / "dashboards" / "hastore.json", encoding="utf-8") as handle:
        return json.load(handle)


def _dashboard_expressions(dashboard: dict) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_exported_names_come_from_the_nodes_registry():
    exported = exported_metric_names()
    # counters render with _total, histograms with _bucket; per-slave lag only on a master
    assert {"hastore_put_messages_total", "hastore_put_latency_seconds_bucket", "hastore_replication_is_master",
            "hastore_replication_slave_lag_bytes", "hastore_replication_lag_bytes",
            "hastore_replication_slave_status", "hastore_replication_slave_lag_seconds"} <= exported
    assert "hastore_put_messages" not in exported


def test_every_metric_in_the_rules_and_the_dashboard_is_one_a_node_exports():
    exported = exported_metric_names() | PROMETHEUS_OWN_SERIES
    named: dict[str, set[str]] = {}
    for rule in _rules():
        named[f"rule {rule['alert']}"] = promql_metric_names(rule["expr"])
    dashboard = _dashboard()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            named[f"panel {panel['title']!r} {target['refId']}"] = promql_metric_names(target["expr"])
    for variable in dashboard["templating"]["list"]:
        match = re.fullmatch(r"label_values\((\w+),\s*\w+\)", variable["query"]["query"])
        assert match, f"variable {variable['name']}: expected label_values(metric, label)"
        named[f"variable {variable['name']}"] = {match.group(1)}
    assert all(named.values()), {where: names for where, names in named.items() if not names}
    unknown = {where: sorted(names - exported) for where, names in named.items() if names - exported}
    assert not unknown, f"metrics no node exports: {unknown}"


def test_the_alerts_asked_for_are_there_with_severity_and_summary():
    rules = {rule["alert"]: rule for rule in _rules()}
    assert REQUIRED_ALERTS <= set(rules)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"], name


def test_the_sync_state_set_alert_uses_the_nodes_min_in_sync_replicas(nodes):
    rule = next(rule for rule in _rules() if rule["alert"] == "HastoreSyncStateSetBelowMinInSync")
    match = re.fullmatch(r"\s*hastore_replication_sync_state_set_size\s*<\s*(\d+)\s*", rule["expr"])
    assert match, rule["expr"]
    assert {config.min_in_sync_replicas for config in nodes.values()} == {int(match.group(1))}


def test_prometheus_scrapes_every_nodes_metrics_port_with_its_group(compose, nodes):
    config = _load_yaml(COMPOSE / "prometheus" / "prometheus.yml")
    job = next(job for job in config["scrape_configs"] if job["job_name"] == "hastore-nodes")
    targets = {target: static["labels"]["group"] for static in job["static_configs"] for target in static["targets"]}
    assert targets == {f"{name}:{_port(node.metrics_address)}": node.group for name, node in nodes.items()}
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    assert ("./prometheus/rules", "/etc/prometheus/rules") in _mounts(compose["services"]["prometheus"])
    rules_job = re.findall(r'job="([^"]+)"', " ".join(rule["expr"] for rule in _rules()))
    assert set(rules_job) == {"hastore-nodes"}


def test_grafana_provisions_the_datasource_and_dashboard_it_uses(compose):
    datasource = _load_yaml(COMPOSE / "grafana" / "provisioning" / "datasources" / "prometheus.yml")["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"
    provider = _load_yaml(COMPOSE / "grafana" / "provisioning" / "dashboards" / "hastore.yml")["providers"][0]
    assert ("./grafana/dashboards", provider["options"]["path"]) in _mounts(compose["services"]["grafana"])
    dashboard = _dashboard()
    uids = {panel["datasource"]["uid"] for panel in dashboard["panels"] if "datasource" in panel}
    uids |= {target["datasource"]["uid"] for panel in dashboard["panels"] for target in panel.get("targets", [])}
    assert uids == {datasource["uid"]}
    expressions = " ".join(_dashboard_expressions(dashboard))
    for wanted in ("hastore_put_messages_total", "hastore_put_bytes_total", "hastore_replication_slave_lag_bytes",
                   "hastore_replication_slave_lag_ms", "hastore_replication_is_master",
                   "hastore_replication_fenced"):
        assert wanted in expressions, f"the dashboard shows no {wanted}"
