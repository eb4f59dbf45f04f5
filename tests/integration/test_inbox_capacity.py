"""A seat's inbox holds what one sender queues for it, up to what a checkpoint carries and past
the per-subject cap the DM stream once had: nothing is discarded to make room (real broker)."""

from __future__ import annotations

import anyio
import pytest
from nats.js import JetStreamContext, api

from manager.broker.footprint import DM_MAX_BYTES, DM_MAX_MSGS, ensure_dm_stream
from protocol import names

pytestmark = pytest.mark.anyio

SPACE = "main"
SUBJECT = f"cotal.{SPACE}.inst.local.s1.local.operator"
QUEUED = 1_500


async def _publish(js: JetStreamContext, n: int) -> None:
    async def one(i: int) -> None:
        ack = await js.publish(SUBJECT, f"m{i}".encode(), stream=names.dm_stream(SPACE))
        assert not ack.duplicate

    # Batches keep the broker's pending acks bounded while still not paying a round trip each.
    for start in range(0, n, 250):
        async with anyio.create_task_group() as tg:
            for i in range(start, min(start + 250, n)):
                tg.start_soon(one, i)


async def _subject_count(js: JetStreamContext) -> int:
    info = await js.stream_info(names.dm_stream(SPACE), subjects_filter=SUBJECT)
    return (info.state.subjects or {}).get(SUBJECT, 0)


async def test_one_sender_queues_past_the_old_cap_and_nothing_is_discarded(
    js: JetStreamContext,
) -> None:
    await ensure_dm_stream(js, SPACE)
    await _publish(js, QUEUED)
    info = await js.stream_info(names.dm_stream(SPACE))
    assert info.state.messages == QUEUED and info.state.first_seq == 1
    assert await _subject_count(js) == QUEUED
    first = await js.get_msg(names.dm_stream(SPACE), seq=1)
    assert first.data == b"m0"


async def test_a_stream_made_with_the_old_limits_is_updated_in_place(
    js: JetStreamContext,
) -> None:
    stream = names.dm_stream(SPACE)
    await js.add_stream(
        api.StreamConfig(
            name=stream,
            subjects=[names.dm_stream_subjects(SPACE)],
            retention=api.RetentionPolicy.LIMITS,
            discard=api.DiscardPolicy.OLD,
            storage=api.StorageType.FILE,
            max_msgs_per_subject=1000,
            duplicate_window=120.0,
            num_replicas=1,
        )
    )
    await _publish(js, 10)
    await ensure_dm_stream(js, SPACE)
    config = (await js.stream_info(stream)).config
    assert config.discard == api.DiscardPolicy.NEW
    assert config.max_msgs_per_subject == -1
    assert config.max_msgs == DM_MAX_MSGS and config.max_bytes == DM_MAX_BYTES
    # What it held before the update is still there, and the old cap no longer trims.
    await _publish(js, QUEUED)
    assert await _subject_count(js) == QUEUED + 10
    # Idempotent: a second start finds nothing to change.
    await ensure_dm_stream(js, SPACE)
    assert (await js.stream_info(stream)).state.messages == QUEUED + 10


async def test_a_full_stream_refuses_the_publish_the_sender_sees(js: JetStreamContext) -> None:
    stream = names.dm_stream(SPACE)
    await ensure_dm_stream(js, SPACE)
    config = (await js.stream_info(stream)).config
    config.max_msgs = 5
    await js.update_stream(config)
    await _publish(js, 5)
    with pytest.raises(Exception, match="maximum messages exceeded"):
        await js.publish(SUBJECT, b"one too many", stream=stream)
    assert (await js.get_msg(stream, seq=1)).data == b"m0"
