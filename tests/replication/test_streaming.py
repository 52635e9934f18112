"""HAService and HAClient over real loopback sockets, on real stores in one trio run."""

from __future__ import annotations

import pytest
import trio

from replication import ResyncKind
from replication import protocol
from replication.transport import StreamReader

pytestmark = pytest.mark.trio

from replication_helpers import (begin_term, epoch_file, log_bytes, put, same_answers, start_master, start_slave,
                      wait_until)


async def test_empty_slave_catches_up_and_answers_queries_like_the_master(open_store):
    master, slave = open_store("master"), open_store("slave")
    master_epochs = epoch_file(master)
    begin_term(master, master_epochs)
    put(master, 1500, body_bytes=900)  # several 256 KiB segments, closing blank records included
    async with trio.open_nursery() as nursery:
        service, address = await start_master(nursery, master, master_epochs, chunk_bytes_max=100_000)
        running = await start_slave(nursery, slave, address)
        await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, what="catch-up")
        put(master, 300, prefix="live")  # streamed as it is written
        service.notify_appended()
        await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset, what="live data")
        await wait_until(lambda: service.statistics().slaves[0].ack_offset == master.max_physical_offset,
                         what="ack")
        stats = service.statistics()
        assert stats.sync_state_set == ("m", "s1") and stats.slaves[0].lag_bytes == 0
        assert stats.confirm_offset == master.max_physical_offset
        assert running.client.statistics().connected and running.client.statistics().truncated_bytes == 0
        await running.stop()
        nursery.cancel_scope.cancel()
    assert master.commit_log.segments.files[0].start_offset == 0 and len(master.commit_log.segments.files) >= 4
    assert log_bytes(slave) == log_bytes(master)
    assert epoch_file(slave).entries == master_epochs.entries
    same_answers(master, slave, "orders", ["m-0", "m-777", "m-1499", "live-5"])


async def test_restarted_slave_resumes_from_its_own_max_offset(open_store, tmp_path):
    master, slave = open_store("master"), open_store("slave")
    master_epochs = epoch_file(master)
    begin_term(master, master_epochs)
    put(master, 400)
    async with trio.open_nursery() as nursery:
        service, address = await start_master(nursery, master, master_epochs)
        running = await start_slave(nursery, slave, address)
        await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset)
        await running.stop()
        first_end = slave.max_physical_offset
        slave.shutdown()  # a restart of the slave's store
        slave.start()
        assert slave.max_physical_offset == first_end
        put(master, 400, prefix="second")
        running = await start_slave(nursery, slave, address)
        await wait_until(lambda: slave.max_physical_offset == master.max_physical_offset)
        stats = running.client.statistics()
        # only the bytes past the restart point travelled, and nothing was cut
        assert stats.received_bytes == master.max_physical_offset - first_end
        assert stats.truncated_bytes == 0 and stats.resets == 0
        await running.stop()
        nursery.cancel_scope.cancel()
    assert log_bytes(slave) == log_bytes(master)
    same_answers(master, slave, "orders", ["m-1", "second-399"])


async def test_wrong_secret_gets_no_data(open_store):
    master, slave = open_store("master"), open_store("slave")
    master_epochs = epoch_file(master)
    begin_term(master, master_epochs)
    put(master, 200)
    async with trio.open_nursery() as nursery:
        service, address = await start_master(nursery, master, master_epochs, secret="right")
        running = await start_slave(nursery, slave, address, secret="wrong")
        await wait_until(lambda: service.statistics().auth_failures >= 2, what="refused handshakes")
        assert slave.max_physical_offset == 0 and running.client.statistics().sessions == 0
        assert "HMAC" in running.client.statistics().last_error or "refused" in running.client.statistics().last_error
        await running.stop()
        # a raw peer: everything it receives is the HELLO and a refusal, not one byte of the log
        host, port = address.rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        reader = StreamReader(stream)
        hello = protocol.Hello.decode(await reader.control())
        nonce = b"n" * protocol.NONCE_BYTES
        await stream.send_all(protocol.Handshake(b"x" * 32, nonce, "intruder", "g", "c", [], 0, 0).encode())
        refusal = await reader.control()
        assert refusal == {"type": "refusal", "error": "authentication failed"}
        received = b""
        with trio.move_on_after(2):
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    break
                received += data
        assert received == b"" and hello.nonce
        await stream.aclose()
        assert service.statistics().slaves == ()
        nursery.cancel_scope.cancel()


async def test_a_slave_that_forged_the_master_is_caught(open_store):
    """The slave checks the master's proof too: a master without the secret streams nothing."""
    master, slave = open_store("master"), open_store("slave")
    master_epochs = epoch_file(master)
    begin_term(master, master_epochs)
    put(master, 50)
    async with trio.open_nursery() as nursery:
        service, address = await start_master(nursery, master, master_epochs, secret=None)
        running = await start_slave(nursery, slave, address, secret="s3cret")
        await wait_until(lambda: running.client.statistics().reconnects >= 2, what="retries")
        assert slave.max_physical_offset == 0
        await running.stop()
        nursery.cancel_scope.cancel()


async def test_divergent_tail_of_an_old_master_is_cut_at_the_consistent_point(open_store):
    """A (epoch 1) writes; B replicates part of it; A writes more that never leaves it; B
    becomes master in epoch 2 and writes; A comes back as B's slave: A's tail is cut where
    B's epoch 2 begins, then A streams epoch 2 and both logs are identical."""
    a, b = open_store("a"), open_store("b")
    a_epochs, b_epochs = epoch_file(a), epoch_file(b)
    begin_term(a, a_epochs)
    put(a, 300, prefix="e1")
    async with trio.open_nursery() as nursery:
        service, address = await start_master(nursery, a, a_epochs, node_id="a")
        running = await start_slave(nursery, b, address, node_id="b")
        await wait_until(lambda: b.max_physical_offset == a.max_physical_offset)
        await running.stop()
        nursery.cancel_scope.cancel()
    replicated_end = b.max_physical_offset
    put(a, 250, prefix="lost")                   # A's unreplicated tail
    b_epochs = epoch_file(b)
    assert b_epochs.last_epoch == 1
    begin_term(b, b_epochs, 2)                   # B promoted at its own end
    put(b, 100, prefix="e2")
    assert a.max_physical_offset > replicated_end
    async with trio.open_nursery() as nursery:
        service, address = await start_master(nursery, b, b_epochs, node_id="b")
        running = await start_slave(nursery, a, address, node_id="a")
        await wait_until(lambda: a.max_physical_offset == b.max_physical_offset and
                         running.client.statistics().connected)
        stats = running.client.statistics()
        assert stats.truncated_bytes > 0
        await running.stop()
        nursery.cancel_scope.cancel()
    assert log_bytes(a) == log_bytes(b)
    assert epoch_file(a).entries == b_epochs.entries
    assert a.query_by_key("orders", "lost-10", 0, 2**62, 8) == []
    same_answers(b, a, "orders", ["e1-0", "e1-299", "e2-99"])


async def test_wait_for_replicas_acks_with_a_slave_and_times_out_without_one(open_store):
    from replication import FlushSlaveTimeout, InSyncReplicasNotEnough, SyncSettings
    master, slave = open_store("master"), open_store("slave")
    master_epochs = epoch_file(master)
    begin_term(master, master_epochs)
    async with trio.open_nursery() as nursery:
        service, address = await start_master(nursery, master, master_epochs, slave_timeout_ms=300,
                                              sync=SyncSettings(min_in_sync_replicas=2,
                                                                max_time_not_catchup_ms=1_000))
        try:
            service.check_replicas_for_put()
            raise AssertionError("a put without a second in-sync replica must be refused")
        except InSyncReplicasNotEnough:
            pass
        running = await start_slave(nursery, slave, address, ack_interval_ms=100)
        await wait_until(lambda: "s1" in service.statistics().sync_state_set, what="the slave joins the SSS")
        (result,) = put(master, 1)
        await service.wait_for_replicas(result.end_offset)
        assert slave.max_physical_offset >= result.end_offset
        await running.stop()   # the slave is gone, but still in the SSS for a while
        (result,) = put(master, 1)
        failed = None
        try:
            await service.wait_for_replicas(result.end_offset)
        except (FlushSlaveTimeout, InSyncReplicasNotEnough) as error:
            failed = error
        assert isinstance(failed, (FlushSlaveTimeout, InSyncReplicasNotEnough)), "never a silent success"
        await wait_until(lambda: service.statistics().sync_state_set == ("m",), what="the slave leaves the SSS")
        nursery.cancel_scope.cancel()



async def test_readers_capped_at_the_confirm_offset_see_only_what_the_sync_state_set_holds(open_store):
    from replication import SyncSettings
    master, slave = open_store("master"), open_store("slave")
    master_epochs = epoch_file(master)
    begin_term(master, master_epochs)
    master.limit_reads_to_confirm_offset(True)
    woken = []
    async with trio.open_nursery() as nursery:
        service, address = await start_master(nursery, master, master_epochs,
                                              sync=SyncSettings(min_in_sync_replicas=2, max_time_not_catchup_ms=1_000),
                                              on_confirm_advanced=lambda: woken.append(master.confirm_offset))
        (alone,) = put(master, 1, prefix="alone", queues=1)
        service.notify_appended()            # the master alone is the sync-state set: readable at once
        assert master.confirm_offset == alone.end_offset and woken
        running = await start_slave(nursery, slave, address)
        await wait_until(lambda: "s1" in service.statistics().sync_state_set, what="the slave joins the SSS")
        (both,) = put(master, 1, prefix="both", queues=1)
        service.notify_appended()
        await service.wait_for_replicas(both.end_offset)
        assert master.confirm_offset >= both.end_offset
        assert master.wait_dispatched()
        assert len(master.pull("orders", 0, 0).messages) == 2
        await running.stop()                 # the slave is gone but stays in the SSS for a while
        (unreplicated,) = put(master, 1, prefix="only-on-master", queues=1)
        service.notify_appended()
        assert master.wait_dispatched()
        assert master.pull("orders", 0, 2).messages == []     # a failover could still drop it
        await wait_until(lambda: service.statistics().sync_state_set == ("m",), what="the slave leaves the SSS")
        assert master.confirm_offset >= unreplicated.end_offset
        assert [m.body[:14] for m in master.pull("orders", 0, 2).messages] == [b"only-on-master"]
        nursery.cancel_scope.cancel()


async def test_a_put_writes_a_parked_senders_frame_itself_and_wakes_no_sender(open_store):
    # notify_appended writes a caught-up slave's frame from the put's own call: no sender task
    # is woken for a one-at-a-time put, and a waiting put sends what a writer did not notify
    from replication import SyncSettings
    master, slave = open_store("master"), open_store("slave")
    master_epochs = epoch_file(master)
    begin_term(master, master_epochs)
    async with trio.open_nursery() as nursery:
        service, address = await start_master(nursery, master, master_epochs,
                                              sync=SyncSettings(min_in_sync_replicas=2, max_time_not_catchup_ms=1_000))
        running = await start_slave(nursery, slave, address)
        await wait_until(lambda: "s1" in service.statistics().sync_state_set, what="the slave joins the SSS")
        senders = service.senders
        replica = service.tracker.replicas["s1"]
        await wait_until(lambda: senders.parked == 1, what="the sender parked")
        wakes, direct = senders.task_wakes, senders.direct_sends
        (sent,) = put(master, 1, prefix="notified")
        service.notify_appended()
        assert replica.sent_offset == sent.end_offset, "the put did not write the frame itself"
        assert (senders.task_wakes, senders.direct_sends) == (wakes, direct + 1)
        assert senders.parked == 1, "the sender task was woken"
        with trio.fail_after(5):
            await service.wait_for_replicas(sent.end_offset)
        assert (senders.task_wakes, senders.direct_sends) == (wakes, direct + 1), "a second send for the put"
        await wait_until(lambda: senders.parked == 1, what="the sender parked")
        (unsent,) = put(master, 1, prefix="not-notified")   # a writer that did not notify
        assert replica.sent_offset < unsent.end_offset
        with trio.fail_after(5):
            await service.wait_for_replicas(unsent.end_offset)
        assert senders.direct_sends == direct + 2, "the waiting put did not send its bytes"
        assert slave.max_physical_offset >= unsent.end_offset
        # far behind (a batch past DIRECT_SEND_BYTES_MAX): the put leaves it to the sender task
        await wait_until(lambda: senders.parked == 1, what="the sender parked")
        batch = put(master, 400, body_bytes=400)
        service.notify_appended()
        assert senders.task_wakes == wakes + 1 and senders.direct_sends == direct + 2
        with trio.fail_after(5):
            await service.wait_for_replicas(batch[-1].end_offset)
        assert slave.max_physical_offset == master.max_physical_offset
        await running.stop()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("follow_thread", [False, True], ids=["loop", "thread"])
async def test_a_small_frame_is_appended_and_acked_by_the_receiver_and_a_batch_still_streams(open_store,
                                                                                             follow_thread):
    # one-at-a-time puts: the slave's receiver appends and acks the frame in the step that
    # read it (no hop to the applier task), or the follow thread does (follow_thread.py); a
    # batch's frames (up to a segment each, past INLINE_APPEND_BYTES_MAX: written by the
    # applier in a worker thread, or by the follow thread from its own buffer past
    # RECEIVE_BUFFER_BYTES) still arrive whole
    from replication import SyncSettings
    from replication.follow_thread import RECEIVE_BUFFER_BYTES
    from replication.ha_client import INLINE_APPEND_BYTES_MAX
    master, slave = open_store("master"), open_store("slave")
    master_epochs = epoch_file(master)
    begin_term(master, master_epochs)
    async with trio.open_nursery() as nursery:
        service, address = await start_master(nursery, master, master_epochs,
                                              sync=SyncSettings(min_in_sync_replicas=2, max_time_not_catchup_ms=60_000))
        running = await start_slave(nursery, slave, address, follow_thread=follow_thread)
        await wait_until(lambda: "s1" in service.statistics().sync_state_set, what="the slave joins the SSS")
        client = running.client
        (first,) = put(master, 1, prefix="first")   # the term's first frame: the applier records the epoch
        service.notify_appended()
        with trio.fail_after(5):
            await service.wait_for_replicas(first.end_offset)
        assert client.appended_by_receiver == 0 and slave.max_physical_offset == first.end_offset
        assert client.frames_by_thread == (1 if follow_thread else 0)
        before = client.appended_by_receiver
        for index in range(5):
            (result,) = put(master, 1, prefix=f"single-{index}")
            service.notify_appended()
            with trio.fail_after(5):
                await service.wait_for_replicas(result.end_offset)
        assert client.appended_by_receiver == before + (0 if follow_thread else 5)
        assert client.frames_by_thread == (6 if follow_thread else 0)
        batch = put(master, 1200, body_bytes=1000)
        assert batch[-1].end_offset - batch[0].physical_offset > max(INLINE_APPEND_BYTES_MAX, RECEIVE_BUFFER_BYTES)
        service.notify_appended()
        with trio.fail_after(5):
            await service.wait_for_replicas(batch[-1].end_offset)
        assert log_bytes(slave) == log_bytes(master)
        await running.stop()
        nursery.cancel_scope.cancel()
