"""A manager's lifecycle events, as `cotal events` reads them from the broker.

One record per thing that happened: a seat spawned, started, stopped, exited, restarted; a
seat's writer fence set up under its custody; a turn started and ended; a dead letter set
aside; a cut sealed or failed; a move's seat adopted; a control op refused. An event carries
ids and states only, never a message's text nor anything secret: it is an operator's view, kept
by the stream `EVENTS_<space>` for a day at most (manager/broker/events.py).
"""

from __future__ import annotations

import typing
from typing import Literal

import msgspec

from protocol.codec import decode_json, encode_json

EventType = Literal[
    "seat.spawned",
    "seat.started",
    "seat.stopped",
    "seat.exited",
    "seat.restarted",
    "seat.failed",
    "seat.retired",
    "seat.evicted",
    "seat.self_fenced",
    "seat.fence_lifted",
    "seat.removed",
    "seat.budget_reached",
    "seat.budget_resumed",
    "custody.claimed",
    "custody.released",
    "turn.started",
    "turn.ended",
    "deadletter.added",
    "cut.sealed",
    "cut.failed",
    "checkpoint.standing",
    "checkpoint.standing_failed",
    "move.adopted",
    "seat.taken_over",
    "refusal",
]
EVENT_TYPES: tuple[str, ...] = typing.get_args(EventType)
# One event's encoding at most; the largest real one is a few hundred bytes.
EVENT_CAP = 4096


class EventDetail(msgspec.Struct, forbid_unknown_fields=True, rename="camel", omit_defaults=True):
    """What an event carries beyond who and when, each field only where it means something:
    a turn's duration and outcome, a refusal's op and code, a cut's or a move's attempt id, the
    custody generation a seat's writer fence was set up under."""

    duration_s: float | None = None
    outcome: str | None = None
    op: str | None = None
    code: str | None = None
    attempt_id: str | None = None
    tokens: int | None = None
    generation: int | None = None
    # The budget a seat reached or resumed from: `seat.tokens_per_day`, `root.turns_per_hour`.
    limit: str | None = None


class Event(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    at: str
    instance: str
    host: str
    seat: str | None
    uid: str | None
    type: EventType
    detail: EventDetail = msgspec.field(default_factory=EventDetail)


def encode_event(event: Event) -> bytes:
    return encode_json(event)


def decode_event(data: bytes) -> Event:
    return decode_json(data, Event, what="event", cap=EVENT_CAP)
