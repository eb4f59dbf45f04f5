"""The event stream `EVENTS_<space>`: every manager's lifecycle events on a shared broker.

One subject per manager and event type, `cotal.<space>.events.<instance>.<type>`, so
`cotal events` filters one root's events at the broker and `--fleet` reads them all. The stream
is an operator's view, not mail: limits retention, a day at most, a byte cap, and the oldest
event dropped when it is full (never a publisher refused). Nothing acknowledges it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import datetime

from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from manager.broker import reader
from manager.broker.retry import riding_elections
from protocol import names

EVENTS_MAX_AGE_S = 24 * 3600.0
EVENTS_MAX_BYTES = 64 * 1024 * 1024


def events_stream(space: str) -> str:
    return f"EVENTS_{names.check_space(space)}"


def events_subjects(space: str, instance: str | None = None) -> str:
    return f"{names.subject_prefix(space)}.events.{instance or '*'}.>"


def event_subject(space: str, instance: str, event_type: str) -> str:
    return f"{names.subject_prefix(space)}.events.{instance}.{event_type}"


def events_stream_config(space: str, *, replicas: int = 1) -> api.StreamConfig:
    return api.StreamConfig(
        name=events_stream(space),
        subjects=[events_subjects(space)],
        retention=api.RetentionPolicy.LIMITS,
        discard=api.DiscardPolicy.OLD,
        storage=api.StorageType.FILE,
        max_age=EVENTS_MAX_AGE_S,
        max_bytes=EVENTS_MAX_BYTES,
        num_replicas=replicas,
    )


async def ensure_events_stream(js: JetStreamContext, space: str, *, replicas: int = 1) -> None:
    stream = events_stream(space)

    async def ensure() -> None:
        try:
            await js.stream_info(stream)
        except NotFoundError:
            await js.add_stream(events_stream_config(space, replicas=replicas))

    await riding_elections(f"stream {stream}", ensure)


def _config(space: str, instance: str | None, since: datetime | None) -> api.ConsumerConfig:
    if since is None:
        policy, start = api.DeliverPolicy.NEW, None
    else:
        policy, start = api.DeliverPolicy.BY_START_TIME, since
    return api.ConsumerConfig(
        deliver_policy=policy,
        opt_start_time=start,
        filter_subject=events_subjects(space, instance),
    )


async def replay(
    js: JetStreamContext, space: str, *, instance: str | None, since: datetime | None
) -> AsyncIterator[bytes]:
    """Every event the stream holds now from `since` on (all it keeps when None), in order."""
    config = _config(space, instance, since)
    if since is None:
        config.deliver_policy = api.DeliverPolicy.ALL
    async with contextlib.aclosing(
        reader.read(js, events_stream(space), config, what="events", prefix="cotal-events")
    ) as msgs:
        async for msg in msgs:
            yield msg.data


async def follow(
    js: JetStreamContext, space: str, *, instance: str | None, since: datetime | None
) -> AsyncIterator[bytes]:
    """The events from `since` on (from now when None), then each as it is published, until
    the caller stops: an ordered consumer, ephemeral, that the broker forgets when it goes."""
    config = _config(space, instance, since)
    sub = await js.subscribe(
        config.filter_subject or events_subjects(space),
        stream=events_stream(space),
        config=config,
        ordered_consumer=True,
    )
    try:
        async for msg in sub.messages:
            yield msg.data
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
