"""A subscribed seat's channel frontiers out of one broker and into another (docs/mesh.md,
"Channels through a cut").

On the broker the checkpoint was cut from, each `chathist_` durable stays where it is, with its
frontier. Elsewhere the channel is another broker's channel of the same name, whose other
subscribers never saw the source's posts, so the posts above the seat's ack floor are not
posted there again: they are republished on a subject of the seat's own,
`cotal.<space>.chan.<channel>.carried.<uid>`, which no other subscriber reads, and the durable
is rebuilt at the first of them, reading that subject beside the channel's. What the seat is
handed is the post as it was (the bridge frames it from its body), and what is posted on the
channel here from the rebuild on is its turn as well.

Each carried post travels under an id of this seat's own (`meshcall.carried_post_id`), so a
rerun of the import is a duplicate at the broker, while the same post carried by two
subscribers into one stream stays two messages, one on each seat's subject.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence

import msgspec
import structlog
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from manager.broker import channels
from manager.broker.custody import Held
from manager.broker.fence import MSG_ID
from manager.broker.retry import riding_elections
from manager.broker.space import (
    Imported,
    _carried,
    _read_from,
    _republish,
    _Totals,
    check_exportable,
    durable_at,
    durable_record,
    export_space,
    keeps_durable,
    rebuild_durable,
)
from protocol import meshcall, names
from protocol.checkpoint import (
    MAX_CARRIED_BYTES,
    MAX_CARRIED_MESSAGES,
    CarriedMessage,
    ChannelExport,
    ChannelState,
    SpaceExport,
)
from protocol.errors import DecodeError, Refusal
from protocol.inventory import Agent
from protocol.refusals import Code

log = structlog.get_logger("cotal.space")


async def check_seat_exportable(
    js: JetStreamContext, space: str, seat: str, uid: str, subscribed: Sequence[str]
) -> None:
    """At prepare, before anything stops: the seat's inbox and its unread posts in the channels
    it subscribes fit in one checkpoint (by count; the export enforces bytes, and the exact
    count, again)."""
    queued = await check_exportable(js, space, seat, uid)
    stream = names.chan_stream(space)
    for channel in subscribed:
        durable = names.chathist_durable(names.SEAT_OWNER, seat, uid, channel)
        try:
            info = await riding_elections(
                f"durable {durable}", functools.partial(js.consumer_info, stream, durable)
            )
        except NotFoundError:
            continue
        queued += int(info.num_pending or 0) + int(info.num_ack_pending or 0)
        if queued > MAX_CARRIED_MESSAGES:
            raise _too_many(seat, channel, f"{queued} messages")


def _too_many(seat: str, channel: str, what: str) -> Refusal:
    return Refusal(
        Code.INBOX_TOO_LARGE,
        f"seat {seat}: its inbox and channels hold {what} by #{channel}, more than a checkpoint "
        f"carries ({MAX_CARRIED_MESSAGES} messages, {MAX_CARRIED_BYTES} bytes)",
        "resume this seat in place (its durables are kept), let it read its channels down, or "
        "lower `[channels] history`, and cut again",
    )


async def export_frontier(
    js: JetStreamContext, space: str, seat: str, uid: str, channel: str, *, room: tuple[int, int]
) -> ChannelExport | None:
    """The seat's frontier in `channel` and every post above its ack floor, each addressed to
    the channel's own subject, under this seat's id for it. None where the broker holds no
    such durable (the seat never reached its first start here): a destination makes one at its
    activation moment, as the seat's start would have. `room`: the messages and bytes the
    checkpoint can still carry."""
    stream = names.chan_stream(space)
    durable = names.chathist_durable(names.SEAT_OWNER, seat, uid, channel)
    subject = names.chan_subject(space, channel)
    try:
        info, state = await durable_at(js, stream, durable)
    except NotFoundError:
        log.info("space.frontier_absent", seat=seat, durable=durable)
        return None
    record = durable_record(info, state, filter_subject=subject)
    filters = list(info.config.filter_subjects or []) or None
    posts: list[CarriedMessage] = []
    sizes = _Totals()
    # Read whatever the durable's own counts say: the broker updates a durable's pending count
    # after it acknowledges a publish, not with it, and on a busy host a durable asked right
    # after three posts said none were pending, so the cut carried none of them. The reader's
    # count is taken when the reader is made, from the stream itself. Closed here, as the
    # inbox's reader is (space.export_inbox).
    async with contextlib.aclosing(_read_from(js, stream, record, filters)) as read:
        async for raw_seq, _subject, raw_headers, data in read:
            try:
                post = meshcall.decode_post(data)
            except DecodeError:
                # The seat would give it up unread (docs/mesh.md): a frontier carries posts.
                log.info("space.post_not_carried", seat=seat, channel=channel, seq=raw_seq)
                continue
            if len(posts) >= room[0] or sizes.payload + len(data) > room[1]:
                raise _too_many(seat, channel, f"more than {len(posts)} posts")
            headers = dict(raw_headers or {})
            headers[MSG_ID] = meshcall.carried_post_id(uid, post.id)
            posts.append(_carried(seat, raw_seq, subject, headers, data, sizes))
    log.info(
        "space.frontier_exported",
        seat=seat,
        durable=durable,
        ack_floor=record.ack_floor,
        start_seq=record.start_seq,
        posts=len(posts),
    )
    return ChannelExport(channel=channel, durable=record, messages=posts)


async def export_frontiers(
    js: JetStreamContext,
    space: str,
    seat: str,
    uid: str,
    subscribed: Sequence[str],
    *,
    inbox: Sequence[CarriedMessage],
) -> list[ChannelExport]:
    """Every subscribed channel's frontier, within what the checkpoint carries beside `inbox`."""
    messages = MAX_CARRIED_MESSAGES - len(inbox)
    payload = MAX_CARRIED_BYTES - sum(m.payload_bytes() for m in inbox)
    out: list[ChannelExport] = []
    for channel in subscribed:
        got = await export_frontier(js, space, seat, uid, channel, room=(messages, payload))
        if got is None:
            continue
        messages -= len(got.messages)
        payload -= sum(m.payload_bytes() for m in got.messages)
        out.append(got)
    return out


async def import_frontier(
    js: JetStreamContext,
    space: str,
    seat: str,
    uid: str,
    state: ChannelState,
    posts: list[CarriedMessage],
    *,
    attempt_id: str,
    shared: bool,
    history: int,
    max_age_s: int,
    replicas: int = 1,
    horizon_s: int | None = None,
) -> Imported:
    """Rebuild the seat's frontier in one channel here, unless this broker already holds it
    (`space.keeps_durable`: the source's broker, or this attempt's own rebuild)."""
    record = state.durable
    stream = names.chan_stream(space)
    durable = names.chathist_durable(names.SEAT_OWNER, seat, uid, state.channel)
    if record.name != durable or record.stream != stream:
        raise Refusal(
            Code.SPACE_MISMATCH,
            f"seat {seat}: the checkpoint's durable {record.name} on {record.stream} is not "
            f"{durable} on {stream}",
            "resume the checkpoint into the space it was cut from",
        )
    if await keeps_durable(js, stream, durable, seat=seat, attempt_id=attempt_id, shared=shared):
        return Imported(kept=True, start_seq=0)
    await channels.ensure_chan_stream(
        js, space, history=history, max_age_s=max_age_s, replicas=replicas, horizon_s=horizon_s
    )
    own = names.chan_carried_subject(space, state.channel, uid)
    moved = [msgspec.structs.replace(m, subject=own) for m in posts]
    acks = await _republish(js, space, stream, seat, moved)
    duplicates = sum(1 for ack in acks if ack.duplicate)
    first = await rebuild_durable(
        js, record, acks, attempt_id=attempt_id, filters=[record.filter_subject, own]
    )
    log.info(
        "space.frontier_imported",
        seat=seat,
        durable=durable,
        start_seq=first,
        republished=len(posts),
        duplicates=duplicates,
    )
    return Imported(kept=False, start_seq=first, republished=len(posts), duplicates=duplicates)


async def export_seat_space(
    js: JetStreamContext, space: str, agent: Agent, held: Held, broker_id: str
) -> SpaceExport:
    """The seat's inbox and custody (`space.export_space`) and its channel frontiers, read
    after its stop was proven."""
    carried = await export_space(js, space, agent, held, broker_id)
    frontiers = await export_frontiers(
        js,
        space,
        agent.name,
        agent.identity.lifecycle_uid,
        agent.launch.subscribe,
        inbox=carried.messages,
    )
    return msgspec.structs.replace(carried, channels=frontiers)
