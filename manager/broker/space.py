"""A seat's inbox out of one broker and into another (record 1.3; docs/design.md decision 14).

A durable consumer is not a file: what travels is a logical export. At the cut, after the seat
is proven stopped, `export_inbox` reads the `dm_` durable's configuration and contiguous ack
floor, and every message on the seat's filter from the first undelivered sequence on
(max(ackFloor+1, creation lower bound, first sequence)). At the destination, `import_inbox`
keeps a durable the broker already holds (a shared broker: the frontier survives exactly), and
otherwise republishes the carried messages in order, with their message ids, and creates the
durable at the first of them. Anything acknowledged out of order above the floor is delivered
again: at-least-once, as the record says (4.2).

The broker identity is a random id under `broker.id` in the space's custody bucket. Custody can
only be compared-and-set where that bucket lives, so "the same broker" here means exactly "the
same chain of custody": same id, the fence holds; another id, it cannot.
"""

from __future__ import annotations

import base64
import contextlib
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext, api
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from manager.broker import deadletter, reader, retention, sent
from manager.broker.custody import Held, create_exclusive
from manager.broker.footprint import ensure_dm_stream
from manager.broker.retry import riding_elections
from manager.concurrency import ordered_map
from protocol import names
from protocol.checkpoint import (
    MAX_CARRIED_BYTES,
    MAX_CARRIED_DEAD_LETTERS,
    MAX_CARRIED_HEADER_BYTES,
    MAX_CARRIED_MESSAGES,
    MAX_MESSAGE_HEADER_BYTES,
    CarriedMessage,
    CustodyAtCut,
    DurableRecord,
    SpaceExport,
    first_undelivered,
    header_bytes,
)
from protocol.deadletter import carried_headers, meta_of
from protocol.errors import Refusal
from protocol.inventory import Agent
from protocol.refusals import Code

log = structlog.get_logger("cotal.space")

BROKER_ID_KEY = "broker.id"
# Names the resume that rebuilt a durable, so its own rerun keeps it and a later leg replaces it.
ATTEMPT_METADATA = "cotal.rebuilt-by-attempt"
# Headers the source broker interpreted at publish time; replayed, they would be judged again
# against a stream they were never written for (an expected last sequence always fails there).
_DROPPED_HEADER_PREFIX = "nats-expected-"
# The import keeps up to a window of acks awaited while it publishes; none for
# IMPORT_WINDOW_S is trouble, and what was in flight goes again one by one.
IMPORT_WINDOW = 1024
IMPORT_WINDOW_S = 30.0


@dataclass(frozen=True)
class Imported:
    """What `import_inbox` did: kept an existing durable, or rebuilt it at `start_seq`."""

    kept: bool
    start_seq: int
    republished: int = 0
    duplicates: int = 0


# -- broker identity ----------------------------------------------------------------------------


async def _custody_bucket(js: JetStreamContext, space: str) -> KeyValue | None:
    bucket = names.custody_bucket(space)

    async def get() -> KeyValue | None:
        try:
            return await js.key_value(bucket)
        except BucketNotFoundError:
            return None

    return await riding_elections(f"bucket {bucket}", get)


async def _read_id(kv: KeyValue) -> str | None:
    try:
        entry = await riding_elections(f"custody {BROKER_ID_KEY}", lambda: kv.get(BROKER_ID_KEY))
    except (KeyNotFoundError, KeyDeletedError):
        return None
    value = (entry.value or b"").decode("ascii", "replace")
    if len(value) != 32 or any(c not in "0123456789abcdef" for c in value):
        raise Refusal(
            Code.BROKER_ID_MALFORMED,
            f"{BROKER_ID_KEY} in the custody bucket is {value[:64]!r}, not 32 hex digits",
            "inspect the custody bucket; cotal never overwrites a record it cannot read",
        )
    return value


async def broker_identity(kv: KeyValue) -> str:
    """This broker's id in the custody bucket, created once by exclusive create."""
    current = await _read_id(kv)
    if current is not None:
        return current
    if await create_exclusive(kv, BROKER_ID_KEY, secrets.token_hex(16).encode()) is None:
        log.info("space.broker_id_raced")
    found = await _read_id(kv)
    assert found is not None  # an exclusive create either wrote it or lost to one that did
    return found


async def read_broker_identity(js: JetStreamContext, space: str) -> str | None:
    """The destination's id, without creating anything: None where no cut ever ran."""
    kv = await _custody_bucket(js, space)
    return None if kv is None else await _read_id(kv)


# -- export -------------------------------------------------------------------------------------


def _too_large(seat: str, what: str) -> Refusal:
    return Refusal(
        Code.INBOX_TOO_LARGE,
        f"seat {seat}: its inbox holds {what}, more than a checkpoint carries "
        f"({MAX_CARRIED_MESSAGES} messages, {MAX_CARRIED_BYTES} bytes)",
        "resume this seat in place (its durable is kept), let it work its inbox down, and cut "
        "again",
    )


async def check_exportable(js: JetStreamContext, space: str, seat: str, uid: str) -> int:
    """At prepare, before anything stops: the durable is there and its inbox is not beyond what
    a checkpoint carries (by count; the export enforces bytes, and the exact count, again).
    Returns the messages queued in it."""
    stream = names.dm_stream(space)
    durable = names.dm_durable(names.SEAT_OWNER, seat, uid)
    try:
        info = await riding_elections(
            f"durable {durable}", lambda: js.consumer_info(stream, durable)
        )
    except NotFoundError:
        raise Refusal(
            Code.LIFECYCLE_PROOF_FAILED,
            f"seat {seat} (uid {uid}): its dm_ durable {durable} is not at the broker, so its "
            "inbox cannot travel",
            "stop and respawn the seat (its inbox is already gone); nothing was stopped",
        ) from None
    queued = (info.num_pending or 0) + (info.num_ack_pending or 0)
    if queued > MAX_CARRIED_MESSAGES:
        raise _too_large(seat, f"{queued} messages")
    return int(queued)


@dataclass
class _Totals:
    payload: int = 0
    headers: int = 0


def _carried(
    seat: str,
    seq: int,
    subject: str,
    raw_headers: dict[str, str] | None,
    data: bytes,
    sizes: _Totals,
) -> CarriedMessage:
    sizes.payload += len(data)
    headers = {
        k: v
        for k, v in (raw_headers or {}).items()
        if not k.lower().startswith(_DROPPED_HEADER_PREFIX)
    }
    # Any sender chooses its headers: one too many for a checkpoint is refused by name here,
    # before the cut holds gigabytes of them, not as an internal error.
    carried = header_bytes(headers)
    sizes.headers += carried
    try:
        if carried > MAX_MESSAGE_HEADER_BYTES or sizes.headers > MAX_CARRIED_HEADER_BYTES:
            raise ValueError(
                f"{carried} bytes of headers ({sizes.headers} with those before it); a "
                f"checkpoint carries {MAX_MESSAGE_HEADER_BYTES} a message and "
                f"{MAX_CARRIED_HEADER_BYTES} an inbox"
            )
        return CarriedMessage(
            seq=seq, subject=subject, headers=headers, payload=base64.b64encode(data).decode()
        )
    except ValueError as exc:
        raise Refusal(
            Code.INBOX_TOO_LARGE,
            f"seat {seat}: message {seq} of its inbox cannot travel in a checkpoint: {exc}",
            "resume this seat in place (its durable is kept), let it work its inbox down, and "
            "cut again",
        ) from None


async def _read_from(
    js: JetStreamContext, stream: str, record: DurableRecord, filters: list[str] | None = None
) -> AsyncGenerator[tuple[int, str, dict[str, str] | None, bytes], None]:
    """The inbox's messages from `start_seq` through `last_seq`, in order, read by a reader of
    our own (`reader.read`), so the seat's durable and its frontier are not touched."""
    if record.start_seq > record.last_seq:
        return
    config = api.ConsumerConfig(
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=record.start_seq,
        # `filters`: the subjects the durable itself reads, where it reads more than one.
        filter_subject=None if filters else record.filter_subject,
        filter_subjects=filters or None,
    )
    async with contextlib.aclosing(
        reader.read(js, stream, config, what=f"inbox of {record.name}", prefix="cotal-export")
    ) as messages:
        async for msg in messages:
            seq = msg.metadata.sequence.stream
            if seq > record.last_seq:
                return
            yield seq, msg.subject, msg.headers, msg.data or b""


async def durable_at(
    js: JetStreamContext, stream: str, durable: str
) -> tuple[api.ConsumerInfo, api.StreamState]:
    """A durable the cut writes down and its stream's bounds; NotFoundError where the broker
    holds no such durable."""
    info = await riding_elections(f"durable {durable}", lambda: js.consumer_info(stream, durable))
    sinfo = await riding_elections(f"stream {stream}", lambda: js.stream_info(stream))
    return info, sinfo.state


def durable_record(
    info: api.ConsumerInfo, state: api.StreamState, *, filter_subject: str
) -> DurableRecord:
    """A durable as the cut writes it down: its configuration, its contiguous ack floor and the
    stream's bounds, with the first undelivered sequence a rebuild starts at."""
    config = info.config
    by_seq = config.deliver_policy == api.DeliverPolicy.BY_START_SEQUENCE
    lower = max(1, (config.opt_start_seq if by_seq else 1) or 1)
    floor = info.ack_floor.stream_seq if info.ack_floor else 0
    return DurableRecord(
        name=info.name,
        stream=info.stream_name,
        filter_subject=filter_subject,
        ack_wait_ms=max(1, int((config.ack_wait or names.ACK_WAIT_S) * 1000)),
        max_ack_pending=config.max_ack_pending or 1,
        creation_lower_bound=lower,
        ack_floor=floor,
        delivered=info.delivered.stream_seq if info.delivered else 0,
        first_seq=state.first_seq,
        last_seq=state.last_seq,
        start_seq=first_undelivered(floor, lower, state.first_seq),
    )


async def export_inbox(
    js: JetStreamContext, space: str, seat: str, uid: str
) -> tuple[DurableRecord, list[CarriedMessage]]:
    """The durable's record and every message from its first undelivered sequence on.

    Only ever called once the seat is proven stopped, so nothing acknowledges while it reads;
    messages published meanwhile (a `send --server` to the cut seat) land above `lastSeq` and
    are not carried, which the record's window makes explicit.
    """
    stream = names.dm_stream(space)
    durable = names.dm_durable(names.SEAT_OWNER, seat, uid)
    try:
        info, state = await durable_at(js, stream, durable)
    except NotFoundError:
        raise Refusal(
            Code.LIFECYCLE_PROOF_FAILED,
            f"seat {seat} (uid {uid}): its dm_ durable {durable} is not at the broker, so its "
            "inbox cannot be exported",
            "the seat's inbox is gone; resume in place against the broker that holds it",
        ) from None
    record = durable_record(
        info,
        state,
        filter_subject=info.config.filter_subject or names.dm_filter(space, names.SEAT_OWNER, seat),
    )
    messages: list[CarriedMessage] = []
    sizes = _Totals()
    # Closed here, not when collected: a refusal mid-read must delete the reader while the
    # connection is still open.
    async with contextlib.aclosing(_read_from(js, stream, record)) as read:
        async for raw_seq, subject, raw_headers, data in read:
            if (
                len(messages) >= MAX_CARRIED_MESSAGES
                or sizes.payload + len(data) > MAX_CARRIED_BYTES
            ):
                raise _too_large(
                    seat,
                    f"more than {len(messages)} messages or {sizes.payload + len(data)} bytes",
                )
            messages.append(_carried(seat, raw_seq, subject, raw_headers, data, sizes))
    log.info(
        "space.exported",
        seat=seat,
        durable=durable,
        ack_floor=record.ack_floor,
        start_seq=record.start_seq,
        messages=len(messages),
    )
    return record, messages


async def export_space(
    js: JetStreamContext, space: str, agent: Agent, held: Held, broker_id: str
) -> SpaceExport:
    """The seat's inbox and custody for its checkpoint, read after its stop was proven."""
    seat, uid = agent.name, agent.identity.lifecycle_uid
    # Three reads of three streams, each by its own reader, side by side: each is inside the
    # cut's window (the seat is stopped) and none waits on another. The failure raised is the
    # first in this order, as one after the other would raise it.
    steps: list[Callable[[], Awaitable[Any]]] = [
        lambda: export_inbox(js, space, seat, uid),
        lambda: export_dead_letters(js, space, seat, uid),
        lambda: sent.export_entries(js, space, uid),
    ]
    outcomes = await ordered_map(lambda step: step(), steps, anyio.CapacityLimiter(len(steps)))
    (durable, messages), dead, made = (o.unwrap() for o in outcomes)
    messages = _not_buried(seat, messages, dead)
    return SpaceExport(
        broker_id=broker_id,
        durable=durable,
        custody=CustodyAtCut(
            holder=held.record.holder, generation=held.record.generation, revision=held.revision
        ),
        messages=messages,
        dead_letters=dead,
        sent=made,
    )


# -- dead letters -------------------------------------------------------------------------------


def _not_buried(
    seat: str, messages: list[CarriedMessage], dead: list[CarriedMessage]
) -> list[CarriedMessage]:
    """The carried inbox without any message that is already one of the seat's dead letters.

    A burial writes the dead letter and then terminates the message in the inbox; the delivery
    bridge waits for the broker to confirm the termination before it counts the burial
    (`deadletter.terminate`), but a termination that failed (the broker unreachable for a
    moment) leaves the message above the ack floor until it comes back past its cap. Carried
    as both, it would be delivered at the destination, fail again and be buried a second time
    there, under that broker's sequence. A message is a dead letter or pending mail, never
    both: it travels as the dead letter only. Matched by its sequence here and its bytes, as
    `deadletter.same_message` does."""
    buried = {(meta_of(d.headers).source_seq, d.payload) for d in dead}
    kept = [m for m in messages if (m.seq, m.payload) not in buried]
    if len(kept) != len(messages):
        left = sorted({m.seq for m in messages} - {m.seq for m in kept})
        log.warning("space.buried_left_out_of_inbox", seat=seat, seqs=left)
    return kept


async def export_dead_letters(
    js: JetStreamContext, space: str, seat: str, uid: str
) -> list[CarriedMessage]:
    """The seat's dead letters, oldest first, as the cut carries them: each its id at this
    broker (`seq`), its dead-letter subject, its `Cotal-Dead-*` headers and the message's own
    bytes. They travel with the inbox, so a cut or a move never waits for the operator to empty
    them first; the destination keeps them as dead letters (`import_dead_letters`)."""
    letters = await deadletter.listing(
        js, space, names.SEAT_OWNER, seat, uid, limit=MAX_CARRIED_DEAD_LETTERS
    )
    subject = deadletter.dead_subject(space, names.SEAT_OWNER, seat, uid)
    carried: list[CarriedMessage] = []
    total = 0
    for letter in letters:
        total += len(letter.data)
        if total > MAX_CARRIED_BYTES:
            raise Refusal(
                Code.INBOX_TOO_LARGE,
                f"seat {seat}: its dead letters hold more than the {MAX_CARRIED_BYTES} bytes a "
                "checkpoint carries",
                f"resume the seat in place (its dead letters stay at this broker), drop "
                f"(`cotal inbox {seat} --drop ID`) or put back (`--redeliver-all`) what need "
                "not travel, and cut again",
            )
        carried.append(
            CarriedMessage(
                seq=letter.id,
                subject=subject,
                headers=carried_headers(letter.meta),
                payload=base64.b64encode(letter.data).decode(),
            )
        )
    log.info("space.dead_letters_exported", seat=seat, letters=len(carried), bytes=total)
    return carried


async def import_dead_letters(
    js: JetStreamContext,
    space: str,
    seat: str,
    uid: str,
    letters: list[CarriedMessage],
    *,
    shared: bool,
    replicas: int = 1,
) -> tuple[int, int]:
    """Put a seat's carried dead letters into this broker's dead-letter stream, in order, on
    the seat's own dead-letter subject: still dead letters, never delivered. Returns (put here,
    already here).

    On the broker the checkpoint was cut from they never left (the subject is keyed by the
    lifecycle uid, which the resume keeps): nothing is published. Elsewhere a letter already
    under the subject with the same source sequence and instant is one an earlier run of this
    import put there, so a rerun adds none twice."""
    if shared or not letters:
        return 0, len(letters) if shared else 0
    await deadletter.ensure_dead_stream(js, space, replicas=replicas)
    here = await deadletter.listing(
        js, space, names.SEAT_OWNER, seat, uid, limit=MAX_CARRIED_DEAD_LETTERS
    )
    seen = {(d.meta.source_seq, d.meta.dead_at) for d in here}
    put = 0
    for letter in letters:
        meta = meta_of(letter.headers)
        if (meta.source_seq, meta.dead_at) in seen:
            continue
        await deadletter.bury(
            js, space, names.SEAT_OWNER, seat, uid, data=letter.data(), meta=meta, msg_id=None
        )
        put += 1
    log.info("space.dead_letters_imported", seat=seat, put=put, already=len(letters) - put)
    return put, len(letters) - put


# -- import -------------------------------------------------------------------------------------


async def _republish_one(
    js: JetStreamContext, space: str, stream: str, seat: str, m: CarriedMessage
) -> api.PubAck:
    async def publish() -> api.PubAck:
        # A copy each time: nats-py adds its expected-stream header to the dict it is given.
        return await riding_elections(
            f"republish to {seat}",
            lambda: js.publish(m.subject, m.data(), stream=stream, headers=dict(m.headers)),
        )

    return await retention.with_room(js, space, publish)


class _PubAck(msgspec.Struct):
    """A JetStream publish ack as the broker sends it; the fields it adds over time are not
    read, as nats-py reads none it does not know."""

    stream: str = ""
    seq: int = 0
    duplicate: bool | None = None
    error: msgspec.Raw | None = None


_pub_ack = msgspec.json.Decoder(_PubAck)


def _client_of(js: JetStreamContext) -> NATS:
    # JetStreamContext names no accessor for the connection it was made from. Its
    # publish_async costs several times a core publish per message (a semaphore, a NUID, a
    # future and a callback each, every ack parsed by json and a dataclass): for an inbox of
    # thousands that is most of the import, so the import publishes on the connection itself.
    nc: NATS = js._nc
    return nc


class _Acks:
    """The acks of one pipelined run, by the index each was published under."""

    def __init__(self, n: int, prefix: str) -> None:
        self.got: list[api.PubAck | None] = [None] * n
        self.cut = len(prefix)
        self.sent = 0
        self.answered = 0
        self.failed = False
        self.wake: anyio.Event | None = None
        self.limit = 0

    async def on_ack(self, msg: Msg) -> None:
        try:
            at = int(msg.subject[self.cut :])
            ack = _pub_ack.decode(msg.data)
        except (ValueError, msgspec.DecodeError):
            # A status without a body (no stream answered) or an ack that cannot be read.
            ack = None
        if ack is None or ack.error is not None or ack.seq < 1 or not 0 <= at < len(self.got):
            self.failed = True
        elif self.got[at] is None:
            self.got[at] = api.PubAck(stream=ack.stream, seq=ack.seq, duplicate=ack.duplicate)
            self.answered += 1
        if self.wake is not None and (self.failed or self.sent - self.answered <= self.limit):
            self.wake.set()

    async def until_at_most(self, outstanding: int) -> None:
        """Until no more than `outstanding` acks are awaited, or one was refused; a wait with
        no ack for IMPORT_WINDOW_S is TimeoutError."""
        self.limit = outstanding
        while not self.failed and self.sent - self.answered > outstanding:
            self.wake = anyio.Event()
            with anyio.fail_after(IMPORT_WINDOW_S):
                await self.wake.wait()
        self.wake = None


async def _pipelined(
    js: JetStreamContext, stream: str, window: list[CarriedMessage]
) -> tuple[list[api.PubAck], int]:
    """`window` published in order on one connection (which keeps their order) with up to
    IMPORT_WINDOW acks awaited at once. Returns the acks of the longest prefix that landed and
    how many were sent: after a refused, unreadable or missing ack the rest of those sent may
    have landed or not, and go again one by one."""
    nc = _client_of(js)
    prefix = nc.new_inbox() + "."
    acks = _Acks(len(window), prefix)
    sub = await nc.subscribe(prefix + "*", cb=acks.on_ack)
    try:
        for at, m in enumerate(window):
            if acks.failed:
                break
            headers = dict(m.headers)
            headers[api.Header.EXPECTED_STREAM] = stream
            await nc.publish(m.subject, m.data(), reply=f"{prefix}{at}", headers=headers)
            acks.sent += 1
            if acks.sent - acks.answered >= IMPORT_WINDOW:
                await acks.until_at_most(IMPORT_WINDOW - 1)
        await acks.until_at_most(0)
    except (TimeoutError, NatsError):
        pass
    finally:
        with anyio.CancelScope(shield=True), contextlib.suppress(NatsError):
            await sub.unsubscribe()
    landed: list[api.PubAck] = []
    for ack in acks.got:
        if ack is None:
            break
        landed.append(ack)
    return landed, acks.sent


async def _republish(
    js: JetStreamContext, space: str, stream: str, seat: str, messages: list[CarriedMessage]
) -> list[api.PubAck]:
    """Every carried message republished in order. A run of messages that each have an id goes
    pipelined; any trouble in it (a full stream, a leaderless moment) sends what was in flight
    again one by one with the retries of `_republish_one`, where the ids make what had landed
    a duplicate that answers with its first sequence, and the run goes on pipelined after. A
    message without an id is never pipelined: sent twice it would be stored twice."""
    acks: list[api.PubAck] = []
    at, n = 0, len(messages)
    while at < n:
        end = at
        while end < n and messages[end].headers.get("Nats-Msg-Id"):
            end += 1
        if end == at:
            acks.append(await _republish_one(js, space, stream, seat, messages[at]))
            at += 1
            continue
        start = at
        landed, sent = await _pipelined(js, stream, messages[start:end])
        acks += landed
        at = start + len(landed)
        if at < end:
            # What was sent after the last ack that landed, and at least the one in trouble.
            redo = max(start + sent, at + 1)
            acks += [await _republish_one(js, space, stream, seat, m) for m in messages[at:redo]]
            at = redo
    return acks


async def keeps_durable(
    js: JetStreamContext, stream: str, durable: str, *, seat: str, attempt_id: str, shared: bool
) -> bool:
    """Whether a durable of this uid the broker holds is the one to keep: on the broker the
    checkpoint was cut from it is the seat's own, with its exact frontier; elsewhere only this
    attempt's own rebuild is (a rerun). Any other is a leftover of an earlier leg of the chain
    (the seat left this broker and came back), stale against the checkpoint: it is deleted."""

    async def existing() -> api.ConsumerInfo | None:
        try:
            found: api.ConsumerInfo = await js.consumer_info(stream, durable)
            return found
        except NotFoundError:
            return None

    held = await riding_elections(f"durable {durable}", existing)
    if held is None:
        return False
    rebuilt_by = (held.config.metadata or {}).get(ATTEMPT_METADATA)
    if shared or rebuilt_by == attempt_id:
        log.info("space.kept", seat=seat, durable=durable)
        return True
    await riding_elections(
        f"replace durable {durable}", lambda: js.delete_consumer(stream, durable)
    )
    log.warning("space.stale_durable_replaced", seat=seat, durable=durable, by=rebuilt_by)
    return False


async def rebuild_durable(
    js: JetStreamContext,
    record: DurableRecord,
    acks: list[api.PubAck],
    *,
    attempt_id: str,
    filters: list[str] | None = None,
) -> int:
    """The durable made again at the first republished message (or after everything the stream
    holds, when nothing was carried), configured as the record says; its start sequence."""
    stream, durable = record.stream, record.name
    first = min((ack.seq for ack in acks), default=None)
    if first is None:
        sinfo = await riding_elections(f"stream {stream}", lambda: js.stream_info(stream))
        first = sinfo.state.last_seq + 1
    config = api.ConsumerConfig(
        durable_name=durable,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=record.ack_wait_ms / 1000,
        filter_subject=None if filters else record.filter_subject,
        filter_subjects=filters or None,
        max_ack_pending=record.max_ack_pending,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=first,
        metadata={ATTEMPT_METADATA: attempt_id},
    )

    async def create() -> api.ConsumerInfo:
        try:
            made: api.ConsumerInfo = await js.add_consumer(stream, config)
        except BadRequestError:
            # A concurrent or earlier run of this very resume may have created it.
            made = await js.consumer_info(stream, durable)
        return made

    await riding_elections(f"durable {durable}", create)
    return first


async def import_inbox(
    js: JetStreamContext,
    space: str,
    seat: str,
    uid: str,
    record: DurableRecord,
    messages: list[CarriedMessage],
    *,
    attempt_id: str,
    shared: bool,
    replicas: int = 1,
    horizon_s: int | None = None,
) -> Imported:
    """Rebuild the seat's inbox here unless this broker already holds its live durable.

    `shared`: this is the broker the checkpoint was cut from, so its durable is the seat's own
    inbox with its exact frontier, and is kept. Otherwise a durable of this uid here is either
    this attempt's own rebuild (a rerun: kept) or a leftover of an earlier leg of the chain (the
    seat left this broker and came back): its frontier is stale and the checkpoint's is not, so
    it is replaced. A rerun that died before the durable existed republishes again, and within
    the stream's duplicate window the broker answers each message as a duplicate with its
    first sequence.
    """
    stream = names.dm_stream(space)
    durable = names.dm_durable(names.SEAT_OWNER, seat, uid)
    if record.name != durable or record.stream != stream:
        raise Refusal(
            Code.SPACE_MISMATCH,
            f"seat {seat}: the checkpoint's durable {record.name} on {record.stream} is not "
            f"{durable} on {stream}",
            "resume the checkpoint into the space it was cut from",
        )

    if await keeps_durable(js, stream, durable, seat=seat, attempt_id=attempt_id, shared=shared):
        return Imported(kept=True, start_seq=0)
    # No trim per seat here: a full stream is trimmed by the republish that meets it full.
    await ensure_dm_stream(js, space, replicas=replicas, trim=False, horizon_s=horizon_s)
    acks = await _republish(js, space, stream, seat, messages)
    duplicates = sum(1 for ack in acks if ack.duplicate)
    first = await rebuild_durable(js, record, acks, attempt_id=attempt_id)
    log.info(
        "space.imported",
        seat=seat,
        durable=durable,
        start_seq=first,
        republished=len(messages),
        duplicates=duplicates,
    )
    return Imported(kept=False, start_seq=first, republished=len(messages), duplicates=duplicates)
