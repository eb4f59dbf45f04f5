"""The manager's event queue (manager/daemon/events.py) and the event record (protocol/events.py):
`emit` never waits, a full queue drops its oldest and counts it, the publisher sends each in
order on its own subject, and the record refuses what it does not know."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from manager.daemon.events import Events
from protocol.errors import DecodeError
from protocol.events import EVENT_CAP, EventDetail, decode_event, encode_event

pytestmark = pytest.mark.anyio


@dataclass
class FakeSeat:
    uid: str


@dataclass
class FakeNats:
    sent: list[tuple[str, bytes]] = field(default_factory=list)
    want: int = 1
    enough: anyio.Event = field(default_factory=anyio.Event)

    async def publish(self, subject: str, payload: bytes) -> None:
        self.sent.append((subject, payload))
        if len(self.sent) >= self.want:
            self.enough.set()

    async def flush(self) -> None:
        pass


@dataclass
class Owner:
    space: str = "default"
    nc: Any = field(default_factory=FakeNats)
    seats: dict[str, FakeSeat] = field(default_factory=dict)


async def test_a_full_queue_drops_its_oldest_and_the_rest_publish_in_order() -> None:
    owner = Owner(nc=FakeNats(want=3), seats={"alice": FakeSeat("u1")})
    events = Events(owner, "inst1", queue_max=3)
    for n in range(5):
        events.emit("turn.ended", "alice", detail=EventDetail(duration_s=float(n)))
    assert events.dropped == 2
    async with anyio.create_task_group() as tg:
        tg.start_soon(events.publish_loop)
        with anyio.fail_after(5):
            await owner.nc.enough.wait()
        tg.cancel_scope.cancel()
    subjects = {subject for subject, _ in owner.nc.sent}
    assert subjects == {"cotal.default.events.inst1.turn.ended"}
    sent = [decode_event(data) for _, data in owner.nc.sent]
    assert [e.detail.duration_s for e in sent] == [2.0, 3.0, 4.0]
    assert {(e.seat, e.uid, e.instance) for e in sent} == {("alice", "u1", "inst1")}


async def test_flush_publishes_what_is_queued() -> None:
    owner = Owner()
    events = Events(owner, "inst1")
    events.emit("refusal", detail=EventDetail(op="stop", code="no-such-seat"))
    await events.flush()
    [(subject, data)] = owner.nc.sent
    assert subject == "cotal.default.events.inst1.refusal"
    event = decode_event(data)
    assert (event.seat, event.uid, event.detail) == (
        None,
        None,
        EventDetail(op="stop", code="no-such-seat"),
    )


def test_the_record_refuses_unknown_fields_types_and_oversize() -> None:
    good = encode_event(
        decode_event(
            b'{"at":"2026-12-06T22:00:00.000Z","instance":"i","host":"h","seat":null,'
            b'"uid":null,"type":"cut.sealed","detail":{"attemptId":"a"}}'
        )
    )
    assert b'"detail":{"attemptId":"a"}' in good
    with pytest.raises(DecodeError):
        decode_event(good.replace(b'"type":"cut.sealed"', b'"type":"cut.bogus"'))
    with pytest.raises(DecodeError):
        decode_event(good.replace(b'"attemptId":"a"', b'"attemptId":"a","text":"hi"'))
    with pytest.raises(DecodeError):
        decode_event(good + b" " * EVENT_CAP)
