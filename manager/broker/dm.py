"""Direct messages into a seat's inbox: one publish path for the operator and for a seat."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping

from nats.js import JetStreamContext

from manager.broker import retention
from manager.broker.retry import riding_elections
from protocol import names
from protocol.messages import DirectMessage, encode


def new_message_id() -> str:
    return uuid.uuid4().hex


async def publish_dm(
    js: JetStreamContext,
    space: str,
    dm: DirectMessage,
    publish: Callable[[str, bytes, dict[str, str]], Awaitable[int]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> int:
    """Publish a DM; `publish` is the writer fence when the sender is a seat; `headers` go with
    it (the sender's name, `protocol.meshcall.SENDER_HEADER`).

    A stream full of acknowledged mail is trimmed and the publish tried again; one full of
    mail not yet acknowledged refuses `dm-stream-full` (manager/broker/retention.py).
    """
    owner, actor = dm.recipient.split(".", 1)
    sender_owner, sender_actor = dm.sender.split(".", 1)
    subject = names.dm_subject(space, owner, actor, sender_owner, sender_actor)
    sent_with = {**(headers or {}), "Nats-Msg-Id": dm.id}
    payload = encode(dm)

    async def once() -> int:
        if publish is not None:
            return await publish(subject, payload, sent_with)
        # A retry after a lost answer is deduplicated by the message id.
        ack = await riding_elections(
            f"publish to {dm.recipient}", lambda: js.publish(subject, payload, headers=sent_with)
        )
        return int(ack.seq)

    seq = await retention.with_room(js, space, once)
    await retention.after_publish(js, space, seq)
    return seq
