"""The pure parts: HA frames and authentication, and the sync-state set rules."""

from __future__ import annotations

import pytest

from replication import protocol
from replication.epochs import EpochEntry, Resync, ResyncKind
from replication.errors import HaAuthError, HandshakeRefused, HaProtocolError
from replication.protocol import Handshake, Hello, Welcome
from replication.sync_state import ReplicaTracker, SyncSettings


def _body(frame: bytes) -> dict:
    length = protocol.control_length(frame[:4])
    assert len(frame) == 4 + length
    return protocol.decode_control(frame[4:])


def test_handshake_round_trip_with_mutual_proofs():
    master_nonce, slave_nonce = b"m" * 32, b"s" * 32
    hello = Hello.decode(_body(Hello("c", master_nonce).encode()))
    handshake = Handshake(protocol.slave_proof("k", hello.nonce, slave_nonce), slave_nonce, "s1", "g", "c",
                          [EpochEntry(1, 0), EpochEntry(2, 70)], 0, 100)
    payload = _body(handshake.encode())
    assert Handshake.authenticate(payload, "k", master_nonce) == slave_nonce
    assert Handshake.decode(payload) == handshake
    with pytest.raises(HaAuthError):
        Handshake.authenticate(payload, "other", master_nonce)
    with pytest.raises(HaAuthError):  # a replayed handshake answers another challenge
        Handshake.authenticate(payload, "k", b"x" * 32)
    resync = Resync(ResyncKind.TRUNCATE, 70, 1, "why")
    welcome = Welcome(protocol.master_proof("k", master_nonce, slave_nonce), "m", 2, [EpochEntry(1, 0)], 0, 90,
                      resync)
    assert Welcome.decode(_body(welcome.encode()), "k", master_nonce, slave_nonce) == welcome
    with pytest.raises(HaAuthError):  # the slave's own proof reflected back is not the master's
        forged = Welcome(handshake.proof, "m", 2, [EpochEntry(1, 0)], 0, 90, resync)
        Welcome.decode(_body(forged.encode()), "k", master_nonce, slave_nonce)
    with pytest.raises(HandshakeRefused):
        Welcome.decode(_body(protocol.encode_refusal("no")), "k", master_nonce, slave_nonce)


@pytest.mark.parametrize("change", [{"epochs": [[2, 0], [1, 5]]}, {"epochs": "x"}, {"max_offset": -1},
                                    {"min_offset": 200}, {"node_id": 5}, {"v": 99}])
def test_bad_handshake_fields_are_protocol_errors(change):
    payload = _body(Handshake(b"p" * 32, b"n" * 32, "s1", "g", "c", [], 0, 100).encode())
    payload.update(change)
    with pytest.raises(HaProtocolError):
        Handshake.decode(payload)


def test_data_frames_and_acks():
    data = b"abc" * 1000
    header = protocol.parse_data_header(protocol.data_header(4096, data))
    assert (header.offset, header.size, header.is_heartbeat) == (4096, 3000, False)
    protocol.check_data(header, data)
    with pytest.raises(HaProtocolError):
        protocol.check_data(header, data[:-1] + b"x")
    assert protocol.parse_data_header(protocol.heartbeat(77)).is_heartbeat
    with pytest.raises(HaProtocolError):
        protocol.parse_data_header(protocol.DATA_HEADER.pack(0, protocol.DATA_FRAME_BYTES_MAX + 1, 0))
    assert protocol.parse_ack(protocol.ack(123)) == 123
    with pytest.raises(HaProtocolError):
        protocol.control_length(protocol.CONTROL_LENGTH.pack(protocol.CONTROL_BYTES_MAX + 1))


# --- the sync-state set ---------------------------------------------------------------------
def tracker(**settings) -> ReplicaTracker:
    return ReplicaTracker("m", SyncSettings(**settings), confirm_offset=0, now_ms=0)


def test_slaves_join_at_the_confirm_offset_and_leave_after_falling_behind():
    t = tracker(min_in_sync_replicas=2, max_time_not_catchup_ms=1000)
    assert not t.enough_in_sync() and t.replicated_offset(100) == -1
    t.connected("s1", "a", 0, now_ms=0)
    no_age = lambda offset: 0
    assert t.wanted_sync_state_set(100, 0, no_age) == {"m"}          # behind the confirm offset (100)
    t.acked("s1", 100, 10)
    t.apply_sync_state_set(t.wanted_sync_state_set(100, 10, no_age))
    assert t.sync_state_set == {"m", "s1"} and t.replicated_offset(150) == 100
    assert t.confirm_offset(150) == 100
    # the oldest message s1 lacks is 1.5 s old: it leaves; the confirm offset never goes back
    t.apply_sync_state_set(t.wanted_sync_state_set(300, 2000, lambda offset: 1500))
    assert t.sync_state_set == {"m"} and t.confirm_offset(300) == 300 and t.replicated_offset(300) == -1


def test_a_disconnected_member_stays_for_the_grace_time_only():
    t = tracker(min_in_sync_replicas=1, max_time_not_catchup_ms=1000)
    t.connected("s1", "a", 50, 0)
    t.apply_sync_state_set(frozenset({"m", "s1"}))
    t.disconnected("s1", 100)
    assert t.wanted_sync_state_set(50, 900, lambda o: 0) == {"m", "s1"}
    assert t.wanted_sync_state_set(50, 1200, lambda o: 0) == {"m"}


def test_replicated_offset_counts_the_master_and_honours_all_ack():
    def replicated(**settings) -> int:
        t = tracker(**settings)
        for name, ack in (("s1", 80), ("s2", 60)):
            t.connected(name, name, ack, 0)
        t.apply_sync_state_set(frozenset({"m", "s1", "s2"}))
        return t.replicated_offset(100)

    assert replicated(min_in_sync_replicas=2) == 80    # master (100) and s1 (80): two copies
    assert replicated(min_in_sync_replicas=2, all_ack_in_sync_state_set=True) == 60   # every member
    assert replicated(min_in_sync_replicas=4) == -1    # fewer members than asked for


def test_members_handed_over_by_a_controller_count_until_they_show_up_or_time_out():
    t = ReplicaTracker("m", SyncSettings(min_in_sync_replicas=2, max_time_not_catchup_ms=500), 0, now_ms=1000,
                       sync_state_set=frozenset({"m", "s9"}))
    assert t.enough_in_sync() and t.replicated_offset(10) == 0
    assert t.wanted_sync_state_set(10, 1400, lambda o: 0) == {"m", "s9"}
    assert t.wanted_sync_state_set(10, 1600, lambda o: 0) == {"m"}


def test_rate_over_the_recent_window():
    t = tracker()
    t.connected("s1", "a", 0, 0)
    for step in range(1, 11):
        t.acked("s1", step * 1_000_000, step * 100)
    assert t.replicas["s1"].rate_bytes_per_s(1000) == pytest.approx(10_000_000, rel=0.01)
    assert t.replicas["s1"].rate_bytes_per_s(10_000) == 0.0
