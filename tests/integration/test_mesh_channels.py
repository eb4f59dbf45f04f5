"""Channels end to end (real broker, real daemon, real scribe seats): a post reaches each
subscriber as a turn naming the channel and the poster, a seat not allowed to post is refused
and nothing is stored, the channel's history is bounded and never refuses a post, a subscriber
stopped during posts gets them at its start, and a seat's channel permissions travel in its
seat record, `ps --wide` and its resume entry's profile digest."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from manager import registry
from manager.broker import channels
from protocol import meshcall
from tests.conftest import Cli
from tests.helpers import ask, broker, refused, seat_events, stream_messages, wait_until

pytestmark = pytest.mark.anyio

STREAM = "CHAN_main"


def _plan(channel: str = "plan") -> str:
    return f"cotal.main.chan.{channel}"


async def _posts_on(cli: Cli, channel: str) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Every post the channel stream holds for `channel`: its body and its headers."""
    return await stream_messages(cli, STREAM, _plan(channel))


def _acked_posts(cli: Cli, seat: str) -> int:
    """How many of `seat`'s turns were posts it acknowledged."""
    turns = {e["id"] for e in seat_events(cli, seat, "delivery.received") if e.get("channel")}
    return sum(1 for e in seat_events(cli, seat, "delivery.acked") if e["id"] in turns)


async def test_a_post_reaches_the_subscriber_naming_channel_and_poster(mesh: Cli) -> None:
    spawned = mesh.json("spawn", "b", "--subscribe", "plan")
    assert spawned["subscribe"] == ["plan"]
    mesh.json("spawn", "a", "--allow-post", "#plan")
    mesh.json("spawn", "c", "--allow-post", "review")
    rows = {r["name"]: r for r in mesh.ps()}
    assert rows["a"]["allowPost"] == ["plan"] and rows["b"]["subscribe"] == ["plan"]
    wide = mesh.run("ps", "--wide").stdout
    assert "SUBSCRIBES" in wide and "POSTS TO" in wide and "#plan" in wide

    assert ask(mesh, "a", "Post to #plan: remember the phrase amber-kettle-12") == (
        "Posted to #plan: delivered."
    )
    [(body, headers)] = await _posts_on(mesh, "plan")
    assert (body["sender"], body["channel"]) == ("a", "plan")
    assert headers["Cotal-Sender"] == "a"
    await wait_until(lambda: _acked_posts(mesh, "b") == 1, timeout=30)
    [got] = [e for e in seat_events(mesh, "b", "delivery.received") if e.get("channel")]
    assert (got["sender"], got["channel"]) == ("a", "plan")
    # The frame named both: scribe recalls who posted it and where.
    assert ask(mesh, "b", "what was the phrase?") == (
        "The phrase is amber-kettle-12, from a on #plan."
    )
    # b's answer to the post went to the operator, keyed by b's own turn for it.
    turn = meshcall.post_turn_id(rows["b"]["lifecycleUid"], body["id"])
    replies = {}
    async with broker(mesh.root) as js:
        info = await js.stream_info("DM_main")
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg("DM_main", seq)
            if msg.subject == "cotal.main.inst.local.operator.local.b":
                reply = json.loads(msg.data or b"{}")
                replies[reply["inReplyTo"]] = reply["text"]
            assert msg.subject != "cotal.main.inst.local.a.local.b"
    assert replies[turn] == "Noted: amber-kettle-12 (from a on #plan)."

    # c may post to #review only: refused by code, and #plan holds nothing more.
    reply = ask(mesh, "c", "Post to #plan: remember the phrase stolen-key-9")
    assert reply.startswith("Could not post to #plan: refused post-not-allowed: seat c may not")
    assert len(await _posts_on(mesh, "plan")) == 1
    [logged] = seat_events(mesh, "c", "mesh.send_refused")
    assert logged["code"] == "post-not-allowed"
    assert ask(mesh, "b", "what was the phrase?") == (
        "The phrase is amber-kettle-12, from a on #plan."
    )
    # A bad channel name is refused at the spawn; the seat is not made.
    bad = mesh.run("spawn", "e", "--subscribe", "a.b", "--json", check=False)
    assert "a.b" in refused(bad, "bad-name")
    assert "e" not in {r["name"] for r in mesh.ps()}


async def test_a_subscriber_stopped_during_posts_gets_them_at_its_start(mesh: Cli) -> None:
    mesh.json("spawn", "b", "--subscribe", "plan")
    mesh.json("spawn", "a", "--allow-post", "plan")
    mesh.json("stop", "b")
    reply = ask(
        mesh, "a", "Post to #plan: first\nPost to #plan: remember the phrase quiet-harbor-3"
    )
    assert reply == "Posted to #plan: delivered.\nPosted to #plan: delivered."
    assert seat_events(mesh, "b", "delivery.received") == []

    mesh.json("start", "b")
    await wait_until(lambda: _acked_posts(mesh, "b") == 2, timeout=30)
    senders = [
        (e["sender"], e["channel"])
        for e in seat_events(mesh, "b", "delivery.received")
        if e.get("channel")
    ]
    assert senders == [("a", "plan"), ("a", "plan")]
    assert ask(mesh, "b", "what was the phrase?") == (
        "The phrase is quiet-harbor-3, from a on #plan."
    )
    # The seat record keeps the subscription for a manager started after a crash.
    [record] = [
        json.loads(p.read_text()) for p in (mesh.root / ".cotal" / "seats").glob("b-*.json")
    ]
    assert record["subscribe"] == ["plan"] and record["allowPost"] == []


async def test_history_is_bounded_and_never_refuses_a_post(mesh: Cli) -> None:
    mesh.run("down")
    (mesh.root / "cotal.toml").write_text("[channels]\nhistory = 100\n")
    mesh.run("up", "--detach")
    mesh.json("spawn", "b", "--subscribe", "plan")
    mesh.json("spawn", "a", "--allow-post", "plan")
    async with broker(mesh.root) as js:
        info = await js.stream_info(STREAM)
        assert info.config.max_msgs_per_subject == 100
        with anyio.fail_after(120):
            for n in range(10_000):
                post = meshcall.ChannelPost(
                    id=meshcall.post_message_id("0" * 26, "f" * 32, n),
                    channel="plan",
                    sender="a",
                    text=f"post {n}",
                    sent_at="2026-12-03T18:00:00.000Z",
                )
                assert await channels.publish_post(js, "main", post) > 0
        # The channel's 100, and the post marker of each of the two seats (its writer fence).
        info = await js.stream_info(STREAM)
        assert info.state.messages == 100 + 2
        # A seat's own post is still taken after all that, and the history read shows the end.
        assert ask(mesh, "a", "Post to #plan: the last word") == "Posted to #plan: delivered."
        info = await js.stream_info(STREAM)
        assert info.state.messages == 100 + 2
        recent = await channels.history(js, "main", "plan", 3)
        assert [p.text for p in recent] == ["post 9998", "post 9999", "the last word"]
        assert recent[-1].sender == "a"


async def test_the_permissions_are_part_of_the_profile(mesh: Cli) -> None:
    """A destination's cotal.toml cannot widen them: the digest covers each list, and a seat
    without them hashes as one did before channels existed."""
    plain = registry.profile_digest("scribe", None, {})
    assert registry.profile_digest("scribe", None, {}, (), (), ()) == plain
    subscribed = registry.profile_digest("scribe", None, {}, (), ["plan"], ())
    posting = registry.profile_digest("scribe", None, {}, (), (), ["plan"])
    assert len({plain, subscribed, posting}) == 3
    mesh.json("spawn", "b", "--subscribe", "plan", "--allow-post", "review")
    [row] = mesh.ps()
    assert (row["subscribe"], row["allowPost"]) == (["plan"], ["review"])


async def test_the_channel_streams_duplicate_window_is_the_recency_horizon(mesh: Cli) -> None:
    """A turn run again after a cut posts the same ids: the broker drops them within the
    recency horizon, as it drops a seat's sends, and never narrows a wider window."""
    async with broker(mesh.root) as js:
        info = await js.stream_info("CHAN_main")
        assert info.config.duplicate_window == 24 * 3600
        assert info.config.max_msgs_per_subject == 100
