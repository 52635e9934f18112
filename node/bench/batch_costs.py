"""``hastore bench replicate --peer redis --batch-costs 16,64,256``: the batched CPU of both
sides split into what each message costs and what each batch costs.

The batched workload runs again at each of the given batch sizes (hastore: ``send_batch``
of that many messages, 8 in flight; Redis: pipelines of that many XADD + ``WAIT 2``), in
``--rounds`` rounds, alternating which side goes first, ``--seconds`` each. Every process's
CPU per message at a batch size of ``n`` is about

    per_message + per_batch / n

so a least-squares line through the medians (x = 1/n) gives each process's two costs:
``per_message_us``, the work each message brings whatever the batch (encoding, CRCs,
copies, indexing, a replica's apply), and ``per_batch_us``, what a request or a pipeline
costs once (its wake-ups, reads and writes, frames and acks). The ratios of the sides'
totals say which of the two a side loses on. ``residual_us`` is how far the line misses the
medians (the largest miss, µs a message): a large one means the model does not fit.

What was sent must be held: every run's acked messages are checked on every member of both
sides, as in the main comparison (each round's ``stored_ok``, and the report's).
"""

from __future__ import annotations

import statistics

import click
import trio

from . import redis_peer
from .cpu_meter import CpuMeter

SIZES_MAX = 8
# the largest batch: 512 messages of 1 KiB stay one request (a producer's batch holds up to 1 MiB)
SIZE_MAX = 512


def parse_sizes(text: str) -> tuple[int, ...]:
    """Batch sizes from ``16,64,256``: two or more distinct sizes of 1 to SIZE_MAX, at most
    SIZES_MAX of them, in increasing order."""
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of batch sizes (e.g. 16,64,256)") from None
    if len(sizes) < 2:
        raise click.BadParameter(f"{text!r}: give at least two different batch sizes (e.g. 16,64,256)")
    if len(sizes) > SIZES_MAX:
        raise click.BadParameter(f"{text!r}: at most {SIZES_MAX} batch sizes")
    if sizes[0] < 1 or sizes[-1] > SIZE_MAX:
        raise click.BadParameter(f"{text!r}: batch sizes must lie in 1..{SIZE_MAX}")
    return tuple(sizes)


def fit(points: dict[int, float]) -> dict:
    """The least-squares line ``us = per_message + per_batch / size`` through ``points``
    (batch size -> CPU µs a message), with the largest miss."""
    xs = [1 / size for size in points]
    ys = list(points.values())
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread <= 0:
        raise ValueError("a fit needs at least two different batch sizes")
    per_batch = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread
    per_message = mean_y - per_batch * mean_x
    residual = max(abs(per_message + per_batch * x - y) for x, y in zip(xs, ys))
    return {"per_message_us": round(per_message, 2), "per_batch_us": round(per_batch, 1),
            "residual_us": round(residual, 2)}


def summarize(rounds: list[dict], sizes: tuple[int, ...]) -> dict:
    """Medians over rounds per side, size and process; each process's fit; the sides' ratios."""
    sides = [side for side in ("hastore", "redis") if rounds[0].get(side) is not None]
    medians: dict = {}
    fits: dict = {}
    for side in sides:
        medians[side] = {}
        for size in sizes:
            runs = [figures[side][str(size)] for figures in rounds]
            medians[side][str(size)] = {
                "msgs_per_s": round(statistics.median(run["msgs_per_s"] for run in runs), 1),
                "cpu_us_per_msg": {name: round(statistics.median(run["cpu_us_per_msg"][name] for run in runs), 1)
                                   for name in runs[0]["cpu_us_per_msg"]}}
        processes = medians[side][str(sizes[0])]["cpu_us_per_msg"]
        fits[side] = {name: fit({size: medians[side][str(size)]["cpu_us_per_msg"][name] for size in sizes})
                      for name in processes}
    ratios = None
    if "redis" in fits:
        mine, theirs = fits["hastore"]["total"], fits["redis"]["total"]
        ratios = {key: round(mine[f"{key}_us"] / theirs[f"{key}_us"], 3) if theirs[f"{key}_us"] > 0 else None
                  for key in ("per_message", "per_batch")}
    return {"sizes": list(sizes), "rounds": rounds, "medians": medians, "fit": fits, "ratios": ratios}


async def measure(comparison, sizes: tuple[int, ...], rounds: int) -> dict:
    """Run the batched workload at every size on both sides of ``comparison`` (a started
    ``sync_compare.Comparison``), ``rounds`` times; the summary."""
    measured = []
    for index in range(rounds):
        measured.append(await _round(comparison, sizes, index))
    return summarize(measured, sizes)


async def _round(comparison, sizes: tuple[int, ...], index: int) -> dict:
    from .sync_compare import hastore_batched   # sync_compare imports this module
    hastore = comparison.hastore
    figures: dict = {"round": index + 1, "hastore": {}, "redis": {} if comparison.redis is not None else None,
                     "stored_ok": True}
    topics = {size: f"sync-compare-costs-{index}-{size}" for size in sizes}
    await hastore.create_topics(list(topics.values()))
    hastore_first = index % 2 == 0
    for size in sizes:
        for side in (("hastore", "redis") if hastore_first else ("redis", "hastore")):
            topic = topics[size]
            if side == "hastore":
                run = await hastore_batched(hastore.master_address, topic, CpuMeter(hastore.group_pids),
                                            seconds=comparison.seconds, messages_max=comparison.messages_max,
                                            batch_messages=size)
                stored = await hastore.stored(topic, run["acked"], run["last_acked_offset"])
                figures["stored_ok"] &= stored["ok"] and run["failed"] == 0
                figures["hastore"][str(size)] = _kept(run)
            elif comparison.redis is not None:
                group = comparison.redis_group
                meter = CpuMeter(group.pids)
                meter.begin()
                run = redis_peer.run_batched(comparison.redis, topic, seconds=comparison.seconds,
                                             messages_max=comparison.messages_max, pipeline_messages=size)
                meter.end()
                counts = group.stored_counts(topic)
                figures["stored_ok"] &= all(count >= run["acked"] for count in counts.values())
                group.delete(topic)
                figures["redis"][str(size)] = _kept({**run, "cpu_us_per_msg": meter.per_message_us(run["acked"])})
    return figures


def _kept(run: dict) -> dict:
    return {key: run[key] for key in ("acked", "failed", "msgs_per_s", "cpu_us_per_msg")}


def _us(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}"


def report_lines(costs: dict) -> list[str]:
    """The fit per side and process, the medians it was fitted to, and the ratios."""
    sizes = costs["sizes"]
    lines = [f"batch costs (CPU µs; medians of {len(costs['rounds'])} rounds at batch sizes "
             f"{', '.join(map(str, sizes))}; µs a message = per message + per batch / batch size)"]
    for side, processes in costs["fit"].items():
        per_message = " ".join(f"{name} {_us(fit['per_message_us'])}" for name, fit in processes.items())
        per_batch = " ".join(f"{name} {_us(fit['per_batch_us'])}" for name, fit in processes.items())
        lines.append(f"  {side:<8} per message: {per_message}")
        lines.append(f"  {'':<8} per batch:   {per_batch}")
        lines.append(f"  {'':<8} largest miss of the line: {processes['total']['residual_us']} µs a message (total)")
        for size in sizes:
            figures = costs["medians"][side][str(size)]
            lines.append(f"  {'':<8} batch {size:>4}: {_us(figures['msgs_per_s'])} msgs/s, µs a message: "
                         + " ".join(f"{name} {_us(us)}" for name, us in figures["cpu_us_per_msg"].items()))
    if costs["ratios"] is not None:
        lines.append(f"  hastore/redis: per message {costs['ratios']['per_message']}, "
                     f"per batch {costs['ratios']['per_batch']}")
    return lines
