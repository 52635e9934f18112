"""Inputs RocketMQ cannot read are refused with MESSAGE_ILLEGAL, naming the field, and
nothing is written: IPv6 host flags on IPv4 hosts, ports over 65535, the compressed flag
on a body that is not compressed, transaction prepared and rollback records, and the
store's own CRC property names."""

from __future__ import annotations

import zlib

import pytest

from store import Message, PutStatus, codec

PLAIN = b"not compressed at all"

REFUSED = [
    (dict(sys_flag=0x10), "0x10"),
    (dict(sys_flag=0x20), "0x20"),
    (dict(sys_flag=0x4), "0x4"),
    (dict(sys_flag=0xC), "0xC"),
    (dict(sys_flag=0x1), "zlib"),                              # type 0: zlib, as RocketMQ's default
    (dict(sys_flag=0x301), "zlib"),
    (dict(sys_flag=0x101), "LZ4"),
    (dict(sys_flag=0x201), "zstd"),
    (dict(sys_flag=0x401), "compression type 4"),
    (dict(sys_flag=-1), "sys_flag"),
    (dict(sys_flag="1"), "sys_flag"),
    (dict(born_host="10.0.0.1:65536"), "born_host"),
    (dict(born_host="10.0.0.1:99999999"), "born_host"),
    (dict(properties={"__CRC32#": "0000000000"}), "__CRC32#"),
    (dict(properties={"HCRC": "00000000"}), "HCRC"),
]


@pytest.mark.parametrize("batch_size", [1, 8])
@pytest.mark.parametrize("fields, named", REFUSED)
def test_unreadable_inputs_are_refused_and_nothing_is_written(open_store, fields, named, batch_size):
    store = open_store()
    good = [Message(topic="T", body=b"ok-%d" % i) for i in range(batch_size - 1)]
    bad = Message(topic="T", body=PLAIN, **fields)
    results = store.put_batch(good + [bad])
    assert results[-1].status is PutStatus.MESSAGE_ILLEGAL
    assert named in results[-1].reason
    assert all(r.status is PutStatus.PUT_OK for r in results[:-1])
    assert store.wait_dispatched()
    assert store.max_offset("T", 0) == batch_size - 1      # the others alone were written


ACCEPTED = [
    dict(sys_flag=0x1, body=zlib.compress(b"x" * 1000)),
    dict(sys_flag=0x301, body=zlib.compress(b"y" * 10)),
    dict(sys_flag=0x101, body=b"\x04\x22\x4d\x18" + b"frame"),
    dict(sys_flag=0x8, body=PLAIN),                              # transaction commit: a normal message
    dict(sys_flag=0x2, body=PLAIN),                              # multi tags
    dict(sys_flag=0x300, body=PLAIN),                            # a type without the compressed flag
    dict(born_host="10.0.0.1:65535", body=PLAIN),
]


@pytest.mark.parametrize("fields", ACCEPTED)
def test_readable_inputs_are_stored(open_store, fields):
    store = open_store()
    result = store.put(Message(topic="T", **fields))
    assert result.status is PutStatus.PUT_OK, result.reason
    assert store.wait_dispatched()
    [message] = store.get("T", 0, 0, 1)
    assert message.body == fields["body"] and message.sys_flag == fields.get("sys_flag", 0)


def test_truncated_zlib_body_is_not_compressed():
    whole = zlib.compress(b"z" * 5000)
    assert codec.sys_flag_problem(0x1, whole) is None
    assert "zlib" in codec.sys_flag_problem(0x1, whole[:-3])
    assert "zlib" in codec.sys_flag_problem(0x1, whole + b"extra")


def test_store_host_port_is_checked_too():
    with pytest.raises(ValueError, match="65535"):
        codec.encode_host("127.0.0.1:70000")
    assert codec.encode_host("127.0.0.1:65535")[4:] == (65535).to_bytes(4, "big")
