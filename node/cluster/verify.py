"""``hastore cluster verify --dir DIR``: do the nodes of each group hold the same CommitLog?

    hastore cluster verify --dir /tmp/c [--group g1] [--range-bytes 1048576] [--json]

For each group, every node is asked (LOG_RANGE_CRCS, authenticated with the node's secret)
for the CRC32 of each ``range_bytes`` range of its log, from the highest first offset of
the group's nodes to the lowest confirm offset (what every in-sync replica must hold
alike). Where the CRCs of a range differ, the range's bytes are fetched from every node
(READ_LOG_RANGE raw) and compared with the first node's, and each divergence is reported
by offset: the first differing byte, how many bytes differ, which nodes. The command exits
1 on any divergence (and when a node cannot be asked), 0 when every group agrees.

``verify_group`` is the same check as a function (trio), for tests and benchmarks.
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field

import click
import trio
from controller.errors import ControllerError

from ..client.connection import open_connection
from ..errors import NodeConfigError, NodeError
from ..server.config import load_config
from ..wire.protocol import RequestCode
from .supervisor import LocalCluster
from .topology import ClusterError

RANGE_BYTES_DEFAULT = 1024 * 1024
DIVERGENCES_REPORTED_MAX = 100
REQUEST_TIMEOUT_MS = 60_000


@dataclass(frozen=True, slots=True)
class Divergence:
    """A range whose bytes are not the same on every node."""

    range_start: int
    range_end: int
    first_offset: int                 # the first byte where a node differs from the reference
    differing_bytes: int              # most bytes any one node has different in the range
    nodes: tuple[str, ...]            # the nodes that differ from the reference
    reference: str


@dataclass(slots=True)
class GroupReport:
    group: str
    nodes: list[str]
    start: int = 0
    end: int = 0
    range_bytes: int = RANGE_BYTES_DEFAULT
    ranges_compared: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.divergences and not self.errors

    def to_json(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "divergences"},
                "divergences": [asdict(d) for d in self.divergences], "ok": self.ok}


async def verify_group(group: str, nodes: dict[str, tuple[str, str | None]], *,
                       range_bytes: int = RANGE_BYTES_DEFAULT) -> GroupReport:
    """Compare the logs of ``nodes`` (name -> (client address, secret)), the first the reference."""
    report = GroupReport(group, list(nodes), range_bytes=range_bytes)
    async with AsyncExitStack() as stack:
        connections = {}
        for name, (address, secret) in nodes.items():
            try:
                connections[name] = await stack.enter_async_context(open_connection(address, secret=secret))
            except NodeError as error:
                report.errors.append(f"{name} ({address}): {error}")
        if report.errors or len(connections) < 2:
            if len(connections) < 2 and not report.errors:
                report.errors.append(f"group {group} has fewer than two nodes to compare")
            return report
        try:
            await _compare(report, connections, range_bytes)
        except NodeError as error:
            report.errors.append(str(error))
    return report


async def _ask(connections: dict, code: RequestCode, **fields) -> dict[str, dict]:
    """The same request of every node at once."""
    replies: dict[str, dict] = {}

    async def one(name: str, connection) -> None:
        replies[name] = await connection.request(code, reply_timeout_ms=REQUEST_TIMEOUT_MS, **fields)

    async with trio.open_nursery() as nursery:
        for name, connection in connections.items():
            nursery.start_soon(one, name, connection)
    return replies


async def _compare(report: GroupReport, connections: dict, range_bytes: int) -> None:
    names = list(connections)
    first = await _ask(connections, RequestCode.LOG_RANGE_CRCS, start=0, end=0, range_bytes=range_bytes)
    start = max(reply["min_offset"] for reply in first.values())
    end = min(reply["confirm_offset"] for reply in first.values())
    report.start, report.end = start, max(start, end)
    offset = start
    while offset < end:
        replies = await _ask(connections, RequestCode.LOG_RANGE_CRCS, start=offset, end=end, range_bytes=range_bytes)
        page_end = min(reply["end"] for reply in replies.values())
        if page_end <= offset:
            raise NodeError(f"group {report.group}: a node answered no CRCs from offset {offset}")
        count = -(-(page_end - offset) // range_bytes)
        for index in range(count):
            crcs = {name: replies[name]["crcs"][index] for name in names}
            report.ranges_compared += 1
            if len(set(crcs.values())) > 1:
                range_start = offset + index * range_bytes
                await _compare_bytes(report, connections, range_start, min(range_start + range_bytes, page_end))
        offset = page_end


async def _compare_bytes(report: GroupReport, connections: dict, start: int, end: int) -> None:
    replies = await _ask(connections, RequestCode.READ_LOG_RANGE, offset=start, size=end - start, raw=True)
    names = list(connections)
    reference = replies[names[0]]["data"]
    first_offset, most, differing = None, 0, []
    for name in names[1:]:
        data = replies[name]["data"]
        positions = [i for i in range(min(len(data), len(reference))) if data[i] != reference[i]]
        count = len(positions) + abs(len(data) - len(reference))
        if count:
            differing.append(name)
            most = max(most, count)
            at = start + (positions[0] if positions else min(len(data), len(reference)))
            first_offset = at if first_offset is None else min(first_offset, at)
    if differing and len(report.divergences) < DIVERGENCES_REPORTED_MAX:
        report.divergences.append(Divergence(start, end, first_offset, most, tuple(differing), names[0]))


def group_nodes(cluster: LocalCluster, group: str) -> dict[str, tuple[str, str | None]]:
    """The group's nodes, master first when known: name -> (client address, secret)."""
    specs = cluster.nodes(group)
    try:
        master = cluster.master(group).name
    except (ClusterError, ControllerError):   # no master now (controller mode): topology order
        master = None
    specs.sort(key=lambda spec: spec.name != master)
    nodes = {}
    for spec in specs:
        try:
            secret = load_config(spec.config_path).secret
        except NodeConfigError:
            secret = cluster.topology.secret
        nodes[spec.name] = (spec.client_address, secret)
    return nodes


@click.command("verify")
@click.option("--dir", "directory", required=True, envvar="HASTORE_CLUSTER_DIR", type=click.Path(file_okay=False),
              help="The cluster's directory (env HASTORE_CLUSTER_DIR).")
@click.option("--group", "groups", multiple=True, help="Only this group (repeatable); default: every group.")
@click.option("--range-bytes", default=RANGE_BYTES_DEFAULT, show_default=True, type=click.IntRange(4096, 64 << 20),
              help="Bytes per CRC range; ranges whose CRCs differ are compared byte by byte.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
def verify_command(directory, groups, range_bytes, as_json) -> None:
    """Compare the CommitLog of every node of each group up to the confirm offset; exit 1 on any divergence."""
    cluster = LocalCluster(directory)
    if not cluster.specs:
        raise click.ClickException(f"no cluster was started in {directory}")
    names = list(groups) or [group.name for group in cluster.topology.groups]

    async def run() -> list[GroupReport]:
        return [await verify_group(name, group_nodes(cluster, name), range_bytes=range_bytes) for name in names]

    reports = trio.run(run)
    if as_json:
        click.echo(json.dumps({"groups": [r.to_json() for r in reports], "ok": all(r.ok for r in reports)}, indent=2))
    else:
        for r in reports:
            verdict = "same bytes on every node" if r.ok else f"{len(r.divergences)} divergence(s)"
            click.echo(f"group {r.group}: {', '.join(r.nodes)}: [{r.start}, {r.end}) in {r.ranges_compared} "
                       f"range(s) of {r.range_bytes} bytes: {verdict}")
            for d in r.divergences:
                click.echo(f"  divergence at offset {d.first_offset} (range [{d.range_start}, {d.range_end}), "
                           f"{d.differing_bytes} byte(s)): {', '.join(d.nodes)} differ from {d.reference}")
            for error in r.errors:
                click.echo(f"  cannot compare: {error}")
    if not all(r.ok for r in reports):
        raise SystemExit(1)
