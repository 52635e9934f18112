"""The client library: Connection (pipelined requests), Admin, Producer, Consumer, and
blocking wrappers of them (SyncAdmin, SyncProducer, SyncConsumer) for code outside trio.

    async with open_admin("127.0.0.1:10911") as admin:
        await admin.create_topic("orders", queue_count=4)
    async with open_producer("127.0.0.1:10911") as producer:
        result = await producer.send("orders", b"...", keys=["order-1"])
    async with open_consumer("127.0.0.1:10911", "orders", "billing", from_beginning=True) as consumer:
        async for message in consumer: ...; await consumer.commit()

Outcomes are never guessed. A send the node refused before writing (NOT_MASTER, busy, no
connection) is retried, bounded; a send whose request left but whose reply never came
(connection lost, timeout) raises UnknownOutcomeError with the messages' UNIQ_KEYs and is
never retried, so a retry can never silently store a message twice.

It imports only the wire protocol (node/wire/), the pure codec and the error types: never
the node server, the storage engine, numpy, prometheus_client or kazoo (a test holds it to
that in a fresh interpreter). Modules: values (messages and results), connection, admin,
producer, consumer, sync (the blocking wrappers), routing and routed_consumer (a topic spread
over groups: RoutedProducer, RoutedConsumer; kazoo loaded only when ZooKeeperDirectory is
first used); cli and lag hold the client commands.
"""

from .admin import Admin, open_admin
from .connection import (CONNECT_TIMEOUT_MS, REQUEST_TIMEOUT_MS, Connection, ConnectionStatistics, connect,
                         connect_stream, open_connection)
from .consumer import Consumer, open_consumer
from .producer import Producer, ProducerStatistics, open_producer
from .routed_consumer import RoutedConsumer, RoutedMessage, open_routed_consumer
from .routing import (MessageQueue, NodeDirectory, RoutedProducer, RoutedResults, ZooKeeperDirectory,
                      open_routed_producer)
from .sync import SyncAdmin, SyncConsumer, SyncProducer
from .values import OutgoingMessage, ReceivedMessage, SendResult, error_from_reply, new_uniq_key, send_fields

__all__ = [
    "Admin", "open_admin", "CONNECT_TIMEOUT_MS", "REQUEST_TIMEOUT_MS", "Connection", "ConnectionStatistics", "connect",
    "connect_stream", "open_connection", "Consumer", "open_consumer", "Producer", "ProducerStatistics",
    "open_producer", "SyncAdmin", "SyncConsumer", "SyncProducer", "OutgoingMessage", "ReceivedMessage", "SendResult",
    "error_from_reply", "new_uniq_key", "send_fields", "RoutedConsumer", "RoutedMessage", "open_routed_consumer",
    "MessageQueue", "NodeDirectory", "RoutedProducer", "RoutedResults", "ZooKeeperDirectory", "open_routed_producer",
]
