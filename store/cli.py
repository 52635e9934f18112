"""``hastore store inspect|verify``: look into a store directory without starting it."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import sys

import click

from . import offline

PROBLEMS_SHOWN = 50


@click.group("store")
def store_group() -> None:
    """Look into a store directory (read-only; the store need not be running)."""


def _require_store(path: str) -> None:
    if not os.path.isdir(os.path.join(path, "commitlog")):
        raise click.ClickException(f"{path} is not a store directory (no commitlog/ inside)")


def _message_json(message, body_bytes_max: int) -> dict:
    body = message.body[:body_bytes_max]
    try:
        shown = {"body_text": body.decode("utf-8")}
    except UnicodeDecodeError:
        shown = {"body_base64": base64.b64encode(body).decode("ascii")}
    return {
        "physical_offset": message.physical_offset, "total_size": message.total_size, "topic": message.topic,
        "queue_id": message.queue_id, "queue_offset": message.queue_offset, "store_timestamp": message.store_timestamp,
        "born_timestamp": message.born_timestamp, "born_host": message.born_host, "store_host": message.store_host,
        "body_crc": message.body_crc, "body_length": len(message.body), "keys": message.keys, "tags": message.tags,
        "properties": message.user_properties, "message_id": message.message_id, "flag": message.flag,
        "sys_flag": message.sys_flag, "reconsume_times": message.reconsume_times, **shown,
    }


@store_group.command("inspect")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
@click.option("--messages", "message_limit", default=100, show_default=True,
              help="Show at most this many messages (0: none, -1: all).")
@click.option("--body-bytes", default=64, show_default=True, help="Show at most this many body bytes per message.")
def inspect_command(path: str, as_json: bool, message_limit: int, body_bytes: int) -> None:
    """List segments, messages (decoded), consume queues and index files of the store at PATH."""
    _require_store(path)
    segments = [{"file": os.path.basename(p), "start_offset": s, "bytes": os.path.getsize(p)}
                for s, p in offline.segment_paths(os.path.join(path, "commitlog"))]
    messages, end, corrupt = [], None, []
    count = 0
    for record in offline.scan_commitlog(path):
        if record.kind == "message":
            count += 1
            if message_limit < 0 or len(messages) < message_limit:
                messages.append(_message_json(record.message, body_bytes))
        elif record.kind == "end" or (record.kind == "corrupt" and not record.size):
            end = {"offset": record.offset, "kind": record.kind, "detail": record.problem}
        elif record.kind == "corrupt":
            corrupt.append({"offset": record.offset, "detail": record.problem})
    queues = []
    for topic, queue_id, directory in offline.consume_queue_dirs(path):
        entries = list(offline.consume_queue_entries(directory))
        queues.append({"topic": topic, "queue_id": queue_id, "files": len(offline.segment_paths(directory)),
                       "min_offset": entries[0][0] if entries else 0,
                       "max_offset": entries[-1][0] + 1 if entries else 0})
    indexes = [{"file": os.path.basename(v.path), "entries": max(0, v.index_count - 1),
                "begin_timestamp": v.begin_timestamp, "end_timestamp": v.end_timestamp,
                "begin_physical_offset": v.begin_physical_offset, "end_physical_offset": v.end_physical_offset}
               for v in offline.index_files(path)]
    checkpoint = offline.read_checkpoint(path)
    report = {
        "store_path": os.path.abspath(path), "segments": segments, "message_count": count, "messages": messages,
        "end": end, "corrupt_messages": corrupt, "consume_queues": queues, "index_files": indexes,
        "checkpoint": {**dataclasses.asdict(checkpoint[0]), "valid": checkpoint[1]} if checkpoint else None,
        "abort_file": os.path.exists(os.path.join(path, "abort")),
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"store {report['store_path']}  (abort file: {'present' if report['abort_file'] else 'absent'})")
    click.echo(f"\ncommit log: {len(segments)} segment(s), {count} message(s)")
    for segment in segments:
        click.echo(f"  {segment['file']}  {segment['bytes']} bytes")
    if end:
        click.echo(f"  data ends at {end['offset']} ({end['kind']}{': ' + end['detail'] if end['kind'] == 'corrupt' else ''})")
    for item in corrupt:
        click.echo(f"  CORRUPT message at {item['offset']}: {item['detail']}")
    if messages:
        click.echo(f"\nmessages (first {len(messages)}):")
        click.echo(f"  {'offset':>12} {'topic':<16} {'q':>3} {'qoff':>7} {'size':>6}  keys / tags / body")
        for m in messages:
            body = m.get("body_text", m.get("body_base64", ""))
            click.echo(f"  {m['physical_offset']:>12} {m['topic']:<16} {m['queue_id']:>3} {m['queue_offset']:>7} "
                       f"{m['total_size']:>6}  {','.join(m['keys']) or '-'} / {m['tags'] or '-'} / {body[:40]!r}")
    click.echo(f"\nconsume queues: {len(queues)}")
    for q in queues:
        click.echo(f"  {q['topic']}/{q['queue_id']}: offsets [{q['min_offset']}, {q['max_offset']}) in {q['files']} file(s)")
    click.echo(f"\nindex files: {len(indexes)}")
    for i in indexes:
        click.echo(f"  {i['file']}: {i['entries']} entries, log offsets [{i['begin_physical_offset']}, "
                   f"{i['end_physical_offset']}]")
    if report["checkpoint"]:
        c = report["checkpoint"]
        click.echo(f"\ncheckpoint ({'valid' if c['valid'] else 'no hastore offsets'}): "
                   f"flushed {c['flushed_phy_offset']}, dispatched {c['dispatched_phy_offset']}, "
                   f"confirm {c['confirm_phy_offset']}")


@store_group.command("verify")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--index-hash-slots", type=int, default=None,
              help="Slot count of the index files (default: from config/storeLayout.json).")
@click.option("--json", "as_json", is_flag=True, help="Print the problems and a summary as JSON.")
def verify_command(path: str, index_hash_slots: int | None, as_json: bool) -> None:
    """Check every message's CRC and layout, and that ConsumeQueue and IndexFile agree with the CommitLog.

    Exit 0 when sound; 1 with the file and offset of each problem otherwise.
    """
    _require_store(path)
    problems, summary = offline.verify(path, index_hash_slots)
    if as_json:
        click.echo(json.dumps({"summary": summary, "problems": [p.__dict__ for p in problems]}, indent=2))
    else:
        for problem in problems[:PROBLEMS_SHOWN]:
            click.echo(str(problem))
        if len(problems) > PROBLEMS_SHOWN:
            click.echo(f"... and {len(problems) - PROBLEMS_SHOWN} more (--json lists all)")
        verdict = "sound" if not problems else f"{len(problems)} problem(s)"
        click.echo(f"{path}: {verdict}; {summary['messages']} messages, {summary['consume_queue_entries']} consume "
                   f"queue entries, {summary['index_keys_checked']} index keys checked", err=bool(problems))
    sys.exit(1 if problems else 0)


# The storage-engine demo (write, crash, recover, read back) lives on as `hastore store demo`;
# `hastore demo` is the node demo.
from .demo import demo_command  # noqa: E402

store_group.add_command(demo_command, "demo")
