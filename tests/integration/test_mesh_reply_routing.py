"""Whom a seat's reply goes to: a seat's send (the manager's publish, with `Cotal-Sender` naming
it) is answered to the operator and handed framed; any other principal on the broker (an
operator's own tool, as bench/move.py publishes) is answered to itself, unframed, as `cotal send`
is (real broker, real daemon, a real scribe seat)."""

from __future__ import annotations

import json

import anyio
import pytest

from protocol import names
from protocol.instant import now_iso
from protocol.messages import DirectMessage, encode
from tests.conftest import Cli
from tests.helpers import broker

pytestmark = pytest.mark.anyio


async def test_a_tool_on_the_broker_gets_its_reply_and_a_seats_claim_in_the_body_alone_is_no_seat(
    mesh: Cli,
) -> None:
    mesh.json("spawn", "b")
    async with broker(mesh.root) as js:
        nc = js._nc
        replies: list[DirectMessage] = []
        sub = await nc.subscribe(names.dm_subject("main", "local", "tool", "local", "b"))
        for i, headers in enumerate(({}, {"Cotal-Sender": "someone-else"})):
            dm = DirectMessage(
                f"tool-{i}-0123456789abcdef",
                "local.tool",
                "local.b",
                f"remember the phrase tool-phrase-{i}",
                now_iso(),
            )
            await js.publish(
                names.dm_subject("main", "local", "b", "local", "tool"),
                encode(dm),
                headers={"Nats-Msg-Id": dm.id, **headers},
            )
        with anyio.fail_after(60):
            async for msg in sub.messages:
                replies.append(DirectMessage(**_fields(json.loads(msg.data))))
                if len(replies) == 2:
                    break
        await sub.unsubscribe()
    # Answered to the tool itself, and handed as it was sent: no seat frame named "tool".
    assert [(r.in_reply_to, r.text) for r in replies] == [
        ("tool-0-0123456789abcdef", "Noted: tool-phrase-0."),
        ("tool-1-0123456789abcdef", "Noted: tool-phrase-1."),
    ]


def _fields(doc: dict[str, object]) -> dict[str, object]:
    keys = {"sentAt": "sent_at", "inReplyTo": "in_reply_to"}
    return {keys.get(k, k): v for k, v in doc.items()}
