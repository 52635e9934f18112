"""``hastore node start``: run one node process in the foreground."""

from __future__ import annotations

import json
import sys

import click
import trio

from ..errors import NodeConfigError
from .config import load_config


# --- node ----------------------------------------------------------------------------------
@click.group("node")
def node_group() -> None:
    """Run a hastore node."""


@node_group.command("start")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="YAML config (node_id, store_path, client_address, role, flush, ...).")
def node_start(config_path: str) -> None:
    """Run a node in the foreground until SIGTERM or SIGINT (then it shuts down cleanly).

    Once serving it prints one JSON line on stdout: {"ready": true, "client_address": ...}.
    """
    from ..server.node import run_node_until_signalled
    try:
        config = load_config(config_path)
    except NodeConfigError as error:
        raise click.ClickException(f"bad config {config_path}: {error}") from None

    def ready(node) -> None:
        click.echo(json.dumps({"ready": True, "node_id": config.node_id, "client_address": node.client_address,
                               "metrics_address": node.metrics_address, "role": node.role.state.role.value}))
        sys.stdout.flush()

    trio.run(run_node_until_signalled, config, ready)
