"""The slave's follow thread (replication/follow_thread.py) against a scripted master on a
socket pair: no process, no trio; a real replica log. Each test's waits are bounded (socket
timeouts and thread joins of a few seconds)."""

from __future__ import annotations

import itertools
import linecache
import os
import socket
import struct
import sys
import threading
import time

import pytest

from replication import protocol
from replication.epochs import EpochEntry
from replication.errors import HaProtocolError
from replication import follow_thread
from replication.follow_thread import ACK_FRAMES_MAX, RECEIVE_BUFFER_BYTES, FollowThread
from replication.transport import PeerClosed

from replication_helpers import ManualClock, chunks, epoch_file, frame, log_bytes, put

EPOCHS = [EpochEntry(1, 0)]
WAIT_S = 10


class Session:
    """A FollowThread on one end of a socket pair, run by a thread; the test is the master."""

    def __init__(self, slave, *, buffered: bytes = b"", read_timeout_ms: int = 10_000,
                 ack_interval_ms: int = 10_000, dispatch_delay_ms: int = 10_000, clock=None,
                 replica_store=None, master_max_offset: int = 0) -> None:
        self.master, theirs = socket.socketpair()
        self.master.settimeout(WAIT_S)
        self.signals = 0
        options = {} if clock is None else {"clock": clock}
        self.follower = FollowThread(replica_store or slave.replica_log, epoch_file(slave), EPOCHS, theirs, buffered,
                                     read_timeout_ms=read_timeout_ms, ack_interval_ms=ack_interval_ms,
                                     dispatch_delay_ms=dispatch_delay_ms, master_max_offset=master_max_offset,
                                     signal=self._signal, **options)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _signal(self) -> None:
        self.signals += 1

    def _run(self) -> None:
        try:
            self.follower.run()
        except BaseException as raised:
            self.error = raised

    def ack(self) -> int:
        raw = b""
        while len(raw) < protocol.ACK.size:
            got = self.master.recv(protocol.ACK.size - len(raw))
            assert got, "the slave closed the connection"
            raw += got
        return protocol.parse_ack(raw)

    def acks_until(self, offset: int) -> list[int]:
        acks = [self.ack()]
        while acks[-1] < offset:
            acks.append(self.ack())
        return acks

    def ended(self) -> BaseException | None:
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "the follow thread did not end"
        return self.error

    def close(self) -> None:
        self.follower.stop()
        self.thread.join(WAIT_S)
        self.master.close()


@pytest.fixture
def session_of():
    sessions: list[Session] = []

    def start(slave, **options) -> Session:
        sessions.append(Session(slave, **options))
        return sessions[-1]

    yield start
    for session in sessions:
        session.close()


def test_frames_that_arrive_together_land_in_order_under_few_acks(open_store, session_of):
    master, slave = open_store("master"), open_store("slave")
    put(master, 300, body_bytes=500)
    pieces = chunks(master, 6, 25_000)
    end = pieces[-1][0] + len(pieces[-1][1])
    # the first frame waits in the buffer the handshake's reader handed over
    session = session_of(slave, buffered=frame(*pieces[0]))
    session.master.sendall(b"".join(frame(offset, data) for offset, data in pieces[1:]) + protocol.confirm(end)
                           + protocol.heartbeat(end + 100))
    acks = session.acks_until(end)
    assert log_bytes(slave) == b"".join(data for _, data in pieces)
    assert acks == sorted(acks) and len(acks) <= len(pieces)
    assert epoch_file(slave).entries == EPOCHS   # the term recorded before its first byte
    follower = session.follower
    assert follower.frames == len(pieces) and follower.received_bytes == end
    session.close()
    assert slave.replica_log.confirm_offset == end and follower.confirm_moved
    assert follower.master_max_offset == end + 100
    # no pass yet (due 10 s after the first frame): the loop is told of the confirm offset
    # only once the frames it covers are indexed, and frames left over are the loop's
    assert follower.undispatched and follower.passes == 0 and session.signals == 0
    assert session.error is None                        # stopped: no error


def test_at_most_ack_frames_max_frames_go_under_one_ack(open_store, session_of):
    master, slave = open_store("master"), open_store("slave")
    put(master, 200, body_bytes=100)
    pieces = chunks(master, ACK_FRAMES_MAX * 2, 2_000)
    session = session_of(slave)
    session.master.sendall(b"".join(frame(offset, data) for offset, data in pieces))
    acks = session.acks_until(pieces[-1][0] + len(pieces[-1][1]))
    assert len(acks) >= 2
    assert acks[0] <= pieces[ACK_FRAMES_MAX][0]


def test_a_frame_with_a_bad_crc_ends_the_thread_and_none_of_it_lands(open_store, session_of):
    master, slave = open_store("master"), open_store("slave")
    put(master, 300, body_bytes=500)
    (o1, c1), (o2, c2), (o3, c3) = chunks(master, 3, 40_000)
    session = session_of(slave)
    session.master.sendall(frame(o1, c1) + frame(o2, c2))
    assert session.acks_until(o3)[-1] == o3
    session.master.sendall(frame(o3, c3, crc_flip=1))
    error = session.ended()
    assert isinstance(error, HaProtocolError) and "CRC mismatch" in str(error)
    assert log_bytes(slave) == c1 + c2


def test_a_frame_that_does_not_start_at_the_logs_end_ends_the_thread(open_store, session_of):
    master, slave = open_store("master"), open_store("slave")
    put(master, 300, body_bytes=500)
    pieces = chunks(master, 3, 40_000)
    session = session_of(slave)
    session.master.sendall(frame(*pieces[0]) + frame(*pieces[2]))
    error = session.ended()
    assert isinstance(error, HaProtocolError) and f"frame at {pieces[2][0]}" in str(error)
    assert log_bytes(slave) == pieces[0][1]


def test_a_frame_outside_the_masters_epochs_ends_the_thread(open_store, session_of):
    master, slave = open_store("master"), open_store("slave")
    put(master, 50, body_bytes=500)
    (offset, data), = chunks(master, 1, 10_000)
    session = session_of(slave)
    session.follower.master_epochs = [EpochEntry(1, 0), EpochEntry(2, len(data) // 2)]
    session.master.sendall(frame(offset, data))
    error = session.ended()
    assert isinstance(error, HaProtocolError) and "not inside one master epoch" in str(error)
    assert slave.max_physical_offset == 0


def test_a_frame_larger_than_the_receive_buffer_arrives_in_pieces_and_lands_whole(open_store, session_of):
    master, slave = open_store("master", commitlog_segment_bytes=8 * 1024 * 1024), open_store(
        "slave", commitlog_segment_bytes=8 * 1024 * 1024)
    put(master, 1600, body_bytes=1000)
    (offset, data), = chunks(master, 1, 4 * 1024 * 1024)
    assert len(data) > RECEIVE_BUFFER_BYTES
    session = session_of(slave)
    raw = frame(offset, data)
    for start in range(0, len(raw), 300_000):
        session.master.sendall(raw[start:start + 300_000])
    assert session.acks_until(len(data))[-1] == len(data)
    assert log_bytes(slave) == data


def test_a_silent_master_is_acked_every_interval_then_the_read_timeout_ends_the_thread(open_store, session_of):
    slave = open_store("slave")
    # each look at the clock is 0.4 s later: the socket's 50 ms waits stand for 0.4 s each
    ticks = itertools.count(step=0.4)
    session = session_of(slave, read_timeout_ms=2_000, ack_interval_ms=50, clock=lambda: next(ticks))
    assert session.ack() == 0 and session.ack() == 0    # acks of the log's end while silent
    error = session.ended()
    assert isinstance(error, HaProtocolError) and "nothing from the master for 2000 ms" in str(error)


class RecordingSocket(socket.socket):
    """A socket that keeps the receive timeouts (SO_RCVTIMEO) it was given, in seconds."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.timeouts: list[float] = []

    def setsockopt(self, level, option, value, *rest) -> None:
        if (level, option) == (socket.SOL_SOCKET, socket.SO_RCVTIMEO):
            seconds, microseconds = struct.unpack("@ll", value)
            self.timeouts.append(seconds + microseconds / 1e6)
        super().setsockopt(level, option, value, *rest)


def test_the_wait_before_the_read_timeout_is_cut_short_to_end_on_time(open_store):
    slave = open_store("slave")
    master, theirs = socket.socketpair()
    sock = RecordingSocket(fileno=theirs.detach())
    times = iter([0.0, 0.0, 0.08, 0.08, 0.1])   # made; first wait out (an ack is due); second wait out

    follower = FollowThread(slave.replica_log, epoch_file(slave), EPOCHS, sock, b"", read_timeout_ms=100,
                            ack_interval_ms=80, dispatch_delay_ms=50, master_max_offset=0, signal=lambda: None,
                            clock=lambda: next(times))
    with pytest.raises(HaProtocolError, match="nothing from the master for 100 ms"):
        follower.run()
    master.settimeout(WAIT_S)
    assert protocol.parse_ack(master.recv(protocol.ACK.size)) == 0
    # waits of the ack interval, then one cut to what was left of the read timeout
    assert sock.timeouts[0] == 0.08 and sock.timeouts[1] == pytest.approx(0.02)
    master.close()


def test_a_master_that_hangs_up_ends_the_thread(open_store, session_of):
    slave = open_store("slave")
    session = session_of(slave)
    session.master.shutdown(socket.SHUT_WR)
    assert isinstance(session.ended(), PeerClosed)


def test_stop_ends_a_thread_waiting_for_frames_quietly(open_store, session_of):
    slave = open_store("slave")
    session = session_of(slave)
    session.follower.stop()
    assert session.ended() is None
    assert session.follower.sock.fileno() == -1   # its socket closed on the way out


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.005)


def wait_parked_with_frames_unindexed(session) -> None:
    """Until the follow thread, its pass armed for the frames it appended, waits in its
    socket's read: it acks a frame before it reads the clock for the pass's due time and for
    its next wait, so a test that moved the clock on the ack alone raced it."""
    def parked() -> bool:
        top = sys._current_frames().get(session.thread.ident)
        return session.follower.undispatched and top is not None and top.f_code.co_name == "_receive_into" \
            and "recv_into" in linecache.getline(top.f_code.co_filename, top.f_lineno)
    wait_until(parked, "the follow thread waiting for the next frame")


def test_the_thread_indexes_its_frames_itself_then_tells_the_loop(open_store, session_of):
    master = open_store("master")
    slave = open_store("slave", dispatcher_thread=False)   # as a node's: no thread of its own
    results = put(master, 300, body_bytes=500)
    pieces = chunks(master, 4, 25_000)
    end = pieces[-1][0] + len(pieces[-1][1])
    sent_messages = sum(result.physical_offset < end for result in results)
    session = session_of(slave, dispatch_delay_ms=20)
    # the CONFIRM first: the confirm offset moves with the frames, before they are indexed
    session.master.sendall(protocol.confirm(end) + b"".join(frame(offset, data) for offset, data in pieces))
    assert session.acks_until(end)[-1] == end
    # the socket then stays quiet: its timeout wakes the thread for the pass
    wait_until(lambda: session.signals == 1, "the loop told after the pass")
    follower = session.follower
    assert follower.passes == 1 and not follower.undispatched
    assert slave.dispatcher.dispatched_offset == end and slave.dispatcher.dispatched_messages == sent_messages
    assert follower.confirm_moved and slave.replica_log.confirm_offset == end


def test_a_confirm_offset_over_indexed_frames_is_told_at_once(open_store, session_of):
    master = open_store("master")
    slave = open_store("slave", dispatcher_thread=False)
    put(master, 100, body_bytes=500)
    (offset, data), = chunks(master, 1, 100_000)
    session = session_of(slave, dispatch_delay_ms=10)
    session.master.sendall(frame(offset, data))
    assert session.acks_until(len(data))[-1] == len(data)
    wait_until(lambda: session.follower.passes == 1, "the pass")
    assert session.signals == 0            # the confirm offset did not move: no news
    session.master.sendall(protocol.confirm(len(data)))
    wait_until(lambda: session.signals == 1, "the confirm offset told")
    assert session.follower.passes == 1    # nothing waited for a pass


def test_a_thread_behind_by_more_than_a_pass_runs_passes_until_caught_up(open_store, session_of, monkeypatch):
    monkeypatch.setattr(follow_thread, "DISPATCH_PASS_BYTES", 20_000)
    master = open_store("master")
    slave = open_store("slave", dispatcher_thread=False)
    results = put(master, 400, body_bytes=500)
    pieces = chunks(master, 3, 80_000)
    end = pieces[-1][0] + len(pieces[-1][1])
    sent_messages = sum(result.physical_offset < end for result in results)
    session = session_of(slave, dispatch_delay_ms=10)
    session.master.sendall(b"".join(frame(offset, data) for offset, data in pieces))
    assert session.acks_until(end)[-1] == end
    wait_until(lambda: not session.follower.undispatched, "caught up")
    assert session.follower.passes >= end // 20_000
    assert slave.dispatcher.dispatched_offset == end and slave.dispatcher.dispatched_messages == sent_messages


def test_a_dispatcher_with_a_thread_of_its_own_is_woken_instead(open_store, session_of):
    master = open_store("master")
    slave = open_store("slave")   # dispatcher_thread: true
    put(master, 100, body_bytes=500)
    (offset, data), = chunks(master, 1, 100_000)
    session = session_of(slave, dispatch_delay_ms=10)
    session.master.sendall(frame(offset, data))
    assert session.acks_until(len(data))[-1] == len(data)
    wait_until(lambda: slave.dispatcher.dispatched_offset == len(data), "the dispatcher thread's pass")
    wait_until(lambda: not session.follower.undispatched, "the thread's turn handed over")


class ReadAheads:
    """A slave's replica log, noting whether each append asked for the pages ahead."""

    def __init__(self, replica_log) -> None:
        self._inner = replica_log
        self.asked: list[bool] = []

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def append(self, offset: int, data, *, wake_dispatch: bool = True, read_ahead: bool = True) -> int:
        self.asked.append(read_ahead)
        return self._inner.append(offset, data, wake_dispatch=wake_dispatch, read_ahead=read_ahead)


def test_a_slave_reads_ahead_only_while_the_master_runs_far_ahead(open_store, session_of, monkeypatch):
    monkeypatch.setattr(follow_thread, "READ_AHEAD_BEHIND_BYTES", 60_000)
    master, slave = open_store("master"), open_store("slave")
    put(master, 300, body_bytes=500)
    pieces = chunks(master, 6, 25_000)
    end = pieces[-1][0] + len(pieces[-1][1])
    store = ReadAheads(slave.replica_log)
    # the master's log end as the handshake told it: the slave starts more than 60 KB behind
    session = session_of(slave, replica_store=store, master_max_offset=end)
    session.master.sendall(b"".join(frame(offset, data) for offset, data in pieces))
    session.acks_until(end)
    behind = [end - offset - len(data) for offset, data in pieces]
    assert store.asked == [gap > 60_000 for gap in behind]
    assert True in store.asked and False in store.asked   # catching up, then keeping up
    assert log_bytes(slave) == b"".join(data for _, data in pieces)


def test_the_loops_stream_is_left_non_blocking_as_it_was(open_store):
    # the thread's socket is a duplicate of the loop's stream's descriptor: they share the
    # blocking flag, which the thread clears for its kernel-timed reads and sets back
    slave = open_store("slave")
    master, loops = socket.socketpair()
    loops.setblocking(False)
    duplicate = socket.socket(fileno=os.dup(loops.fileno()))
    follower = FollowThread(slave.replica_log, epoch_file(slave), EPOCHS, duplicate, b"", read_timeout_ms=10_000,
                            ack_interval_ms=10_000, dispatch_delay_ms=10_000, master_max_offset=0,
                            signal=lambda: None)
    thread = threading.Thread(target=follower.run, daemon=True)
    thread.start()
    wait_until(lambda: os.get_blocking(loops.fileno()), "the thread's reads to block")
    follower.stop()
    thread.join(WAIT_S)
    assert not thread.is_alive() and os.get_blocking(loops.fileno()) is False
    master.close()
    loops.close()


class FrameDuringFirstPiece:
    """The slave's replica log; during its first dispatch pass the master (``master``, set
    once the session exists) sends ``frame_bytes`` (if any). Records (bytes_max, the log's
    end) of each pass asked for."""

    def __init__(self, replica_log, frame_bytes: bytes | None) -> None:
        self._inner = replica_log
        self._frame = frame_bytes
        self.master: socket.socket | None = None
        self.calls: list[tuple[int, int]] = []

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def dispatch_now(self, bytes_max: int) -> int | None:
        self.calls.append((bytes_max, self._inner.max_offset))
        left = self._inner.dispatch_now(bytes_max)
        if len(self.calls) == 1 and self._frame is not None:
            self.master.sendall(self._frame)
        return left


def test_a_due_pass_waits_for_the_socket_to_be_quiet(open_store, session_of):
    master = open_store("master")
    slave = open_store("slave", dispatcher_thread=False)
    put(master, 200, body_bytes=500)
    (offset_a, data_a), (offset_b, data_b) = chunks(master, 2, 30_000)
    clock = ManualClock()
    # a delay of 10 s on the clock and in real time: the thread's socket never times out by itself
    session = session_of(slave, dispatch_delay_ms=10_000, clock=clock)
    session.master.sendall(frame(offset_a, data_a))
    session.acks_until(offset_b)
    wait_parked_with_frames_unindexed(session)
    clock.now = 10.5                        # due (10 s after the first frame), not overdue
    session.master.sendall(frame(offset_b, data_b))
    end = offset_b + len(data_b)
    session.acks_until(end)
    time.sleep(0.05)                        # bytes came just now (on the clock): no pass
    assert session.follower.passes == 0 and session.follower.undispatched
    clock.now += 2 * follow_thread.DISPATCH_QUIET_S   # then the socket stays quiet: one whole pass
    wait_until(lambda: not session.follower.undispatched, "the pass")
    assert session.follower.passes == 1 and slave.dispatcher.dispatched_offset == end


def test_an_overdue_pass_goes_in_pieces_that_give_way_to_a_frame(open_store, session_of, monkeypatch):
    monkeypatch.setattr(follow_thread, "DISPATCH_PIECE_BYTES", 10_000)
    master = open_store("master")
    slave = open_store("slave", dispatcher_thread=False)
    put(master, 300, body_bytes=500)
    (offset_a, data_a), (offset_b, data_b), (offset_c, data_c) = chunks(master, 3, 40_000)
    end_b, end_c = offset_b + len(data_b), offset_c + len(data_c)
    clock = ManualClock()
    replica_log = FrameDuringFirstPiece(slave.replica_log, frame(offset_c, data_c))
    session = session_of(slave, dispatch_delay_ms=10_000, clock=clock, replica_store=replica_log)
    replica_log.master = session.master
    session.master.sendall(frame(offset_a, data_a))
    session.acks_until(offset_b)
    wait_parked_with_frames_unindexed(session)
    clock.now = 100.0                       # frames kept coming past the delay: overdue
    session.master.sendall(frame(offset_b, data_b))
    session.acks_until(end_c)               # C came during the first piece, and was acked
    wait_until(lambda: not session.follower.undispatched, "caught up")
    calls = replica_log.calls
    # one piece before C was read, the next ones after it had landed
    assert calls[0] == (10_000, end_b) and calls[1] == (10_000, end_c)
    assert all(bytes_max == 10_000 for bytes_max, _ in calls) and len(calls) >= end_c // 10_000
    assert slave.dispatcher.dispatched_offset == end_c


def test_an_overdue_pass_runs_one_piece_each_time_the_thread_would_wait(open_store, session_of, monkeypatch):
    # the next frame may need another process on this CPU first (the other slave's ack):
    # the thread waits for the socket after a piece instead of running the next one
    monkeypatch.setattr(follow_thread, "DISPATCH_PIECE_BYTES", 10_000)
    monkeypatch.setattr(follow_thread, "DISPATCH_QUIET_S", WAIT_S)   # a quiet socket: no pass in this test
    master = open_store("master")
    slave = open_store("slave", dispatcher_thread=False)
    put(master, 300, body_bytes=500)
    (offset_a, data_a), (offset_b, data_b), (offset_c, data_c) = chunks(master, 3, 40_000)
    clock = ManualClock()
    replica_log = FrameDuringFirstPiece(slave.replica_log, None)
    session = session_of(slave, dispatch_delay_ms=10_000, clock=clock, replica_store=replica_log)
    session.master.sendall(frame(offset_a, data_a))
    session.acks_until(offset_b)
    wait_parked_with_frames_unindexed(session)
    clock.now = 100.0                       # frames kept coming past the delay: overdue
    session.master.sendall(frame(offset_b, data_b))
    session.acks_until(offset_b + len(data_b))
    wait_until(lambda: replica_log.calls, "the first piece")
    time.sleep(0.2)
    assert replica_log.calls == [(10_000, offset_b + len(data_b))]   # then the socket, not the next piece
    session.master.sendall(frame(offset_c, data_c))
    session.acks_until(offset_c + len(data_c))
    wait_until(lambda: len(replica_log.calls) == 2, "the piece after the next frame")
    time.sleep(0.2)
    assert replica_log.calls[1] == (10_000, offset_c + len(data_c)) and len(replica_log.calls) == 2
    assert session.follower.undispatched
