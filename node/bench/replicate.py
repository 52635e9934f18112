"""``hastore bench replicate``: replication throughput and latency between node processes.

    catch-up     an empty slave follows a master whose log holds ``--catchup-gib`` GiB
                 (written straight into the master's store first); MB/s of CommitLog bytes
                 from the slave's start to its log matching the master's (target >= 500),
                 and apart from it the slave process's start-up (to its ready line) and the
                 stream's own rate after it; as their floor, this disk's sequential write +
                 fdatasync rate for as many bytes
    produce      1 KiB messages, batches of 64, 8 in flight, for ``--seconds``: async vs sync
                 replication to one slave (min_in_sync_replicas 2) and to two (every member
                 of the sync-state set); target: sync >= 70% of async
    single       one sync-replicated send at a time (one slave): p50 and p99 in µs

Every node is its own ``hastore node start`` process on loopback, always stopped at the end;
every phase is bounded by a deadline.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

import click
import trio

from ..client.connection import BUSY_POLL_US_MAX
from ..client.producer import BUSY_POLL_US

MIB = 1024 * 1024
GIB = 1024 * MIB
BODY = b"r" * 1024
PHASE_DEADLINE_S = 600
TARGETS = {"catchup_mb_per_s_min": 500, "sync_to_async_ratio_min": 0.7}
# retention by disk use at 0.99: on a shared, fuller disk the default 0.75 would delete the
# master's first segments under the catch-up, and the slave would only ever fetch the tail
NODE_SETTINGS = {"flush": "async", "ha_heartbeat_interval_ms": 200,
                 "store": {"commitlog_segment_bytes": GIB, "index_hash_slots": 1_000_000,
                           "index_max_entries": 4_000_000, "disk_max_used_ratio": 0.99}}


def _fill_store(path: str, total_bytes: int) -> int:
    """Write ``total_bytes`` of 64 KiB messages into a fresh store at ``path``; its max offset."""
    from store import Message, MessageStore, StoreConfig
    store = MessageStore(StoreConfig(store_path=path, commitlog_segment_bytes=GIB, index_hash_slots=1_000_000,
                                     index_max_entries=4_000_000, store_host="127.0.0.1:1"))
    store.start()
    try:
        body = os.urandom(64 * 1024)
        batch = [Message("fill", body, queue_id=i % 8) for i in range(32)]
        for _ in range(total_bytes // (len(body) * len(batch)) + 2):
            if store.max_physical_offset >= total_bytes:
                break
            results = store.put_batch(batch)
            if not all(r.status.ok for r in results):
                raise click.ClickException(f"filling the master's store failed: {results[0]}")
        store.wait_dispatched(timeout_s=PHASE_DEADLINE_S)
        return store.max_physical_offset
    finally:
        store.shutdown()


def _start_group(directory: str, slaves: int, **settings):
    from ..cluster.process import NodeProcess, free_port
    master_ha = free_port()
    nodes = [NodeProcess.start(os.path.join(directory, "m"),
                               {**NODE_SETTINGS, "node_id": "m", "ha_address": f"127.0.0.1:{master_ha}", **settings})]
    try:
        for index in range(slaves):
            nodes.append(NodeProcess.start(os.path.join(directory, f"s{index}"), {
                **NODE_SETTINGS, "node_id": f"s{index}", "role": "slave", "ha_address": f"127.0.0.1:{free_port()}",
                "master_ha_address": f"127.0.0.1:{master_ha}", "master_client_address": nodes[0].client_address,
                **settings}))
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes


async def _status(address: str) -> dict:
    from ..client import open_admin
    async with open_admin(address) as admin:
        return await admin.status()


async def _wait_in_sync(master_address: str, members: int) -> None:
    with trio.fail_after(PHASE_DEADLINE_S):
        while len((await _status(master_address))["replication"]["sync_state_set"]) < members:
            await trio.sleep(0.05)


async def _catch_up(directory: str, total_bytes: int) -> dict:
    from ..cluster.process import NodeProcess, free_port
    from ..client.progress import progress_bar
    master_dir = os.path.join(directory, "m")
    started = time.perf_counter()
    filled = await trio.to_thread.run_sync(_fill_store, os.path.join(master_dir, "store"), total_bytes)
    fill_s = time.perf_counter() - started
    master_ha = free_port()
    with NodeProcess.start(master_dir, {**NODE_SETTINGS, "node_id": "m", "ha_address": f"127.0.0.1:{master_ha}"}) \
            as master:
        master_max = (await _status(master.client_address))["store"]["max_physical_offset"]
        started = time.perf_counter()
        with NodeProcess.start(os.path.join(directory, "s"), {
                **NODE_SETTINGS, "node_id": "s", "role": "slave", "ha_address": f"127.0.0.1:{free_port()}",
                "master_ha_address": f"127.0.0.1:{master_ha}"}) as slave:
            ready = time.perf_counter()
            with trio.fail_after(PHASE_DEADLINE_S), progress_bar("slave catch-up (bytes)", total=master_max) as bar:
                while (caught_up := (await _status(slave.client_address))["store"]["max_physical_offset"]) < master_max:
                    bar.update(completed=caught_up)
                    await trio.sleep(0.02)
                bar.update(completed=master_max)
            finished = time.perf_counter()
    floor_mb_per_s = await trio.to_thread.run_sync(_disk_write_floor, directory, master_max)
    elapsed, stream_s = finished - started, finished - ready
    mb_per_s, stream_mb_per_s = master_max / MIB / elapsed, master_max / MIB / stream_s
    return {"bytes": master_max, "filled_bytes": filled, "fill_seconds": round(fill_s, 2),
            "seconds": round(elapsed, 3), "mb_per_s": round(mb_per_s, 1),
            "startup_seconds": round(ready - started, 3), "stream_seconds": round(stream_s, 3),
            "stream_mb_per_s": round(stream_mb_per_s, 1),
            "disk_write_floor_mb_per_s": round(floor_mb_per_s, 1),
            "ratio_to_disk_floor": round(mb_per_s / floor_mb_per_s, 3),
            "stream_ratio_to_disk_floor": round(stream_mb_per_s / floor_mb_per_s, 3),
            "note": "seconds and mb_per_s include the slave process's start-up; stream_* start at its ready line"}


def _disk_write_floor(directory: str, total_bytes: int) -> float:
    """MB/s of writing ``total_bytes`` sequentially to a file in ``directory`` and syncing it:
    what the slave's disk allows at best, measured in the same run (the catch-up's floor)."""
    block = os.urandom(4 * MIB)
    path = os.path.join(directory, "disk-floor")
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(max(1, total_bytes // len(block))):
            os.write(fd, block)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - started
    os.unlink(path)
    return max(1, total_bytes // len(block)) * len(block) / MIB / elapsed


async def _produce(address: str, seconds: float) -> dict:
    from ..client import OutgoingMessage, open_producer
    sent = failed = 0
    async with open_producer(address, batch_count_max=64, in_flight_max=8) as producer:
        deadline = time.perf_counter() + seconds
        started = time.perf_counter()

        async def worker() -> None:
            nonlocal sent, failed
            while time.perf_counter() < deadline:
                results = await producer.send_batch("bench", [OutgoingMessage(BODY) for _ in range(64)])
                ok = sum(1 for r in results if r.ok)
                sent += ok
                failed += len(results) - ok

        with trio.fail_after(seconds + PHASE_DEADLINE_S):
            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(worker)
        elapsed = time.perf_counter() - started
    return {"msgs_per_s": round(sent / elapsed, 1), "ok": sent, "failed": failed}


async def _single(address: str, samples: int) -> dict:
    from ..client import OutgoingMessage, open_producer
    times = []
    async with open_producer(address, batch_count_max=1, linger_ms=0) as producer:
        with trio.fail_after(PHASE_DEADLINE_S):
            for _ in range(samples):
                began = time.perf_counter()
                (result,) = await producer.send_batch("single", [OutgoingMessage(BODY)])
                if not result.ok:
                    raise click.ClickException(f"a sync send failed: {result.status} {result.reason}")
                times.append((time.perf_counter() - began) * 1e6)
    ordered = sorted(times)
    return {"samples": samples, "p50_us": round(statistics.median(ordered), 1),
            "p99_us": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1)}


async def _produce_phase(directory: str, name: str, slaves: int, seconds: float, **settings) -> dict:
    nodes = _start_group(os.path.join(directory, name), slaves, **settings)
    try:
        await _wait_in_sync(nodes[0].client_address, slaves + 1)
        return await _produce(nodes[0].client_address, seconds)
    finally:
        for node in nodes:
            node.stop()


def _batch_sizes(ctx, param, value: str | None) -> tuple[int, ...] | None:
    """``--batch-costs 16,64,256`` as sizes (click names the option in a refusal)."""
    from .batch_costs import parse_sizes
    return None if value is None else parse_sizes(value)


@click.command("replicate")
@click.option("--catchup-gib", default=2.0, show_default=True, type=click.FloatRange(0.01, 64),
              help="Size of the master's log the empty slave catches up with.")
@click.option("--seconds", default=5.0, show_default=True, type=click.FloatRange(0.5, 600),
              help="Duration of each produce measurement.")
@click.option("--samples", default=1000, show_default=True, type=click.IntRange(10, 1_000_000),
              help="Single sync sends timed.")
@click.option("--directory", default=None, type=click.Path(file_okay=False),
              help="Where the stores go (default: a temporary directory, removed afterwards).")
@click.option("--catchup-only", is_flag=True, help="Measure the catch-up alone (no produce or single-send phases).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--peer", type=click.Choice(["redis"]), default=None,
              help="Instead: sync replication to two slaves beside this peer (Redis + WAIT 2), interleaved "
                   "rounds, medians and ratios, single sends also beside a relay floor with no store "
                   "(node/bench/sync_compare.py).")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1, 20), help="Rounds with --peer.")
@click.option("--batch-costs", "batch_sizes", default=None, metavar="SIZES", callback=_batch_sizes,
              help="With --peer: then the batched workload again at each of these batch sizes (e.g. 16,64,256; "
                   "hastore batches, Redis pipelines), and each process's CPU split into per message and per "
                   "batch (node/bench/batch_costs.py). Adds sizes x rounds x 2 x --seconds.")
@click.option("--client-busy-poll-us", default=BUSY_POLL_US, show_default=True,
              type=click.IntRange(0, BUSY_POLL_US_MAX),
              help="With --peer: the single sends' Producer polls for each reply this long before it sleeps "
                   "(its busy_poll_us option, the Producer's default unless given; README, Busy polling).")
def bench_replicate_command(catchup_gib, seconds, samples, directory, catchup_only, as_json, peer, rounds,
                            batch_sizes, client_busy_poll_us) -> None:
    """Catch-up rate of an empty slave, produce throughput async vs sync, single sync send latency;
    with --peer redis, hastore's sync replication against Redis's."""
    if batch_sizes is not None and peer is None:
        raise click.UsageError("--batch-costs splits the comparison's batched CPU: it needs --peer redis")
    if client_busy_poll_us != BUSY_POLL_US and peer is None:
        raise click.UsageError("--client-busy-poll-us applies to the comparison's single sends: it needs --peer redis")
    if peer is not None:
        from .sync_compare import compare_command
        return compare_command(peer, rounds, seconds, samples, directory, as_json, batch_sizes, client_busy_poll_us)
    async def main(root: str) -> dict:
        report: dict = {"targets": TARGETS}
        click.echo("catch-up ...", err=True)
        report["catch_up"] = await _catch_up(os.path.join(root, "catchup"), int(catchup_gib * GIB))
        if catchup_only:
            return report
        sync_one = {"replication": "sync", "min_in_sync_replicas": 2}
        sync_two = {"replication": "sync", "min_in_sync_replicas": 3, "all_ack_in_sync_state_set": True}
        produce = {}
        for name, slaves, settings in (("async_1_slave", 1, {}), ("sync_1_slave", 1, sync_one),
                                       ("async_2_slaves", 2, {}), ("sync_2_slaves", 2, sync_two)):
            click.echo(f"produce {name} ...", err=True)
            produce[name] = await _produce_phase(root, name, slaves, seconds, **settings)
        report["produce"] = produce
        report["sync_to_async_ratio"] = {
            "1_slave": round(produce["sync_1_slave"]["msgs_per_s"] / produce["async_1_slave"]["msgs_per_s"], 3),
            "2_slaves": round(produce["sync_2_slaves"]["msgs_per_s"] / produce["async_2_slaves"]["msgs_per_s"], 3)}
        click.echo("single sync sends ...", err=True)
        nodes = _start_group(os.path.join(root, "single"), 1, **sync_one)
        try:
            await _wait_in_sync(nodes[0].client_address, 2)
            report["single_sync_send"] = await _single(nodes[0].client_address, samples)
        finally:
            for node in nodes:
                node.stop()
        return report

    if directory:
        os.makedirs(directory, exist_ok=True)
        report = trio.run(main, directory)
    else:
        with tempfile.TemporaryDirectory(prefix="hastore-bench-replicate-") as root:
            report = trio.run(main, root)
    if as_json:
        click.echo(json.dumps(report))
        return
    catch_up = report["catch_up"]
    click.echo(f"catch-up: {catch_up['bytes'] / GIB:.2f} GiB in {catch_up['seconds']} s = {catch_up['mb_per_s']} MB/s "
               f"(target >= {TARGETS['catchup_mb_per_s_min']}): slave start-up {catch_up['startup_seconds']} s, "
               f"then the stream {catch_up['stream_seconds']} s = {catch_up['stream_mb_per_s']} MB/s; this disk "
               f"writes and syncs {catch_up['disk_write_floor_mb_per_s']} MB/s: ratio {catch_up['ratio_to_disk_floor']} "
               f"(stream {catch_up['stream_ratio_to_disk_floor']})")
    if catchup_only:
        return
    for name, figures in report["produce"].items():
        click.echo(f"produce {name}: {figures['msgs_per_s']} msgs/s ({figures['failed']} failed)")
    ratios = report["sync_to_async_ratio"]
    click.echo(f"sync/async: one slave {ratios['1_slave']}, two slaves {ratios['2_slaves']} "
               f"(target >= {TARGETS['sync_to_async_ratio_min']})")
    single = report["single_sync_send"]
    click.echo(f"single sync send: p50 {single['p50_us']} µs, p99 {single['p99_us']} µs ({single['samples']} samples)")
