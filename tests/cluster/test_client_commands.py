"""The client commands as a person uses them, against a real local cluster (static roles):
bodies from arguments and stdin, keys, tags and properties, bodies printed back, and
``--dir`` instead of an address."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cluster_helpers import hastore

pytestmark = pytest.mark.integration


def test_produce_bodies_then_consume_prints_them(cluster):
    sent = hastore("produce", "--dir", cluster.directory, "--topic", "greetings", "hello", "world", "--json")
    assert sent.returncode == 0, sent.stderr
    outcome = json.loads(sent.stdout)
    assert (outcome["count"], outcome["ok"], outcome["failed"], outcome["unknown"]) == (2, 2, 0, 0)
    read = hastore("consume", "--dir", cluster.directory, "--topic", "greetings", "--group", "g",
                   "--from-beginning", "--count", "2")
    assert read.returncode == 0, read.stderr
    assert sorted(read.stdout.splitlines()) == ["hello", "world"]


def test_produce_reads_lines_from_stdin_with_key_tag_and_properties(cluster):
    done = subprocess.run([sys.executable, "-m", "node.cli", "produce", "--dir", cluster.directory, "--topic",
                           "lines", "--key", "order-7", "--tag", "new", "--property", "region=eu", "--json"],
                          input="first line\nsecond line\nthird\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] == 3
    found = hastore("query", "key", "--dir", cluster.directory, "--topic", "lines", "--key", "order-7", "--json")
    assert found.returncode == 0, found.stderr
    messages = json.loads(found.stdout)
    assert sorted(m["body"] for m in messages) == ["first line", "second line", "third"]
    assert {m["tags"] for m in messages} == {"new"} and all(m["keys"] == ["order-7"] for m in messages)
    read = hastore("consume", "--dir", cluster.directory, "--topic", "lines", "--group", "g", "--from-beginning",
                   "--count", "3", "--json")
    assert {json.loads(line)["properties"]["region"] for line in read.stdout.splitlines()} == {"eu"}


def test_generated_load_and_bodies_do_not_mix(cluster):
    refused = hastore("produce", "--dir", cluster.directory, "--topic", "t", "--count", "3", "body")
    assert refused.returncode == 2 and "not both" in refused.stderr
    bad = hastore("produce", "--dir", cluster.directory, "--topic", "t", "--property", "novalue", "x")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
    generated = hastore("produce", "--dir", cluster.directory, "--topic", "t", "--count", "5", "--size", "10",
                        "--json")
    assert json.loads(generated.stdout)["ok"] == 5


def test_dir_without_a_cluster_says_how_to_start_one(tmp_path):
    done = hastore("produce", "--dir", str(tmp_path), "--topic", "t", "x")
    assert done.returncode == 1
    assert f"hastore cluster up --dir {tmp_path}" in done.stderr
    assert "Traceback" not in done.stderr
