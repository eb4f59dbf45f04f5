"""A carried inbox of 10,000 messages leaves one broker and lands in another whole: the same
messages, ids and order after the same ack floor, a rerun's republish answered as duplicates,
and a stream that fills in the middle of the import trimmed and the rest republished in order
(real brokers, the export and import the cut and the resume run)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from nats.js import JetStreamContext, api

from manager.broker import embedded
from manager.broker.footprint import ensure_dm_durable, ensure_dm_stream
from manager.broker.space import export_inbox, import_inbox
from protocol import names
from protocol.checkpoint import (
    CarriedMessage,
    CustodyAtCut,
    DurableRecord,
    FileRef,
    SpaceRecord,
    decode_inbox,
    encode_inbox,
)
from tests.helpers import broker_at

pytestmark = pytest.mark.anyio

SPACE = "main"
STREAM = names.dm_stream(SPACE)
SEAT = "s1"
UID = names.mint_lifecycle_uid()
CARRIED = 10_000
ACKED = 100
# Published without an id: such a message is republished one by one, between pipelined runs.
WITHOUT_ID = {ACKED + 3, ACKED + 5_000}


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[tuple[JetStreamContext, JetStreamContext]]:
    a = embedded.start_embedded(tmp_path / "a" / "nats", tmp_path / "a" / "broker.creds")
    try:
        b = embedded.start_embedded(tmp_path / "b" / "nats", tmp_path / "b" / "broker.creds")
        try:
            async with broker_at(a.url, a.creds) as ja, broker_at(b.url, b.creds) as jb:
                yield ja, jb
        finally:
            embedded.stop_embedded(b.identity)
    finally:
        embedded.stop_embedded(a.identity)


def subject(i: int) -> str:
    return names.dm_subject(SPACE, names.SEAT_OWNER, SEAT, "local", f"sender{i % 7}")


async def publish_all(js: JetStreamContext, n: int) -> None:
    futures = []
    for i in range(n):
        headers = None if i in WITHOUT_ID else {"Nats-Msg-Id": f"m-{i}"}
        futures.append(await js.publish_async(subject(i), f"message {i}".encode(), headers=headers))
        if len(futures) == 500:
            for f in futures:
                await f
            futures = []
    for f in futures:
        await f


def as_record(record: DurableRecord, data: bytes, messages: list[CarriedMessage]) -> SpaceRecord:
    """The seat's space record as the cut writes it beside inbox.jsonl."""
    return SpaceRecord(
        broker_id="0" * 32,
        durable=record,
        custody=CustodyAtCut(holder=names.mint_instance_id(), generation=0, revision=1),
        messages=len(messages),
        message_bytes=sum(len(m.data()) for m in messages),
        inbox=FileRef(file="inbox.jsonl", bytes=len(data), sha256=hashlib.sha256(data).hexdigest()),
    )


def shape(messages: list[CarriedMessage]) -> list[tuple[str, dict[str, str], str]]:
    return [(m.subject, m.headers, m.payload) for m in messages]


async def test_ten_thousand_messages_arrive_with_their_ids_order_and_floor(
    two: tuple[JetStreamContext, JetStreamContext],
) -> None:
    ja, jb = two
    await ensure_dm_stream(ja, SPACE)
    await ensure_dm_durable(ja, SPACE, names.SEAT_OWNER, SEAT, UID)
    await publish_all(ja, ACKED + CARRIED)
    durable = names.dm_durable(names.SEAT_OWNER, SEAT, UID)
    sub = await ja.pull_subscribe_bind(durable, STREAM)
    with anyio.fail_after(60):
        for _ in range(ACKED):
            [msg] = await sub.fetch(1, timeout=5)
            await msg.ack_sync()
    await sub.unsubscribe()

    record, carried = await export_inbox(ja, SPACE, SEAT, UID)
    assert (record.ack_floor, record.start_seq, len(carried)) == (ACKED, ACKED + 1, CARRIED)
    assert [m.seq for m in carried] == list(range(ACKED + 1, ACKED + CARRIED + 1))
    data = encode_inbox(carried)
    messages = decode_inbox(data, as_record(record, data, carried))
    assert shape(messages) == shape(carried)
    assert [m.data() for m in messages] == [
        f"message {i}".encode() for i in range(ACKED, ACKED + CARRIED)
    ]
    assert [m.msg_id for m in messages] == [
        None if i in WITHOUT_ID else f"m-{i}" for i in range(ACKED, ACKED + CARRIED)
    ]

    with anyio.fail_after(120):
        done = await import_inbox(
            jb, SPACE, SEAT, UID, record, messages, attempt_id="attempt-1", shared=False
        )
    assert (done.kept, done.start_seq, done.republished, done.duplicates) == (
        False,
        1,
        CARRIED,
        0,
    )
    info = await jb.consumer_info(STREAM, durable)
    assert info.num_pending == CARRIED and info.ack_floor.stream_seq == 0
    assert info.config.max_ack_pending == record.max_ack_pending
    # What the seat reads here is what it had not acknowledged there, in the same order.
    here, again = await export_inbox(jb, SPACE, SEAT, UID)
    assert (here.start_seq, here.last_seq) == (1, CARRIED)
    assert [m.seq for m in again] == list(range(1, CARRIED + 1))
    assert shape(again) == shape(messages)

    # An earlier leg's durable is replaced; within the duplicate window every message with an
    # id is answered as the one already stored, and the durable starts where they are.
    with anyio.fail_after(120):
        rerun = await import_inbox(
            jb, SPACE, SEAT, UID, record, messages, attempt_id="attempt-2", shared=False
        )
    assert (rerun.start_seq, rerun.duplicates) == (1, CARRIED - len(WITHOUT_ID))


async def test_a_stream_that_fills_during_the_import_is_trimmed_and_keeps_the_order(
    two: tuple[JetStreamContext, JetStreamContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, jb = two
    limit, other, carried_n = 300, 200, 250
    monkeypatch.setenv("COTAL_DM_MAX_MSGS", str(limit))
    await ensure_dm_stream(jb, SPACE)
    # Mail another seat read and acknowledged: the trim may take all but its last.
    reader = api.ConsumerConfig(
        durable_name=names.dm_durable(names.SEAT_OWNER, "other", names.mint_lifecycle_uid()),
        ack_policy=api.AckPolicy.ALL,
        filter_subject=names.dm_filter(SPACE, names.SEAT_OWNER, "other"),
        max_ack_pending=other,
    )
    await jb.add_consumer(STREAM, reader)
    for i in range(other):
        await jb.publish(
            names.dm_subject(SPACE, names.SEAT_OWNER, "other", "local", "x"), f"o{i}".encode()
        )
    sub = await jb.pull_subscribe_bind(reader.durable_name or "", STREAM)
    got = await sub.fetch(other, timeout=5)
    assert len(got) == other
    await got[-1].ack_sync()
    await sub.unsubscribe()

    messages = [
        CarriedMessage(
            seq=i,
            subject=subject(i),
            headers={"Nats-Msg-Id": f"full-{i}"},
            payload=base64.b64encode(f"carried {i}".encode()).decode(),
        )
        for i in range(1, carried_n + 1)
    ]
    record = DurableRecord(
        name=names.dm_durable(names.SEAT_OWNER, SEAT, UID),
        stream=STREAM,
        filter_subject=names.dm_filter(SPACE, names.SEAT_OWNER, SEAT),
        ack_wait_ms=60_000,
        max_ack_pending=1,
        creation_lower_bound=1,
        ack_floor=0,
        delivered=0,
        first_seq=1,
        last_seq=carried_n,
        start_seq=1,
    )
    with anyio.fail_after(120):
        done = await import_inbox(
            jb, SPACE, SEAT, UID, record, messages, attempt_id="attempt-1", shared=False
        )
    assert (done.start_seq, done.republished, done.duplicates) == (other + 1, carried_n, 0)
    here, again = await export_inbox(jb, SPACE, SEAT, UID)
    assert [m.seq for m in again] == list(range(other + 1, other + carried_n + 1))
    assert shape(again) == shape(messages)
    state = (await jb.stream_info(STREAM)).state
    assert state.messages <= limit
