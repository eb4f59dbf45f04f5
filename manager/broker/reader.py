"""Reading a stream through a consumer of our own that acknowledges nothing.

Used where cotal must see a stream's messages without moving anyone's frontier: a cut seat's
inbox (`space.py`), a channel's history (`channels.py`) and a bucket's current entries
(`bucket_entries`). The consumer is ephemeral, held in memory with one replica, and deleted
after; one left by a process that died lapses on its own after `IDLE_S`.

Why a bucket is read here and not with `KeyValue.keys()` and a `get` per key: the client's key
listing is a push watcher that takes the end of the initial values to be the moment its consumer
reports nothing pending while the client has counted nothing received. On a loaded machine the
values can be on their way at that very moment, and the listing then ends before its first key:
`ps --fleet` once lost every custody record while the seats ran, and the live-uid check of a
restore reads presence the same way. A pull consumer delivers nothing until asked, so what it
reports pending is exactly what is still to come.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import secrets
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import datetime

import anyio
import nats.errors
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext, api

from manager.broker.retry import riding_elections

BATCH = 512
FETCH_S = 10.0
IDLE_S = 30.0
FORGET_S = 2.0
# The operations a bucket writes as a marker on a key's subject that mean "no value now".
_GONE = frozenset({"DEL", "PURGE"})
_GONE_REASONS = frozenset({"MaxAge", "Purge", "Remove"})


async def read(
    js: JetStreamContext,
    stream: str,
    config: api.ConsumerConfig,
    *,
    what: str,
    prefix: str = "cotal-read",
) -> AsyncGenerator[Msg, None]:
    """Every message `config` selects that the stream holds when the reader is made, in
    order, in batches. The caller closes it (`contextlib.aclosing`) so that a refusal midway
    deletes the reader while the connection is still open."""
    base = dataclasses.replace(
        config,
        ack_policy=api.AckPolicy.NONE,
        inactive_threshold=IDLE_S,
        mem_storage=True,
        num_replicas=1,
    )
    made: list[str] = []

    async def make() -> api.ConsumerInfo:
        # A fresh name each attempt: the broker places a one-replica reader on one of the
        # stream's peers, and for some seconds after a node dies it still counts that node as
        # a peer. A reader placed there never answers, and asking again under the same name
        # only finds that same reader; a new name is placed anew.
        name = f"{prefix}-{secrets.token_hex(6)}"
        made.append(name)
        return await js.add_consumer(stream, dataclasses.replace(base, name=name))

    try:
        info = await riding_elections(f"reader of {what}", make)
    except BaseException:
        await _forget(js, stream, made)
        raise
    name = made[-1]
    stale = made[:-1]
    try:
        left = int(info.num_pending or 0)
        if left == 0:
            return
        sub = await js.pull_subscribe_bind(consumer=name, stream=stream)
        try:
            while left > 0:
                batch = await riding_elections(
                    what, functools.partial(_pull, js, sub, stream, name, min(BATCH, left))
                )
                if not batch:
                    return
                left = int(batch[-1].metadata.num_pending or 0)
                for msg in batch:
                    yield msg
        finally:
            with anyio.CancelScope(shield=True):
                await sub.unsubscribe()
    finally:
        await _forget(js, stream, [*stale, name])


async def _forget(js: JetStreamContext, stream: str, names: list[str]) -> None:
    """Delete the readers we made, each briefly: one placed on a node that died is removed by
    the broker once it lapses (`IDLE_S`), so waiting on it longer gains nothing."""
    with anyio.CancelScope(shield=True):
        for name in names:
            with anyio.move_on_after(FORGET_S), contextlib.suppress(NatsError, TimeoutError):
                await js.delete_consumer(stream, name)


async def _pull(
    js: JetStreamContext,
    sub: JetStreamContext.PullSubscription,
    stream: str,
    name: str,
    want: int,
) -> list[Msg]:
    """One batch. A pull that finds nothing while the reader counted some still to come
    (they expired or were purged meanwhile) ends the read only if the broker agrees nothing is
    pending; otherwise it is the transient failure it looks like. On a cluster a consumer just
    made may not have its leader yet (a 503 with no messages): that pull is asked again, and
    nothing was delivered by it."""
    try:
        return list(await sub.fetch(want, timeout=FETCH_S))
    except (TimeoutError, nats.errors.TimeoutError):
        info = await js.consumer_info(stream, name)
        if not info.num_pending:
            return []
        raise


@dataclass(frozen=True)
class BucketEntry:
    value: bytes
    revision: int
    # When the broker stored this value, by its own clock (the roster's `lost` since); not
    # part of an entry's identity, which is its value at its revision.
    created: datetime | None = dataclasses.field(default=None, compare=False)


async def bucket_entries(
    js: JetStreamContext, bucket: str, keys: str = ">"
) -> dict[str, BucketEntry]:
    """Each key of `bucket` matching `keys` (a subject pattern) that holds a value, with that
    value and its revision, as of the read's start: one reader delivering the last message of
    every key, in batches, rather than a listing and a read per key. A deleted or purged key
    (its marker is its last message) and an expired one are absent."""
    prefix = f"$KV.{bucket}."
    config = api.ConsumerConfig(
        deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT, filter_subject=f"{prefix}{keys}"
    )
    entries: dict[str, BucketEntry] = {}
    async with contextlib.aclosing(
        read(js, f"KV_{bucket}", config, what=f"{bucket} entries", prefix="cotal-keys")
    ) as messages:
        async for msg in messages:
            headers = msg.headers or {}
            if headers.get("KV-Operation") in _GONE or (
                headers.get("Nats-Marker-Reason") in _GONE_REASONS
            ):
                continue
            key = msg.subject[len(prefix) :]
            meta = msg.metadata
            entries[key] = BucketEntry(msg.data or b"", int(meta.sequence.stream), meta.timestamp)
    return entries
