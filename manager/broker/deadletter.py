"""A seat's dead letters at the broker: kept beside its inbox, never lost, never run again
unless the operator puts one back.

They live in the stream `DEAD_<space>`, one subject per seat incarnation,
`cotal.<space>.dead.<owner>.<seat>.<uid>`: keyed by the lifecycle uid like the inbox durable, and
deleted with it (`cotal rm`, `cotal down`). A dead letter's id is its sequence in that stream,
which the broker never reuses. The stream keeps what it is given (limits retention): nothing in
it is anybody's unread mail, so nothing acknowledges it away, and it refuses a dead letter past
its bounds rather than dropping an older one (the message then stays in the inbox).

A dead letter put back (`redeliver`) is a fresh publish into the seat's inbox, on the operator's
sender subject: a seat's own outbound subjects are its writer fence's, and a write there by
anyone else would fence the seat out. The payload, and so the sender a reply goes to, is the
message's own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import anyio
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from manager.broker.retry import riding_elections
from protocol import names
from protocol.deadletter import PRIOR_DELIVERIES, DeadLetterMeta, headers_of, meta_of
from protocol.errors import DecodeError, Refusal
from protocol.refusals import Code

log = structlog.get_logger("cotal.deadletter")

DEAD_MAX_MSGS = 100_000
DEAD_MAX_BYTES = 1024 * 1024 * 1024
DEAD_PER_SEAT = 10_000
# What one listing reads at most; the count beside it is always the whole.
LIST_MAX = 1000


dead_stream = names.dead_stream
dead_subjects = names.dead_subjects
dead_subject = names.dead_subject


async def last_id(js: JetStreamContext, space: str) -> int:
    """The id the space's newest dead letter has now: every letter buried later has a higher
    one (the stream's last sequence)."""

    async def read() -> int:
        info = await js.stream_info(dead_stream(space))
        return int(info.state.last_seq)

    return await riding_elections("the dead letters' last id", read)


def dead_stream_config(space: str, *, replicas: int = 1) -> api.StreamConfig:
    return api.StreamConfig(
        name=dead_stream(space),
        subjects=[dead_subjects(space)],
        retention=api.RetentionPolicy.LIMITS,
        discard=api.DiscardPolicy.NEW,
        discard_new_per_subject=True,
        storage=api.StorageType.FILE,
        max_msgs_per_subject=DEAD_PER_SEAT,
        max_msgs=DEAD_MAX_MSGS,
        max_bytes=DEAD_MAX_BYTES,
        duplicate_window=120.0,
        num_replicas=replicas,
    )


async def ensure_dead_stream(js: JetStreamContext, space: str, *, replicas: int = 1) -> None:
    stream = dead_stream(space)

    async def ensure() -> None:
        try:
            await js.stream_info(stream)
        except NotFoundError:
            await js.add_stream(dead_stream_config(space, replicas=replicas))

    await riding_elections(f"stream {stream}", ensure)


@dataclass(frozen=True)
class DeadLetter:
    id: int
    meta: DeadLetterMeta
    data: bytes


async def bury(
    js: JetStreamContext,
    space: str,
    owner: str,
    actor: str,
    uid: str,
    *,
    data: bytes,
    meta: DeadLetterMeta,
    msg_id: str | None = "",
) -> int:
    """Keep one inbox message as a dead letter; its id. A retry of the same message (its
    settlement lost, so it came back) is deduplicated by its inbox sequence: one dead letter.
    `msg_id=None` publishes with no id, for a letter carried from another broker, whose inbox
    sequence is that broker's and may meet one of this broker's own."""
    headers = headers_of(meta)
    if msg_id is not None:
        headers["Nats-Msg-Id"] = msg_id or f"dead-{uid}-{meta.source_seq}"
    subject = dead_subject(space, owner, actor, uid)
    ack = await riding_elections(
        f"dead letter of {actor}",
        lambda: js.publish(subject, data, stream=dead_stream(space), headers=headers),
    )
    return int(ack.seq)


async def terminate(msg: Msg, timeout: float) -> None:
    """Terminate a buried message in the inbox and wait for the broker to say it did.

    nats-py's `term` only queues the +TERM: the broker may read it after the caller has
    counted the burial, and a cut that reads the inbox meanwhile (`space.export_inbox`) finds
    the message still unacknowledged, pending mail as well as a dead letter. The broker answers
    an acknowledgement sent as a request once it has applied it (what `ack_sync` waits for),
    so a return here means the message has left the inbox for good. Raises what the request
    raises (a timeout, a connection gone); the message then comes back past its cap."""
    if not msg.reply:
        raise ValueError("a message with no reply subject cannot be terminated")
    await msg._client.request(msg.reply, Msg.Ack.Term, timeout=timeout)
    msg._ackd = True


def same_message(letter: DeadLetter, source_seq: int, data: bytes) -> bool:
    """Whether `letter` is the inbox message at `source_seq` with these bytes: its sequence
    names it at the broker that buried it, and its bytes (which carry the message's own id)
    tell it from a letter carried in from another broker, whose sequence is that broker's."""
    return letter.meta.source_seq == source_seq and letter.data == data


async def buried_as(
    js: JetStreamContext,
    space: str,
    owner: str,
    actor: str,
    uid: str,
    *,
    source_seq: int,
    data: bytes,
) -> int | None:
    """The id of this seat's dead letter for the inbox message at `source_seq` with these
    bytes, or None. Read only when a message comes back past its cap (its settlement was
    lost), which is rare, so a scan of the seat's letters is affordable there."""
    for letter in await listing(js, space, owner, actor, uid, limit=DEAD_PER_SEAT):
        if same_message(letter, source_seq, data):
            return letter.id
    return None


def _owner_seat_uid(space: str, subject: str) -> tuple[str, str, str] | None:
    prefix = f"{names.subject_prefix(space)}.dead."
    if not subject.startswith(prefix):
        return None
    parts = subject[len(prefix) :].split(".")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


async def counts(js: JetStreamContext, space: str) -> dict[str, int]:
    """Dead letters per lifecycle uid, for every seat of the space, in one request."""

    async def read() -> dict[str, int]:
        try:
            info = await js.stream_info(dead_stream(space), subjects_filter=dead_subjects(space))
        except NotFoundError:
            return {}
        out: dict[str, int] = {}
        for subject, n in (info.state.subjects or {}).items():
            found = _owner_seat_uid(space, subject)
            if found is not None and n:
                out[found[2]] = out.get(found[2], 0) + int(n)
        return out

    return await riding_elections("dead letter counts", read)


async def count_of(js: JetStreamContext, space: str, owner: str, actor: str, uid: str) -> int:
    subject = dead_subject(space, owner, actor, uid)

    async def read() -> int:
        try:
            info = await js.stream_info(dead_stream(space), subjects_filter=subject)
        except NotFoundError:
            return 0
        return int((info.state.subjects or {}).get(subject, 0))

    return await riding_elections(f"dead letters of {actor}", read)


async def listing(
    js: JetStreamContext, space: str, owner: str, actor: str, uid: str, *, limit: int = LIST_MAX
) -> list[DeadLetter]:
    """A seat's dead letters, oldest first, at most `limit`."""
    subject = dead_subject(space, owner, actor, uid)
    out: list[DeadLetter] = []
    seq = 1

    async def next_from(at: int) -> api.RawStreamMsg:
        return await js.get_msg(dead_stream(space), seq=at, subject=subject, next=True)

    while len(out) < limit:
        try:
            raw = await riding_elections(
                f"dead letters of {actor}", functools.partial(next_from, seq)
            )
        except NotFoundError:
            break
        if raw.seq is None:
            break
        seq = int(raw.seq) + 1
        try:
            meta = meta_of(raw.headers)
        except DecodeError as exc:
            # Not one of ours (written by hand at the broker): listed by nothing, said once.
            log.warning("deadletter.unreadable", seat=actor, id=raw.seq, error=exc.message)
            continue
        out.append(DeadLetter(int(raw.seq), meta, raw.data or b""))
    return out


def _no_such(actor: str, dead_id: int) -> Refusal:
    return Refusal(
        Code.NO_SUCH_DEAD_LETTER,
        f"seat {actor} has no dead letter {dead_id}",
        f"see `cotal inbox {actor}` for its dead letters and their ids",
    )


async def fetch(
    js: JetStreamContext, space: str, owner: str, actor: str, uid: str, dead_id: int
) -> DeadLetter:
    """One of this seat's dead letters by id; `no-such-dead-letter` for any other id."""
    try:
        raw = await riding_elections(
            f"dead letter {dead_id}", lambda: js.get_msg(dead_stream(space), seq=dead_id)
        )
    except NotFoundError:
        raise _no_such(actor, dead_id) from None
    if raw.subject != dead_subject(space, owner, actor, uid):
        raise _no_such(actor, dead_id)
    try:
        meta = meta_of(raw.headers)
    except DecodeError as exc:
        raise Refusal(
            Code.NO_SUCH_DEAD_LETTER,
            f"message {dead_id} under {actor}'s dead letters is not one cotal wrote: {exc.message}",
            "inspect it at the broker (`nats stream get`); cotal neither redelivers nor drops it",
        ) from None
    return DeadLetter(dead_id, meta, raw.data or b"")


async def remove(js: JetStreamContext, space: str, dead_id: int) -> None:
    async def delete() -> None:
        try:
            await js.delete_msg(dead_stream(space), dead_id)
        except NotFoundError:
            pass

    await riding_elections(f"drop dead letter {dead_id}", delete)


async def put_back(
    js: JetStreamContext, space: str, owner: str, actor: str, letter: DeadLetter
) -> int:
    """Publish a dead letter's message into the seat's inbox again; its inbox sequence. The
    message id is the dead letter's own, so a retried call is one message, not two."""
    subject = names.dm_subject(space, owner, actor, names.SEAT_OWNER, names.OPERATOR_ACTOR)
    headers = {
        "Nats-Msg-Id": f"redeliver-{dead_stream(space)}-{letter.id}",
        PRIOR_DELIVERIES: str(letter.meta.deliveries),
    }
    ack = await riding_elections(
        f"redeliver to {actor}",
        lambda: js.publish(subject, letter.data, stream=names.dm_stream(space), headers=headers),
    )
    return int(ack.seq)


async def purge_seat(js: JetStreamContext, space: str, owner: str, actor: str, uid: str) -> None:
    """The teardown's part: every dead letter of this seat incarnation."""

    async def purge() -> None:
        try:
            await js.purge_stream(
                dead_stream(space), subject=dead_subject(space, owner, actor, uid)
            )
        except NotFoundError:
            pass

    with anyio.CancelScope(shield=True):
        await riding_elections(f"purge dead letters of {actor}", purge)
