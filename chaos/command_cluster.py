"""The local cluster a chaos command works on (``hastore drill failover``, ``hastore chaos run``):
found running in DIR or started with ``--up``, and every expected failure turned into a
one-line click error."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Iterator

import click

from node.cluster import ClusterError, ClusterStartError, LocalCluster

from .errors import ChaosError


@contextlib.contextmanager
def command_cluster(directory: str, start_cluster: bool, proxied: bool = False) -> Iterator[LocalCluster]:
    """The LocalCluster in ``directory``. When none runs: started if ``start_cluster`` (--up),
    and stopped when the block ends, else a click error saying how to start one. ``proxied``
    starts it as ``hastore cluster up --proxied`` does (every link through a proxy of its own,
    for the cluster's life); a running cluster is taken as it is. A cluster
    that fails to start prints each process's log tail on stderr; ClusterError and ChaosError
    (DrillError, RunError, NemesisError) become click errors with their message."""
    cluster = LocalCluster(directory)
    started = False
    try:
        if not cluster.running():
            if not start_cluster:
                raise click.ClickException(
                    f"no cluster is running in {os.path.abspath(directory)}: start one with "
                    f"`hastore cluster up --dir {directory}`, or pass --up")
            if proxied and not cluster.topology.proxied:
                cluster.topology = dataclasses.replace(cluster.topology, proxied=True,
                                                       source={**cluster.topology.source, "proxied": True})
            cluster.up()
            started = True
        yield cluster
    except ClusterStartError as error:
        for name, tail in error.log_tails.items():
            click.echo(f"--- last lines of {name}'s log ---\n{tail}", err=True)
        raise click.ClickException(str(error)) from None
    except (ClusterError, ChaosError) as error:
        raise click.ClickException(str(error)) from None
    finally:
        if started:
            cluster.down()
