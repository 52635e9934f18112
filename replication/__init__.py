"""hastore replication (HA): a master's HAService streams its CommitLog to slaves' HAClients.

    from replication import HAService, HAClient, EpochFile, serve_ha, serve_ha_client

Modules: ``epochs`` (the epoch file and the consistent point), ``protocol`` (auth,
handshake and stream frames; pure), ``sync_state`` (acks, sync-state set, confirm offset;
pure), ``transport`` (exact reads), ``store_protocol`` (``ReplicaStore``: all that replication
uses of the store, which the store's ``replica_log`` satisfies), ``ha_service`` (master),
``ha_client`` (slave),
``cli`` (``hastore lag``), ``bench`` (``hastore bench replicate``).
"""

from .epochs import EpochEntry, EpochFile, Resync, ResyncKind, find_resync
from .errors import (EpochFileError, FlushSlaveTimeout, HaAuthError, HandshakeRefused, HaProtocolError,
                     InSyncReplicasNotEnough, ReplicaWaitError, ReplicationError, ReplicationFenced)
from .ha_client import HAClient, HaClientSettings, HaClientStatistics, serve_ha_client
from .ha_service import HAService, HaServiceSettings, HaServiceStatistics, SlaveStatistics, serve_ha
from .store_protocol import ReplicaStore
from .sync_state import ReplicaTracker, SyncSettings

__all__ = [
    "EpochEntry", "EpochFile", "Resync", "ResyncKind", "find_resync",
    "ReplicationError", "EpochFileError", "HaAuthError", "HandshakeRefused", "HaProtocolError", "ReplicaWaitError",
    "FlushSlaveTimeout", "InSyncReplicasNotEnough", "ReplicationFenced",
    "HAClient", "HaClientSettings", "HaClientStatistics", "serve_ha_client",
    "HAService", "HaServiceSettings", "HaServiceStatistics", "SlaveStatistics", "serve_ha",
    "ReplicaTracker", "SyncSettings", "ReplicaStore",
]
