"""The manager's lifecycle events, published on the broker as they happen (`cotal events`).

`emit` never waits: it puts the event in a bounded queue and returns, so a turn, a stop or a
refusal is never slowed by the broker. One task of the Manager's group (`publish_loop`) drains
the queue and publishes each event to its subject of `EVENTS_<space>` (manager/broker/events.py),
where JetStream keeps it. When the queue is full (the broker away for a while) the oldest event
is dropped and counted (`dropped`, logged); a publish that fails is logged and the event lost:
events are an operator's view, never mail.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping
from typing import Protocol

import anyio
import structlog
from nats.aio.client import Client

from manager.broker.events import event_subject
from protocol.events import Event, EventDetail, EventType, encode_event
from protocol.instant import now_iso

log = structlog.get_logger("cotal.events")

QUEUE_MAX = 1000


class SeatUid(Protocol):
    @property
    def uid(self) -> str: ...


class EventsOwner(Protocol):
    """What the events read of the Manager: its instance, space and seat table (a seat's uid)."""

    @property
    def space(self) -> str: ...

    @property
    def nc(self) -> Client: ...

    @property
    def seats(self) -> Mapping[str, SeatUid]: ...


class Events:
    def __init__(self, owner: EventsOwner, instance_id: str, *, queue_max: int = QUEUE_MAX) -> None:
        self.owner = owner
        self.instance_id = instance_id
        # The host as presence names it (`cotal ps --fleet`).
        self.host = os.environ.get("COTAL_HOST_LABEL") or os.uname().nodename
        self._queue: deque[Event] = deque()
        self._queue_max = queue_max
        self._ready = anyio.Event()
        self.dropped = 0

    def emit(
        self,
        event_type: EventType,
        seat: str | None = None,
        uid: str | None = None,
        detail: EventDetail | None = None,
    ) -> None:
        """Queue one event; never blocks. `uid` defaults to the seat's in the table."""
        if uid is None and seat is not None:
            held = self.owner.seats.get(seat)
            uid = held.uid if held is not None else None
        event = Event(
            at=now_iso(),
            instance=self.instance_id,
            host=self.host,
            seat=seat,
            uid=uid,
            type=event_type,
            detail=detail or EventDetail(),
        )
        if len(self._queue) >= self._queue_max:
            self._queue.popleft()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.warning("events.dropped", dropped=self.dropped)
        self._queue.append(event)
        self._ready.set()

    async def publish_loop(self) -> None:
        """Publish every queued event, in order, until cancelled."""
        owner = self.owner
        while True:
            await self._ready.wait()
            self._ready = anyio.Event()
            while self._queue:
                event = self._queue.popleft()
                subject = event_subject(owner.space, event.instance, event.type)
                try:
                    await owner.nc.publish(subject, encode_event(event))
                except Exception as exc:  # an event lost is logged, never fatal
                    log.warning("events.publish_failed", type=event.type, error=repr(exc))

    async def flush(self) -> None:
        """Publish what is queued now (the manager's stop), shielded and bounded."""
        with anyio.move_on_after(2.0, shield=True):
            owner = self.owner
            while self._queue:
                event = self._queue.popleft()
                try:
                    await owner.nc.publish(
                        event_subject(owner.space, event.instance, event.type),
                        encode_event(event),
                    )
                except Exception:
                    return
            await owner.nc.flush()
