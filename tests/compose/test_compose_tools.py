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
