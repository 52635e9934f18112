"""The node.yaml keys are documented from NodeConfig itself: the README's list, `hastore node
start --help` and `hastore node config-example` name every field with its default, and the
example loads back to the defaults."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re

import pytest
import yaml
from click.testing import CliRunner

from node.errors import NodeConfigError
from node.server.cli import node_group
from node.server.config import (NodeConfig, config_example, config_from_mapping, config_keys, config_reference,
                                with_secret_from_environment)

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_every_field_is_a_documented_key_with_its_default():
    keys = {key.name: key for key in config_keys()}
    assert list(keys) == [f.name for f in dataclasses.fields(NodeConfig)]
    assert keys["connections_max"].default == "1024"
    assert keys["secret"].default == "null"
    undocumented = [name for name, key in keys.items() if not key.note and not key.notes]
    assert undocumented == []


def test_the_readme_holds_the_generated_list():
    text = README.read_text(encoding="utf-8")
    found = re.search(r"<!-- node-config-keys:begin -->\n```yaml\n(.*?)\n```\n<!-- node-config-keys:end -->",
                      text, re.S)
    assert found, "README.md lost its node.yaml key list"
    assert found.group(1) == config_reference(), "README.md's key list drifted: paste config_reference() there"


def test_help_lists_every_key_and_config_example_loads_to_the_defaults():
    runner = CliRunner()
    help_text = runner.invoke(node_group, ["start", "--help"], terminal_width=200).output
    for field in dataclasses.fields(NodeConfig):
        assert f"{field.name}:" in help_text
    example = runner.invoke(node_group, ["config-example"]).output
    assert config_from_mapping(yaml.safe_load(example)) == NodeConfig()
    assert example.count("\n# ") > 10


def test_the_secret_comes_from_a_private_file_or_the_environment(tmp_path):
    path = tmp_path / "secret"
    path.write_text("s3cret\n")
    os.chmod(path, 0o600)
    assert config_from_mapping({"secret_file": str(path)}).secret == "s3cret"
    os.chmod(path, 0o644)
    with pytest.raises(NodeConfigError, match="chmod 600"):
        config_from_mapping({"secret_file": str(path)})
    with pytest.raises(NodeConfigError, match="not both"):
        config_from_mapping({"secret_file": str(path), "secret": "x"})
    assert with_secret_from_environment(NodeConfig(), {"HASTORE_SECRET": "env"}).secret == "env"
    assert with_secret_from_environment(NodeConfig(secret="yaml"), {"HASTORE_SECRET": "env"}).secret == "yaml"
