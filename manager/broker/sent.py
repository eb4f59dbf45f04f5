"""The sent ledger: what each seat sent and posted inside the recency horizon, kept apart from
the streams that carry the messages (docs/mesh.md, "Duplicates").

A turn that runs again (a crash, a cut that stopped it mid-turn, a redelivery) derives the same
message ids for its sends and posts (`protocol.meshcall.send_message_id`, `post_message_id`).
The broker's own duplicate window drops such a copy only while it still remembers the id: it
forgets, across a restart, every id whose message was removed (the DM stream's trim of
acknowledged mail, the channel stream's age bound), and another broker never knew it. So every
send and post a seat makes is written here once the broker has stored it, keyed
`<lifecycle uid>.<message id>`, and a send or post whose id is here is answered as already made
and not published again.

The bucket keeps each id for the horizon (`footprint.duplicate_window_s`, the bucket's age
bound), in the broker's file store, so it outlives a broker restart and a whole cut in place; a
cut carries the seat's entries in its checkpoint (`sent.jsonl`), and a resume on another broker
writes them into that broker's ledger before the seat runs (`import_entries`).

Checking before the publish and writing after it is not a race: the writer fence makes the
holder the only writer of the seat's messages, and one seat's sends are made one at a time. The
one gap is a manager that dies between the broker storing a message and this write: the broker's
own window still drops the copy while it holds the message.
"""

from __future__ import annotations

import functools

import structlog
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from manager.broker import reader
from manager.broker.footprint import duplicate_window_s, ensure_kv
from manager.broker.retry import riding_elections
from protocol import names
from protocol.checkpoint import MAX_CARRIED_SENT, SentEntry
from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError

log = structlog.get_logger("cotal.sent")

VALUE_CAP = 256


key = names.sent_key


async def ensure_ledger(
    js: JetStreamContext, space: str, *, replicas: int = 1, horizon_s: int | None = None
) -> KeyValue:
    """The space's ledger, made or found. Its age bound is widened to this root's horizon,
    never narrowed: managers of one broker may keep different horizons, and each needs its
    own (as the DM stream's duplicate window)."""
    bucket = names.sent_bucket(space)
    window = duplicate_window_s(horizon_s)
    kv = await ensure_kv(js, bucket, ttl=window, replicas=replicas)

    async def widen() -> None:
        info = await js.stream_info(f"KV_{bucket}")
        config = info.config
        if config.max_age is not None and 0 < config.max_age < window:
            config.max_age = window
            await js.update_stream(config)
            log.info("sent.ledger_widened", bucket=bucket, window_s=window)

    await riding_elections(f"bucket {bucket}", widen)
    return kv


async def recall(kv: KeyValue, uid: str, msg_id: str) -> SentEntry | None:
    """The ledger's entry for this send or post, or None if it was not made inside the
    horizon. An entry that does not decode is no entry: the message is published, and the
    broker's own window is the check."""

    async def get() -> bytes | None:
        try:
            entry = await kv.get(key(uid, msg_id))
        except KeyNotFoundError:
            return None
        return entry.value

    value = await riding_elections("sent ledger read", get)
    if not value:
        return None
    try:
        return decode_json(value, SentEntry, what="sent ledger entry", cap=VALUE_CAP)
    except DecodeError as exc:
        log.warning("sent.entry_unreadable", id=msg_id, error=exc.message)
        return None


async def remember(kv: KeyValue, uid: str, entry: SentEntry) -> None:
    """Write down a send or post the broker has stored. A failure is logged, not raised: the
    message is sent, and a seat told otherwise would send it again under a new id."""
    try:
        await riding_elections(
            "sent ledger write", lambda: kv.put(key(uid, entry.id), encode_json(entry))
        )
    except Exception as exc:
        log.warning(
            "sent.unrecorded", id=entry.id, kind=entry.kind, error=str(exc) or type(exc).__name__
        )


async def export_entries(js: JetStreamContext, space: str, uid: str) -> list[SentEntry]:
    """The seat's entries inside the horizon, in id order, for its checkpoint: the newest
    `MAX_CARRIED_SENT` of a ledger that holds more (an older one's turn is the less likely to
    run again)."""
    found = await reader.bucket_entries(
        js, names.sent_bucket(space), keys=f"{names.check_lifecycle_uid(uid)}.*"
    )
    newest = sorted(found.values(), key=lambda e: e.revision)[-MAX_CARRIED_SENT:]
    if len(found) > len(newest):
        log.warning("sent.export_capped", uid=uid, entries=len(found), kept=len(newest))
    out: list[SentEntry] = []
    for item in newest:
        try:
            out.append(decode_json(item.value, SentEntry, what="sent ledger entry", cap=VALUE_CAP))
        except DecodeError as exc:
            log.warning("sent.entry_unreadable", uid=uid, error=exc.message)
    return sorted(out, key=lambda e: e.id)


async def import_entries(kv: KeyValue, uid: str, entries: list[SentEntry]) -> int:
    """Write a carried ledger into this broker's; an entry already here (an earlier run of the
    same import) is written again, which changes nothing it answers. Returns how many."""
    for entry in entries:
        put = functools.partial(kv.put, key(uid, entry.id), encode_json(entry))
        await riding_elections("sent ledger import", put)
    log.info("sent.imported", uid=uid, entries=len(entries))
    return len(entries)
