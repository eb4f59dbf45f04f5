"""A write of ours whose ack was lost is ours: the fence recognises it by its writer token and
carries on, while a successor's write (even one made as the same root) still fences us out."""

from __future__ import annotations

import pytest

from manager.broker.fence import EXPECT_SEQ, EXPECT_SUBJECT, HOLDER, WRITER, FencedOut, WriterFence
from manager.broker.footprint import ensure_dm_stream
from protocol import names
from tests.conftest import SharedBroker
from tests.helpers import broker_at

pytestmark = pytest.mark.anyio

SUBJECT = "cotal.lost.inst.local.operator.local.w1"


async def test_a_write_that_landed_without_its_ack_is_recognised(
    bare_broker: SharedBroker,
) -> None:
    async with broker_at(bare_broker.url, bare_broker.creds) as js:
        await ensure_dm_stream(js, "lost")
        holder = names.mint_instance_id()
        fence = WriterFence(js, "lost", "w1", holder, 0)
        marker = await fence.establish()
        # What a publish whose ack never came back leaves: the write stored, our expectation
        # still at the marker.
        landed = await js.publish(
            SUBJECT,
            b"first",
            headers={
                "Nats-Msg-Id": "m-first",
                EXPECT_SEQ: str(marker),
                EXPECT_SUBJECT: fence.filter,
                HOLDER: holder,
                WRITER: fence.writer,
            },
        )
        assert fence.last_seq == marker
        # The very message again (its retry after the reconnect): the stored one, not a copy.
        assert await fence.publish(SUBJECT, b"first", {"Nats-Msg-Id": "m-first"}) == landed.seq
        # The next message goes out behind it.
        second = await fence.publish(SUBJECT, b"second", {"Nats-Msg-Id": "m-second"})
        assert second == landed.seq + 1 and fence.last_seq == second
        last = await js.get_last_msg(names.dm_stream("lost"), fence.filter)
        assert (last.seq, last.data) == (second, b"second")


async def test_a_successor_as_the_same_root_still_fences_out(bare_broker: SharedBroker) -> None:
    async with broker_at(bare_broker.url, bare_broker.creds) as js:
        await ensure_dm_stream(js, "lost")
        holder = names.mint_instance_id()
        stale = WriterFence(js, "lost", "w2", holder, 0)
        await stale.establish()
        # A manager restarted at the same root: the same holder id, its own writer.
        successor = WriterFence(js, "lost", "w2", holder, 1)
        marker = await successor.establish()
        with pytest.raises(FencedOut):
            await stale.publish(
                "cotal.lost.inst.local.operator.local.w2", b"stale", {"Nats-Msg-Id": "m-stale"}
            )
        last = await js.get_last_msg(names.dm_stream("lost"), successor.filter)
        assert last.seq == marker
