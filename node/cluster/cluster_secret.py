"""Where a local cluster's secret comes from, so that it need not be written in cluster.yaml.

In order: cluster.yaml's ``secret``, or its ``secret_file`` (mode 0600, read at load,
topology.py); else ``HASTORE_SECRET`` in the environment of ``hastore cluster up``. A secret
from the environment is kept in DIR/secret (mode 0600) and the topology names that file, so
every later command on the directory (status, restart, chaos, a new ``up``) finds it without
the variable, and no node.yaml or cluster.json holds the secret itself: each node.yaml names
the file (``secret_file``). A later ``up`` with HASTORE_SECRET set to another value replaces
the kept one (not a secret_file the user gave, which stays the user's).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

from ..server.config import SECRET_ENV
from .state import write_atomically
from .topology import ClusterConfigError, ClusterTopology

SECRET_FILE = "secret"


def with_secret_from_environment(topology: ClusterTopology, directory: str,
                                 environ: Mapping[str, str]) -> ClusterTopology:
    """``topology`` with HASTORE_SECRET kept in DIR/secret, when cluster.yaml names no secret
    (or names that kept file); else ``topology`` as it is."""
    value = environ.get(SECRET_ENV)
    kept = os.path.join(os.path.abspath(directory), SECRET_FILE)
    if not value or (topology.secret is not None and topology.secret_file != kept):
        return topology
    if "\n" in value.strip("\r\n"):
        raise ClusterConfigError(f"{SECRET_ENV}: the secret must be one line")
    value = value.strip("\r\n")
    if topology.secret != value:
        write_atomically(kept, value + "\n", private=True)
    return dataclasses.replace(topology, secret=value, secret_file=kept,
                               source={**{k: v for k, v in topology.source.items() if k != "secret"},
                                       "secret_file": kept})
