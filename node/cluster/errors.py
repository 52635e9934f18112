"""The errors of local clusters: every ``hastore cluster`` failure a person can act on."""

from __future__ import annotations

from ..errors import NodeError


class ClusterError(NodeError):
    """A local cluster command cannot do what was asked; the message says why and what to do."""


class ClusterConfigError(ClusterError):
    """cluster.yaml has an unknown key or a bad value (the key's path is named)."""

