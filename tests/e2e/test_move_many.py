"""Twenty moves of one seat, A->B->A..., while mail keeps coming (issue 24's test): no message is
lost or answered twice, and at every instant sampled at most one process carries the seat's
lifecycle uid; at the end exactly one does, at A, in the seat's own session."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import anyio
import pytest

from protocol import names
from protocol.instant import now_iso
from protocol.messages import DirectMessage, encode
from tests.conftest import Cli
from tests.e2e.test_move import seat_repo, two_roots  # noqa: F401  (the fixture)
from tests.helpers import broker, processes_mentioning, signer_key

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

MOVES = 20
SEND_EVERY_S = 0.1
SAMPLE_EVERY_S = 0.05


async def test_twenty_moves_lose_no_mail_and_never_run_the_seat_twice(
    two_roots: tuple[Cli, Cli],  # noqa: F811
) -> None:
    a, b = two_roots
    walker = a.json("spawn", "walker", "--agent", "scribe", "--cwd", str(seat_repo(a, "walker")))
    uid = walker["lifecycleUid"]
    to = {a.root: b.json("status")["instanceId"], b.root: walker["instanceId"]}
    a.run("trust", "add", signer_key(b.root), "--name", "host-b")
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")

    sent: list[str] = []
    samples: Counter[int] = Counter()
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples[len(processes_mentioning(uid))] += 1
            stop.wait(SAMPLE_EVERY_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    async with broker(a.root) as js:
        # A tool of the operator's on the broker, as `cotal send` publishes: answered to itself.
        inbox = names.dm_subject("main", "local", "walker", "local", "tool")
        replies = names.dm_subject("main", "local", "tool", "local", "walker")

        moved_all = anyio.Event()

        async def mail() -> None:
            # Stopped between publishes, never cancelled inside one: a publish the broker took
            # is always one this test counts.
            while not moved_all.is_set():
                dm = DirectMessage(
                    f"walk-{len(sent):04d}-{uid}", "local.tool", "local.walker", "ping", now_iso()
                )
                await js.publish(inbox, encode(dm), headers={"Nats-Msg-Id": dm.id})
                sent.append(dm.id)
                await anyio.sleep(SEND_EVERY_S)

        async with anyio.create_task_group() as tg:
            tg.start_soon(mail)
            here, there = a, b
            for _ in range(MOVES):
                moved = await anyio.to_thread.run_sync(
                    lambda src=here: src.json("move", "walker", "--to", to[src.root])
                )
                assert [s["lifecycleUid"] for s in moved["seats"]] == [uid]
                here, there = there, here
            moved_all.set()

        # Every message answered exactly once, in the stream as its inbox's reader sees it.
        answered: Counter[str] = Counter()
        with anyio.fail_after(120):
            while not set(sent) <= set(answered):
                answered = Counter()
                sub = await js.subscribe(replies, ordered_consumer=True)
                try:
                    while True:
                        try:
                            msg = await sub.next_msg(timeout=1)
                        except TimeoutError:
                            break
                        answered[json.loads(msg.data)["inReplyTo"]] += 1
                finally:
                    await sub.unsubscribe()
    stop.set()
    sampler.join()
    assert here is a
    assert set(answered) == set(sent) and max(answered.values()) == 1, answered.most_common(3)
    assert len(sent) > MOVES
    # Never two at once; and a sample saw it running, between moves.
    assert set(samples) <= {0, 1} and samples[1] > 0, samples
    rows = {r["name"]: r for r in a.ps()}
    assert (rows["walker"]["lifecycleUid"], rows["walker"]["sessionId"]) == (
        uid,
        walker["sessionId"],
    )
    assert processes_mentioning(uid) == [rows["walker"]["pid"]]
    assert [r["name"] for r in b.ps()] == []
    assert not Path(b.root / ".cotal/maintenance/v1/journal.json").exists()
