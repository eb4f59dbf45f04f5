"""A subscriber's channel frontiers travel with it to another broker (issue 25, item 5): the
posts above its ack floor in each channel are carried and rebuilt on a subject of its own at
the destination, where the channel's other subscribers never see them; on the broker the
checkpoint was cut from, the durable is left in place. Real brokers, real processes."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from manager.broker import channels, frontier
from manager.broker.footprint import ensure_dm_durable, ensure_dm_stream
from manager.broker.space import Imported
from manager.checkpoint.reader import read_seat_checkpoint
from protocol import meshcall, names
from protocol.checkpoint import (
    CHECKPOINT_FILE,
    ChannelExport,
    ChannelState,
    FileRef,
    decode_inbox,
    decode_seat_checkpoint,
)
from protocol.codec import encode_json
from protocol.errors import DecodeError, Refusal
from tests.conftest import Cli
from tests.e2e.test_space_travels import Broker, js_at, two_brokers  # noqa: F401  (the fixture)
from tests.gitrepo import committed_repo
from tests.helpers import (
    broker,
    carry_to_new_host,
    post_turns_acked,
    refused,
    wait_until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SPACE = "main"
HISTORY, MAX_AGE_S = 100, 3600


def _post(n: int, text: str) -> meshcall.ChannelPost:
    return meshcall.ChannelPost(
        id=meshcall.post_message_id("0" * 26, f"{n:032x}", 0),
        channel="plan",
        sender="a",
        text=text,
        sent_at="2026-12-04T04:00:00.000Z",
    )


async def _subscribe(js: JetStreamContext, seat: str, uid: str) -> None:
    await channels.ensure_chan_stream(js, SPACE, history=HISTORY, max_age_s=MAX_AGE_S)
    await channels.ensure_chathist_durable(js, SPACE, names.SEAT_OWNER, seat, uid, "plan")


async def _take(
    js: JetStreamContext, seat: str, uid: str, n: int, *, hold_last: bool = False
) -> list[str]:
    """The texts of the next `n` posts the seat's frontier hands out, each acknowledged as the
    delivery bridge does at its turn's end; with `hold_last`, the last is left in flight, as a
    turn the cut stopped leaves it."""
    psub = await js.pull_subscribe_bind(
        durable=names.chathist_durable(names.SEAT_OWNER, seat, uid, "plan"),
        stream=names.chan_stream(SPACE),
    )
    texts: list[str] = []
    try:
        for i in range(n):
            [msg] = await psub.fetch(1, timeout=5.0)
            texts.append(meshcall.decode_post(msg.data).text)
            if not (hold_last and i == n - 1):
                await msg.ack_sync()
    finally:
        await psub.unsubscribe()
    return texts


async def _pending(js: JetStreamContext, seat: str, uid: str) -> int:
    info = await js.consumer_info(
        names.chan_stream(SPACE), names.chathist_durable(names.SEAT_OWNER, seat, uid, "plan")
    )
    return int(info.num_pending or 0) + int(info.num_ack_pending or 0)


def _state(export: ChannelExport) -> ChannelState:
    return ChannelState(
        channel=export.channel,
        durable=export.durable,
        messages=len(export.messages),
        message_bytes=sum(m.payload_bytes() for m in export.messages),
        posts=FileRef(file="chan-plan.jsonl", bytes=0, sha256="0" * 64),
    )


async def _import(
    js: JetStreamContext, seat: str, uid: str, export: ChannelExport, attempt: str
) -> Imported:
    return await frontier.import_frontier(
        js,
        SPACE,
        seat,
        uid,
        _state(export),
        export.messages,
        attempt_id=attempt,
        shared=False,
        history=HISTORY,
        max_age_s=MAX_AGE_S,
    )


async def test_a_frontier_is_carried_to_another_broker_on_the_seats_own_subject(
    two_brokers: tuple[Broker, Broker],  # noqa: F811
) -> None:
    a, b = two_brokers
    uid_b, uid_c = names.mint_lifecycle_uid(), names.mint_lifecycle_uid()
    room = (10_000, 64 * 1024 * 1024)
    async with js_at(a) as ja, js_at(b) as jb:
        for seat, uid in (("b", uid_b), ("c", uid_c)):
            await _subscribe(ja, seat, uid)
        for n, text in enumerate(("p0", "p1", "p2")):
            await channels.publish_post(ja, SPACE, _post(n, text))
        # b read p0 and is mid-turn on p1 at the cut; c read nothing.
        assert await _take(ja, "b", uid_b, 2, hold_last=True) == ["p0", "p1"]
        got_b = await frontier.export_frontier(ja, SPACE, "b", uid_b, "plan", room=room)
        got_c = await frontier.export_frontier(ja, SPACE, "c", uid_c, "plan", room=room)
        assert got_b is not None and got_c is not None
        assert got_b.durable.ack_floor == 1 and got_b.durable.start_seq == 2
        assert [meshcall.decode_post(m.data()).text for m in got_b.messages] == ["p1", "p2"]
        assert {m.subject for m in got_b.messages} == {"cotal.main.chan.plan"}
        post_ids = [meshcall.decode_post(m.data()).id for m in got_b.messages]
        assert [m.msg_id for m in got_b.messages] == [
            meshcall.carried_post_id(uid_b, p) for p in post_ids
        ]
        assert len(got_c.messages) == 3
        assert await _pending(ja, "b", uid_b) == 2  # the export moved no frontier
        absent = await frontier.export_frontier(
            ja, SPACE, "d", names.mint_lifecycle_uid(), "plan", room=room
        )
        assert absent is None

        # B's own channel of that name: one post before the seats arrive, its subscriber z.
        await channels.ensure_chan_stream(jb, SPACE, history=HISTORY, max_age_s=MAX_AGE_S)
        uid_z = names.mint_lifecycle_uid()
        await _subscribe(jb, "z", uid_z)
        await channels.publish_post(jb, SPACE, _post(10, "before-arrival"))
        done = await _import(jb, "b", uid_b, got_b, "at-1")
        assert (done.kept, done.republished, done.duplicates) == (False, 2, 0)
        again = await _import(jb, "b", uid_b, got_b, "at-1")
        assert again.kept
        other = await _import(jb, "b", uid_b, got_b, "at-2")
        assert (other.kept, other.duplicates, other.start_seq) == (False, 2, done.start_seq)
        # The same posts carried for c are c's own messages, not duplicates of b's.
        done_c = await _import(jb, "c", uid_c, got_c, "at-1")
        assert (done_c.republished, done_c.duplicates) == (3, 0)
        await channels.publish_post(jb, SPACE, _post(11, "after-arrival"))

        assert await _take(jb, "b", uid_b, 1) == ["p1"]
        assert await _pending(jb, "b", uid_b) == 2
        assert await _take(jb, "c", uid_c, 4) == ["p0", "p1", "p2", "after-arrival"]
        # z, the destination's own subscriber, sees its channel and nothing carried.
        assert await _take(jb, "z", uid_z, 2) == ["before-arrival", "after-arrival"]
        assert await _pending(jb, "z", uid_z) == 0
        assert [p.text for p in await channels.history(jb, SPACE, "plan", 20)] == [
            "before-arrival",
            "after-arrival",
        ]

        # The next leg, back to A: b's frontier at B reads both subjects, and travels as the
        # channel's; A's durable of the first leg is stale and is replaced.
        back = await frontier.export_frontier(jb, SPACE, "b", uid_b, "plan", room=room)
        assert back is not None
        assert [meshcall.decode_post(m.data()).text for m in back.messages] == [
            "p2",
            "after-arrival",
        ]
        assert {m.subject for m in back.messages} == {"cotal.main.chan.plan"}
        home = await _import(ja, "b", uid_b, back, "at-3")
        assert (home.kept, home.republished) == (False, 2)
        assert await _take(ja, "b", uid_b, 2) == ["p2", "after-arrival"]
        assert await _pending(ja, "b", uid_b) == 0

        # A subscriber removed at B takes its carried posts with it.
        carried = names.chan_carried_subject(SPACE, "plan", uid_c)
        await channels.delete_chathist_durable(jb, SPACE, names.SEAT_OWNER, "c", uid_c, "plan")
        info = await jb.stream_info(names.chan_stream(SPACE), subjects_filter=carried)
        assert (info.state.subjects or {}).get(carried, 0) == 0


async def test_the_frontier_and_the_inbox_share_one_cap(
    two_brokers: tuple[Broker, Broker],  # noqa: F811
) -> None:
    a, _ = two_brokers
    uid = names.mint_lifecycle_uid()
    async with js_at(a) as ja:
        await _subscribe(ja, "b", uid)
        for n in range(3):
            await channels.publish_post(ja, SPACE, _post(n, f"p{n}"))
        with pytest.raises(Refusal) as caught:
            await frontier.export_frontier(ja, SPACE, "b", uid, "plan", room=(2, 1 << 20))
        assert caught.value.code == "inbox-too-large"
        assert "its inbox and channels hold more than 2 posts by #plan" in caught.value.message
        # The refused read left no reader of its own behind at the broker.
        info = await ja.stream_info(names.chan_stream(SPACE))
        assert info.state.consumer_count == 1


async def test_a_cut_that_cannot_carry_a_frontier_refuses_before_anything_stops(
    two_brokers: tuple[Broker, Broker],  # noqa: F811
) -> None:
    a, _ = two_brokers
    uid = names.mint_lifecycle_uid()
    async with js_at(a) as ja:
        await ensure_dm_stream(ja, SPACE)
        await ensure_dm_durable(ja, SPACE, names.SEAT_OWNER, "b", uid)
        await channels.ensure_chan_stream(ja, SPACE, history=20_000, max_age_s=MAX_AGE_S)
        await channels.ensure_chathist_durable(ja, SPACE, names.SEAT_OWNER, "b", uid, "plan")
        await frontier.check_seat_exportable(ja, SPACE, "b", uid, ["plan"])
        acks = [
            await ja.publish_async(
                "cotal.main.chan.plan", encode_json(_post(n, f"p{n}")), stream="CHAN_main"
            )
            for n in range(10_001)
        ]
        await asyncio.gather(*acks)
        with pytest.raises(Refusal) as caught:
            await frontier.check_seat_exportable(ja, SPACE, "b", uid, ["plan"])
        assert caught.value.code == "inbox-too-large"
        assert "its inbox and channels hold 10001 messages by #plan" in caught.value.message


def _received(cli: Cli, seat: str) -> set[str]:
    """The ids of the messages the seat's bridge has handed it (`cotal logs SEAT --json`)."""
    lines = cli.run("logs", seat, "--json").stdout.splitlines()
    return {e["id"] for e in map(json.loads, lines) if e.get("event") == "delivery.received"}


async def test_an_unread_post_reaches_its_subscriber_on_a_host_that_shares_nothing(
    tmp_path: Path, cli: Cli
) -> None:
    cwd = cli.root / "proj"
    committed_repo(cwd)
    cli.run("up", "--detach")
    cli.json("spawn", "b", "--cwd", str(cwd), "--subscribe", "plan")
    cli.json("spawn", "a", "--cwd", str(cwd), "--allow-post", "plan")
    uid_b = {r["name"]: r for r in cli.ps()}["b"]["lifecycleUid"]
    # b is held in a slow turn (its bridge takes one message at a time), so a's post is still
    # above its frontier when the cut fences; the cut's drain aborts the turn, which runs
    # again, as slowly, at the destination before the post's turn.
    slow = cli.json("send", "b", "#slow:15000 take your time")
    await wait_until(lambda: slow["id"] in _received(cli, "b"), timeout=60)
    told = cli.json("send", "a", "Post to #plan: remember the phrase carried-post-9", "--wait")
    assert told["reply"] == "Posted to #plan: delivered."
    async with broker(cli.root) as js:
        durable = names.chathist_durable("local", "b", uid_b, "plan")
        info = await js.consumer_info("CHAN_main", durable)
        assert info.num_pending == 1
    cut = json.loads(cli.run("down", "--preserve-state", "--drain-timeout", "2", "--json").stdout)
    assert cut["failures"] == [], cut
    attempt = Path(cut["checkpointDir"])
    record = read_seat_checkpoint(attempt / "b")
    assert record.space_state is not None
    [state] = record.space_state.channels
    assert (state.channel, state.messages) == ("plan", 1)
    [carried] = decode_inbox((attempt / "b" / "chan-plan.jsonl").read_bytes(), state)
    assert b"carried-post-9" in carried.data()
    # A record naming another seat's frontier, or a channel the entry does not subscribe, is
    # not a record: the signature is never even reached.
    sealed = json.loads((attempt / "b" / CHECKPOINT_FILE).read_text())
    for field, value, why in (
        ("name", names.chathist_durable("local", "a", uid_b, "plan"), "is not this seat's"),
        ("channel", "review", "chan-review.jsonl"),
    ):
        forged = json.loads(json.dumps(sealed))
        [entry] = forged["spaceState"]["channels"]
        if field == "name":
            entry["durable"]["name"] = value
        else:
            entry["channel"] = value
        with pytest.raises(DecodeError) as caught:
            decode_seat_checkpoint(json.dumps(forged).encode())
        assert why in caught.value.message
    copy = carry_to_new_host(cli.root, attempt, tmp_path)
    damaged = tmp_path / "damaged" / copy.name
    shutil.copytree(copy, damaged)
    posts = damaged / "b" / "chan-plan.jsonl"
    posts.write_bytes(posts.read_bytes().replace(b'"seq"', b'"Seq"'))
    denied = cli.run("up", "--restore", str(damaged), "--json", check=False)
    assert "chan-plan.jsonl" in refused(denied, "integrity")

    out = json.loads(cli.run("up", "--restore", str(copy), "--json").stdout)
    assert out["sharedBroker"] is False
    [row] = [r for r in out["inbox"] if r["name"] == "b"]
    assert [(c["channel"], c["kept"], c["republished"]) for c in row["channels"]] == [
        ("plan", False, 1)
    ]
    await wait_until(lambda: post_turns_acked(cli, "b") == 1, timeout=60)
    reply = cli.json("send", "b", "what was the phrase?", "--wait")["reply"]
    assert reply == "The phrase is carried-post-9, from a on #plan."
    async with broker(cli.root) as js:
        info = await js.consumer_info("CHAN_main", durable)
        assert info.config.filter_subjects == [
            "cotal.main.chan.plan",
            names.chan_carried_subject("main", "plan", uid_b),
        ]
        assert (info.num_pending, info.num_ack_pending) == (0, 0)
    cli.run("down")
