"""A buried message is a dead letter or pending inbox mail, never both, and never two dead
letters (docs/mesh.md, "Delivery, outages and dead letters"). The window between a burial's
dead letter and its settlement in the inbox is forced here, on a real broker, by burying a
message and not terminating it (as a termination the broker has not yet applied, or one that
failed, leaves it): a cut's export carries it as the dead letter only; back past its cap, it is
found by its sequence and bytes, so the bridge terminates it instead of burying it again; and a
termination the bridge waits for has left the inbox when it returns."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from manager.broker import deadletter
from manager.broker.dm import publish_dm
from manager.broker.footprint import ensure_dm_durable, ensure_dm_stream
from manager.broker.space import _not_buried, export_dead_letters, export_inbox
from protocol import names
from protocol.deadletter import DeadLetterMeta
from protocol.messages import DirectMessage, decode_dm

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SPACE = "main"
SEAT = "d"


def _dm(text: str) -> DirectMessage:
    return DirectMessage(
        id=f"poison-{text}",
        sender="local.operator",
        recipient=f"local.{SEAT}",
        text=text,
        sent_at="2026-01-01T00:00:00.000Z",
    )


async def _inbox(js: JetStreamContext, texts: list[str]) -> tuple[str, Msg]:
    """A seat's inbox holding `texts`, the first delivered once to it and not yet settled (the
    durable hands out one unsettled message at a time)."""
    await ensure_dm_stream(js, SPACE)
    await deadletter.ensure_dead_stream(js, SPACE)
    uid = names.mint_lifecycle_uid()
    await ensure_dm_durable(js, SPACE, names.SEAT_OWNER, SEAT, uid)
    for text in texts:
        await publish_dm(js, SPACE, _dm(text))
    psub = await js.pull_subscribe_bind(
        durable=names.dm_durable(names.SEAT_OWNER, SEAT, uid), stream=names.dm_stream(SPACE)
    )
    [first] = await psub.fetch(1, timeout=5)
    return uid, first


async def _bury(js: JetStreamContext, uid: str, msg: Msg) -> int:
    """The burial's first half, as the bridge writes it: the dead letter, no settlement."""
    meta = DeadLetterMeta(
        subject=msg.subject,
        source_seq=int(msg.metadata.sequence.stream),
        deliveries=1,
        reason="error: injected",
        dead_at="2026-01-01T00:00:01.000Z",
    )
    return await deadletter.bury(js, SPACE, names.SEAT_OWNER, SEAT, uid, data=msg.data, meta=meta)


async def test_a_cut_in_the_window_carries_the_message_as_its_dead_letter_only(
    js: JetStreamContext,
) -> None:
    uid, poison = await _inbox(js, ["poison"])
    await _bury(js, uid, poison)
    # Nothing settled it: the inbox export still reads it above the ack floor.
    _record, inbox = await export_inbox(js, SPACE, SEAT, uid)
    assert [m.seq for m in inbox] == [poison.metadata.sequence.stream]
    dead = await export_dead_letters(js, SPACE, SEAT, uid)
    assert len(dead) == 1

    # What the cut carries: the dead letter, and an inbox without it.
    assert _not_buried(SEAT, inbox, dead) == []


async def test_the_export_keeps_pending_mail_that_only_shares_a_sequence_or_bytes(
    js: JetStreamContext,
) -> None:
    uid, poison = await _inbox(js, ["poison", "fine"])
    await _bury(js, uid, poison)
    _record, inbox = await export_inbox(js, SPACE, SEAT, uid)
    dead = await export_dead_letters(js, SPACE, SEAT, uid)
    kept = _not_buried(SEAT, inbox, dead)
    assert [decode_dm(m.data()).text for m in kept] == ["fine"]
    # A letter carried in from another broker under the same sequence is another message.
    foreign = [
        d.__class__(seq=d.seq, subject=d.subject, headers=d.headers, payload=inbox[1].payload)
        for d in dead
    ]
    assert [m.seq for m in _not_buried(SEAT, inbox, foreign)] == [m.seq for m in inbox]


async def test_a_message_back_past_its_cap_is_found_among_the_dead_letters(
    js: JetStreamContext,
) -> None:
    uid, poison = await _inbox(js, ["poison"])
    dead_id = await _bury(js, uid, poison)
    seq = int(poison.metadata.sequence.stream)
    # Its settlement lost: it comes back (here at once, not after ack_wait).
    await poison.nak()
    psub = await js.pull_subscribe_bind(
        durable=names.dm_durable(names.SEAT_OWNER, SEAT, uid), stream=names.dm_stream(SPACE)
    )
    [back] = await psub.fetch(1, timeout=5)
    assert back.metadata.num_delivered == 2 and back.metadata.sequence.stream == seq
    found = await deadletter.buried_as(
        js, SPACE, names.SEAT_OWNER, SEAT, uid, source_seq=seq, data=back.data
    )
    assert found == dead_id
    # The same sequence with other bytes (a letter carried from another broker) is not it.
    assert (
        await deadletter.buried_as(
            js, SPACE, names.SEAT_OWNER, SEAT, uid, source_seq=seq, data=b"{}"
        )
        is None
    )
    await deadletter.terminate(back, 5.0)
    assert await deadletter.count_of(js, SPACE, names.SEAT_OWNER, SEAT, uid) == 1


async def test_a_confirmed_termination_has_left_the_inbox_when_it_returns(
    js: JetStreamContext,
) -> None:
    uid, poison = await _inbox(js, ["poison"])
    await _bury(js, uid, poison)
    await deadletter.terminate(poison, 5.0)
    # No wait: the broker answered once it had applied the termination.
    info = await js.consumer_info(
        names.dm_stream(SPACE), names.dm_durable(names.SEAT_OWNER, SEAT, uid)
    )
    assert info.num_ack_pending == 0 and info.num_pending == 0
    assert info.ack_floor.stream_seq == poison.metadata.sequence.stream
    _record, inbox = await export_inbox(js, SPACE, SEAT, uid)
    assert inbox == []
