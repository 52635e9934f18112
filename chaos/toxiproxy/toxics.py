"""Toxics: what each one is (a frozen spec parsed from the REST API's JSON) and what it does
to the bytes of one direction of one link.

A direction's chain is the tuple of its proxy's toxics for that stream, in the order they were
added. Each chunk read from the source is stamped with its arrival time and passed down the
chain; a toxic hands what it lets through to ``emit`` (the rest of the chain, then the
destination socket). A toxic's behaviour returns False when the direction must close.

Per link, every toxic has a ``ToxicState``: whether it is active on this link (drawn once
against ``toxicity``, again when the toxic is updated), when it became active, and its
counters. Waits go through ``port.sleep_until``, which returns early (False) when the toxic
was removed or updated meanwhile; the toxic then lets its data through at once, so that
removing a toxic never drops bytes it was holding (as Toxiproxy does).

Attributes (all integers, Toxiproxy 2.x names and units):

| type        | attributes                                 | effect                                     |
|-------------|--------------------------------------------|--------------------------------------------|
| latency     | latency ms, jitter ms                      | each chunk leaves latency +/- jitter after it arrived |
| bandwidth   | rate KB/s (1 KB = 1000 bytes)              | paced in slices of 100 ms worth            |
| slow_close  | delay ms                                   | the close of the destination waits delay   |
| timeout     | timeout ms                                 | drops all data; > 0 closes after timeout, 0 holds until removed (removal then closes the link, as Toxiproxy's cleanup does) |
| reset_peer  | timeout ms                                 | on the first data, waits timeout, then resets both sockets (SO_LINGER 0: RST) |
| slicer      | average_size, size_variation bytes, delay us | splits chunks into pieces, delay between them |
| limit_data  | bytes                                      | lets that many bytes through, then closes  |
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Protocol

from .errors import INVALID_STREAM, INVALID_TOXIC_TYPE, ApiError, bad_request

STREAMS = ("upstream", "downstream")
TOXIC_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "slow_close": ("delay",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
    "slicer": ("average_size", "size_variation", "delay"),
    "limit_data": ("bytes",),
}
ATTRIBUTE_MAX = 1 << 53  # JSON numbers stay exact below this
BANDWIDTH_SLICE_S = 0.1  # a slow rate is paced in slices of 100 ms worth of bytes


@dataclass(frozen=True)
class ToxicSpec:
    """One toxic of a proxy, as the API shows it. Immutable: an update makes a new spec."""

    name: str
    type: str
    stream: str
    toxicity: float
    attributes: tuple[tuple[str, int], ...]

    def attribute(self, key: str) -> int:
        return dict(self.attributes)[key]

    def to_json(self) -> dict:
        return {"attributes": dict(self.attributes), "name": self.name, "type": self.type,
                "stream": self.stream, "toxicity": self.toxicity}


def _check_toxicity(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise bad_request(f"toxicity must be a number between 0 and 1, not {value!r}")
    return float(value)


def _check_attributes(toxic_type: str, given, base: dict[str, int]) -> tuple[tuple[str, int], ...]:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise bad_request(f"attributes must be an object, not {given!r}")
    values = dict(base)
    for key in TOXIC_ATTRIBUTES[toxic_type]:
        if key not in given:
            continue
        value = given[key]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < ATTRIBUTE_MAX:
            raise bad_request(f"attribute {key} of a {toxic_type} toxic must be a non-negative integer, "
                              f"not {value!r}")
        values[key] = value
    return tuple((key, values[key]) for key in TOXIC_ATTRIBUTES[toxic_type])


def parse_new_toxic(body) -> ToxicSpec:
    """The spec a POST /proxies/{proxy}/toxics body asks for, checked in Toxiproxy's order
    (body, stream, default name, type, then attributes). Raises ``ApiError`` (400)."""
    if not isinstance(body, dict):
        raise bad_request("expected a JSON object")
    stream = body.get("stream", "downstream")
    if not isinstance(stream, str) or stream.lower() not in STREAMS:
        raise ApiError(400, INVALID_STREAM)
    stream = stream.lower()
    toxic_type = body.get("type", "")
    name = body.get("name") or f"{toxic_type}_{stream}"
    if not isinstance(name, str):
        raise bad_request(f"name must be a string, not {name!r}")
    if toxic_type not in TOXIC_ATTRIBUTES:
        raise ApiError(400, INVALID_TOXIC_TYPE)
    toxicity = _check_toxicity(body.get("toxicity", 1.0))
    zeros = {key: 0 for key in TOXIC_ATTRIBUTES[toxic_type]}
    return ToxicSpec(name, toxic_type, stream, toxicity, _check_attributes(toxic_type, body.get("attributes"), zeros))


def parse_toxic_update(current: ToxicSpec, body) -> ToxicSpec:
    """The spec after a POST /proxies/{proxy}/toxics/{toxic}: attributes given replace theirs,
    the others keep their values; toxicity likewise. Name, type and stream never change."""
    if not isinstance(body, dict):
        raise bad_request("expected a JSON object")
    toxicity = _check_toxicity(body.get("toxicity", current.toxicity))
    attributes = _check_attributes(current.type, body.get("attributes"), dict(current.attributes))
    return ToxicSpec(current.name, current.type, current.stream, toxicity, attributes)


@dataclass
class ToxicState:
    """One toxic's state on one direction of one link."""

    spec: ToxicSpec
    active: bool
    activated_at: float
    transmitted_bytes: int = 0  # limit_data
    next_free_at: float = -math.inf  # bandwidth
    fired: bool = False  # reset_peer
    extra: dict = field(default_factory=dict)


def new_state(spec: ToxicSpec, now: float, rng: random.Random, previous: ToxicState | None) -> ToxicState:
    """The state of a toxic newly seen by a link (or updated: counters carry over)."""
    active = rng.random() < spec.toxicity
    state = ToxicState(spec, active, now)
    if previous is not None:
        state.transmitted_bytes = previous.transmitted_bytes
        state.next_free_at = previous.next_free_at
        state.fired = previous.fired
    return state


class ToxicPort(Protocol):
    """What a toxic's behaviour may ask of the direction it runs on."""

    rng: random.Random

    def now(self) -> float: ...

    async def sleep_until(self, deadline: float, spec: ToxicSpec) -> bool:
        """Sleep until ``deadline``; False if ``spec`` left the chain (removed or updated) first."""

    async def reset(self) -> None:
        """Reset both sockets of the link (RST) and end it."""


Emit = Callable[[bytes], Awaitable[bool]]


async def _latency(state: ToxicState, data: bytes, stamp: float, emit: Emit, port: ToxicPort) -> bool:
    spec = state.spec
    delay_ms = spec.attribute("latency")
    jitter_ms = spec.attribute("jitter")
    if jitter_ms:
        delay_ms += port.rng.uniform(-jitter_ms, jitter_ms)
    await port.sleep_until(stamp + max(0.0, delay_ms) / 1000.0, spec)
    return await emit(data)


async def _bandwidth(state: ToxicState, data: bytes, stamp: float, emit: Emit, port: ToxicPort) -> bool:
    rate_bytes_per_s = state.spec.attribute("rate") * 1000
    if rate_bytes_per_s <= 0:
        return await emit(data)
    slice_bytes = max(1, int(rate_bytes_per_s * BANDWIDTH_SLICE_S))
    view = memoryview(data)
    while view:
        piece, view = view[:slice_bytes], view[slice_bytes:]
        state.next_free_at = max(state.next_free_at, port.now()) + len(piece) / rate_bytes_per_s
        if not await port.sleep_until(state.next_free_at, state.spec):
            return await emit(bytes(piece) + bytes(view))
        if not await emit(bytes(piece)):
            return False
    return True


async def _pass(state: ToxicState, data: bytes, stamp: float, emit: Emit, port: ToxicPort) -> bool:
    return await emit(data)  # slow_close acts when the direction closes


async def _timeout(state: ToxicState, data: bytes, stamp: float, emit: Emit, port: ToxicPort) -> bool:
    return True  # data is dropped; closing after the timeout is the direction's watchdog's job


async def _reset_peer(state: ToxicState, data: bytes, stamp: float, emit: Emit, port: ToxicPort) -> bool:
    if not state.fired:
        state.fired = True
        if await port.sleep_until(port.now() + state.spec.attribute("timeout") / 1000.0, state.spec):
            await port.reset()
            return False
    return await emit(data)


def slice_sizes(total: int, average: int, variation: int, rng: random.Random) -> list[int]:
    """Sizes of the pieces the slicer cuts ``total`` bytes into: average +/- variation, each >= 1."""
    if average <= 0:
        return [total]
    sizes = []
    left = total
    while left > 0:
        size = average + (rng.randint(-variation, variation) if variation else 0)
        size = min(left, max(1, size))
        sizes.append(size)
        left -= size
    return sizes


async def _slicer(state: ToxicState, data: bytes, stamp: float, emit: Emit, port: ToxicPort) -> bool:
    spec = state.spec
    delay_s = spec.attribute("delay") / 1_000_000
    offset = 0
    for size in slice_sizes(len(data), spec.attribute("average_size"), spec.attribute("size_variation"), port.rng):
        if not await emit(data[offset:offset + size]):
            return False
        offset += size
        if delay_s and offset < len(data) and not await port.sleep_until(port.now() + delay_s, spec):
            return await emit(data[offset:])
    return True


async def _limit_data(state: ToxicState, data: bytes, stamp: float, emit: Emit, port: ToxicPort) -> bool:
    limit = state.spec.attribute("bytes")
    room = max(0, limit - state.transmitted_bytes)
    allowed = data[:room]
    if allowed:
        state.transmitted_bytes += len(allowed)
        if not await emit(allowed):
            return False
    return state.transmitted_bytes < limit


BEHAVIOURS = {"latency": _latency, "bandwidth": _bandwidth, "slow_close": _pass, "timeout": _timeout,
              "reset_peer": _reset_peer, "slicer": _slicer, "limit_data": _limit_data}
assert set(BEHAVIOURS) == set(TOXIC_ATTRIBUTES)
