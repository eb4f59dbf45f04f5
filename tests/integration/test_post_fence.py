"""A post passes the writer fence at the broker (issue 38, item 2), on a real nats-server.

Each holder writes a post marker of the seat's own in the channel stream when it takes custody;
every post names that marker as the last write on the marker's subject. Once a successor has
written its marker, the stale holder's post is refused by the broker itself (err_code 10071),
whatever id it carries, so it is never stored and never shadows the successor's post of the
same id; the stale holder's reads (history, roster) stop too. The marker outlives the channel's
age bound, so a holder that posts rarely is not fenced out by time.
"""

from __future__ import annotations

import anyio
import pytest
from nats.js.errors import NotFoundError

from manager.broker import channels
from manager.broker.fence import FencedOut, WriterFence
from protocol import meshcall, names
from tests.conftest import SharedBroker
from tests.helpers import broker_at

pytestmark = pytest.mark.anyio

SPACE = "postfence"


def _post(text: str) -> meshcall.ChannelPost:
    return meshcall.ChannelPost(
        id=meshcall.post_message_id("0" * 26, "inbound-1", 0),
        channel="plan",
        sender="w1",
        text=text,
        sent_at="2026-12-06T00:00:00.000Z",
    )


async def test_a_stale_holders_post_is_refused_by_the_broker_and_never_shadows(
    bare_broker: SharedBroker,
) -> None:
    async with broker_at(bare_broker.url, bare_broker.creds) as js:
        await channels.ensure_chan_stream(js, SPACE, history=10, max_age_s=2)
        stale = WriterFence(js, SPACE, "w1", names.mint_instance_id(), 0)
        await stale.establish_posts()
        await stale.confirm()
        successor = WriterFence(js, SPACE, "w1", names.mint_instance_id(), 1)
        await successor.establish_posts()

        # The very post the successor will make when it runs the same turn again.
        with pytest.raises(FencedOut) as refused:
            await channels.publish_post(js, SPACE, _post("stale copy"), publish=stale.post)
        assert refused.value.code == "fenced-out"
        assert "wrong last sequence" in refused.value.message
        with pytest.raises(FencedOut):
            await stale.confirm()

        seq = await channels.publish_post(js, SPACE, _post("holder's"), publish=successor.post)
        await successor.confirm()
        assert [p.text for p in await channels.history(js, SPACE, "plan", 10)] == ["holder's"]

        # The post ages out of the channel (max_age 2 s); the marker does not.
        with anyio.fail_after(15):
            while True:
                try:
                    await js.get_msg(names.chan_stream(SPACE), seq)
                except NotFoundError:
                    break
                await anyio.sleep(0.2)
        await successor.confirm()
        again = meshcall.ChannelPost(
            id="f" * 32,
            channel="plan",
            sender="w1",
            text="later",
            sent_at="2026-12-06T00:01:00.000Z",
        )
        assert await channels.publish_post(js, SPACE, again, publish=successor.post) > seq


async def test_a_post_before_the_marker_is_refused_not_published(
    bare_broker: SharedBroker,
) -> None:
    async with broker_at(bare_broker.url, bare_broker.creds) as js:
        await channels.ensure_chan_stream(js, SPACE + "2", history=10, max_age_s=60)
        fence = WriterFence(js, SPACE + "2", "w1", names.mint_instance_id(), 0)
        with pytest.raises(Exception) as refused:
            await channels.publish_post(js, SPACE + "2", _post("x"), publish=fence.post)
        assert getattr(refused.value, "code", None) == "not-ready"
        assert await channels.history(js, SPACE + "2", "plan", 10) == []
