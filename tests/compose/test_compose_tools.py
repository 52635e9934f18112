"""compose/ through the tools that read it: `docker-compose config` (Debian's docker-compose,
which `make system-packages` installs), and Prometheus's promtool when it is installed.

Integration: these run other programs. No Docker engine is needed: `config` only parses,
merges and validates the files.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose" / "docker-compose.yml"
TOOL_TIMEOUT_S = 120


def _run(argv: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)


def _docker_compose() -> str:
    path = shutil.which("docker-compose")
    if path is None:
        pytest.skip("docker-compose is not installed (`make system-packages` installs Debian's docker-compose)")
    return path


def test_docker_compose_config_accepts_the_file_and_resolves_every_service():
    result = _run([_docker_compose(), "-f", str(COMPOSE_FILE), "config"])
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    services = resolved["services"]
    expected = {"zk1", "zk2", "zk3", "controller-1", "controller-2", "toxiproxy", "prometheus", "grafana",
                "spark-master", "spark-worker", "pipeline", "client",
                *(f"g{group}-n{node}" for group in (1, 2) for node in (1, 2, 3))}
    assert set(services) == expected
    # the env file reached the client-side services, and the build context is the repository
    assert services["client"]["environment"]["HASTORE_SECRET"]
    assert Path(services["g1-n1"]["build"]["context"]).resolve() == REPO
    # relative mounts resolve inside compose/
    sources = {volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
               for volume in services["g1-n1"]["volumes"]}
    assert str(REPO / "compose" / "config" / "g1-n1.yaml") in sources
    # the one-off services start only with their --profile
    assert services["client"]["profiles"] == ["tools"] and services["pipeline"]["profiles"] == ["pipeline"]
    assert not any("profiles" in services[name] for name in expected - {"client", "pipeline"})


def test_promtool_accepts_the_rules():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package has it); the unit tests still "
                    "check every metric the rules name")
    rules = sorted(str(path) for path in (REPO / "compose" / "prometheus" / "rules").glob("*.yml"))
    result = _run([promtool, "check", "rules", *rules])
    assert result.returncode == 0, result.stdout + result.stderr


def _series(metric: str, node: str, value: int) -> dict:
    group = node.split("-")[0]
    labels = f'job="hastore-nodes",instance="{node}:10913",group="{group}"'
    if metric != "up":
        labels += f',node="{node}"'
    return {"series": f"{metric}{{{labels}}}", "values": f"{value}x20"}


def test_promtool_evaluates_the_master_alerts_as_meant(tmp_path):
    """Group g1's only master is fenced and g2 has two unfenced masters: the no-master
    expression names g1 alone, the two-masters expression g2 alone."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package has it)")
    rules_path = REPO / "compose" / "prometheus" / "rules" / "hastore.yml"
    rules = {rule["alert"]: rule["expr"] for group in yaml.safe_load(rules_path.read_text())["groups"]
             for rule in group["rules"]}
    masters = {"g1-n1": 1, "g1-n2": 0, "g1-n3": 0, "g2-n1": 1, "g2-n2": 1, "g2-n3": 0}
    fenced = {"g1-n1": 1}
    series = []
    for node, is_master in masters.items():
        series += [_series("up", node, 1), _series("hastore_replication_is_master", node, is_master),
                   _series("hastore_replication_fenced", node, fenced.get(node, 0))]
    unit = {"rule_files": [str(rules_path)], "evaluation_interval": "5s", "tests": [{
        "interval": "5s", "input_series": series,
        "promql_expr_test": [
            {"expr": rules["HastoreGroupWithoutMaster"], "eval_time": "1m",
             "exp_samples": [{"labels": '{group="g1"}', "value": 3}]},
            {"expr": rules["HastoreGroupWithTwoMasters"], "eval_time": "1m",
             "exp_samples": [{"labels": '{group="g2"}', "value": 2}]}]}]}
    test_file = tmp_path / "masters_test.yml"
    test_file.write_text(yaml.safe_dump(unit))
    result = _run([promtool, "test", "rules", str(test_file)], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
