"""The DM stream never fills with acknowledged mail (issue 22, item 3): with its limit lowered
by COTAL_DM_MAX_MSGS, ten times that much mail acknowledged by a real scribe seat never refuses
a new message; unacknowledged mail still counts and a full stream refuses by name; a cut after
the trims carries exactly the unacknowledged mail and a resume delivers it; a stream made the
old way is trimmed in place by the manager's start. Real broker, real daemon, real seats."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import anyio
import nats
import pytest
from nats.js import JetStreamContext, api

from manager.broker.dm import publish_dm
from manager.broker.fence import FencedOut, WriterFence, marker_subject
from manager.broker.footprint import ensure_dm_durable, ensure_dm_stream
from manager.broker.retention import MARKER_TOKEN, trim_acknowledged
from manager.checkpoint.reader import read_seat_checkpoint
from manager.control.client import ControlClient
from manager.workspace.layout import Layout
from protocol import names
from protocol.checkpoint import INBOX_FILE, decode_inbox
from protocol.errors import Refusal
from protocol.messages import DirectMessage, decode_dm
from tests.cluster import Cluster
from tests.conftest import Cli, SharedBroker
from tests.gitrepo import git, init_repo, write
from tests.helpers import broker, broker_at, carry_to_new_host

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SPACE = "main"
STREAM = names.dm_stream(SPACE)
N = 16
LIMIT = {"COTAL_DM_MAX_MSGS": str(N)}


def committed_root(root: Path) -> None:
    init_repo(root)
    write(root / "f.txt", "x\n")
    git(root, "add", "f.txt")
    git(root, "commit", "-q", "-m", "one")


async def client(cli: Cli) -> ControlClient:
    layout = Layout.at(cli.root)
    return await ControlClient.connect(layout.socket, layout.control_token.read_text().strip())


async def durable(js: JetStreamContext, seat: str, uid: str) -> api.ConsumerInfo:
    info: api.ConsumerInfo = await js.consumer_info(STREAM, names.dm_durable("local", seat, uid))
    return info


async def drained(js: JetStreamContext, seat: str, uid: str, timeout: float = 60.0) -> None:
    with anyio.fail_after(timeout):
        while True:
            info = await durable(js, seat, uid)
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
            await anyio.sleep(0.05)


async def acknowledged_sends(c: ControlClient, js: JetStreamContext, count: int) -> int:
    """`count` messages, each answered and acknowledged; the most the stream held meanwhile."""
    highest = 0
    for i in range(count):
        reply = await c.call(
            "send", {"name": "s1", "text": f"Remember the phrase p-{i}", "wait": True}
        )
        assert reply["reply"] == f"Noted: p-{i}.", reply
        highest = max(highest, (await js.stream_info(STREAM)).state.messages)
    return highest


# -- the rules, against the broker itself -------------------------------------------------------


def dm(sender: str, recipient: str, text: str) -> DirectMessage:
    return DirectMessage(
        id=f"{sender}-{recipient}-{text}",
        sender=f"local.{sender}",
        recipient=f"local.{recipient}",
        text=text,
        sent_at="2026-01-01T00:00:00.000Z",
    )


async def subjects(js: JetStreamContext) -> dict[str, int]:
    info = await js.stream_info(STREAM, subjects_filter=names.dm_stream_subjects(SPACE))
    return dict(info.state.subjects or {})


async def test_the_trim_keeps_the_writer_fence_and_every_unacknowledged_message(
    js: JetStreamContext,
) -> None:
    await fence_and_trim(js, replicas=1)


async def test_the_trim_holds_on_a_three_node_cluster_with_three_replicas(
    nats_cluster: Cluster,
) -> None:
    nc = await nats.connect(nats_cluster.urls.split(","), nkeys_seed=nats_cluster.creds)
    try:
        js = nc.jetstream()
        await fence_and_trim(js, replicas=3)
        assert (await js.stream_info(STREAM)).config.num_replicas == 3
    finally:
        await nc.close()


async def fence_and_trim(js: JetStreamContext, *, replicas: int) -> None:
    await ensure_dm_stream(js, SPACE, replicas=replicas)
    uid = names.mint_lifecycle_uid()
    await ensure_dm_durable(js, SPACE, "local", "s1", uid)
    psub = await js.pull_subscribe_bind(durable=names.dm_durable("local", "s1", uid), stream=STREAM)
    holder = WriterFence(js, SPACE, "s1", "instance-a", 0)
    await holder.establish()
    for i in range(12):
        await publish_dm(js, SPACE, dm("operator", "s1", f"ask-{i}"))
        [msg] = await psub.fetch(1, timeout=5)
        await publish_dm(js, SPACE, dm("s1", "operator", f"reply-{i}"), publish=holder.publish)
        await msg.ack_sync()
        # Trimmed after every turn: the seat's last reply is what its fence expects.
        await trim_acknowledged(js, SPACE)
    # Queued and never delivered: the trim leaves every one of them.
    for i in range(3):
        await publish_dm(js, SPACE, dm("operator", "s1", f"queued-{i}"))
    # A seat inbox no durable reads (a resume republishes before it creates the durable).
    for i in range(4):
        await publish_dm(js, SPACE, dm("operator", "ghost", f"carried-{i}"))
    await trim_acknowledged(js, SPACE)
    held = await subjects(js)
    assert held == {
        # Acknowledged and no longer its subject's last: gone; the three queued: kept.
        f"cotal.{SPACE}.inst.local.s1.local.operator": 3,
        f"cotal.{SPACE}.inst.local.operator.local.s1": 1,
        f"cotal.{SPACE}.inst.local.ghost.local.operator": 4,
        marker_subject(SPACE, "local", "s1", 0): 1,
    }
    assert marker_subject(SPACE, "local", "s1", 0).split(".")[3] == MARKER_TOKEN
    queued = [decode_dm(m.data).text for m in await acked(psub, 3)]
    assert queued == ["queued-0", "queued-1", "queued-2"]
    # The holder still writes; a newer holder's marker still fences it out, after trims too.
    await publish_dm(js, SPACE, dm("s1", "operator", "still-mine"), publish=holder.publish)
    successor = WriterFence(js, SPACE, "s1", "instance-b", 1)
    await successor.establish()
    await trim_acknowledged(js, SPACE)
    with pytest.raises(FencedOut):
        await publish_dm(js, SPACE, dm("s1", "operator", "stale"), publish=holder.publish)
    for i in range(3):
        await publish_dm(js, SPACE, dm("s1", "operator", f"new-{i}"), publish=successor.publish)
        await trim_acknowledged(js, SPACE)
    assert (await subjects(js))[f"cotal.{SPACE}.inst.local.operator.local.s1"] == 1


async def acked(psub: Any, count: int) -> list[Any]:
    """`count` deliveries, each acknowledged before the next (the durable admits one)."""
    out: list[Any] = []
    while len(out) < count:
        [msg] = await psub.fetch(1, timeout=5)
        await msg.ack_sync()
        out.append(msg)
    return out


# -- a real mesh --------------------------------------------------------------------------------


async def test_ten_times_the_limit_of_acknowledged_mail_never_refuses_one(cli: Cli) -> None:
    cli.run("up", "--detach", env=LIMIT)
    row = cli.json("spawn", "s1", "--agent", "scribe")
    c = await client(cli)
    async with c, broker(cli.root) as js:
        config = (await js.stream_info(STREAM)).config
        assert config.max_msgs == N and config.retention == api.RetentionPolicy.LIMITS
        highest = await acknowledged_sends(c, js, 10 * N)
        info = await js.stream_info(STREAM)
        # Each send is a message and its reply: twenty times the limit went through the stream.
        assert info.state.last_seq > 20 * N
        assert highest <= N and info.state.messages <= N
        seat = await durable(js, "s1", row["lifecycleUid"])
        assert seat.num_pending == 0 and seat.num_ack_pending == 0
        assert seat.delivered.consumer_seq == seat.ack_floor.consumer_seq == 10 * N
        reply = await c.call("send", {"name": "s1", "text": "What was the phrase?", "wait": True})
        assert reply["reply"] == f"The phrase is p-{10 * N - 1}."
    cli.run("down")


async def held_by_a_slow_turn(c: ControlClient, js: JetStreamContext, uid: str, ms: int) -> Any:
    """A turn of `ms` in flight: the durable admits one, so what is sent next waits unread."""
    slow = await c.call("send", {"name": "s1", "text": f"#slow:{ms} a slow one"})
    with anyio.fail_after(30):
        while True:
            if (await durable(js, "s1", uid)).num_ack_pending:
                return slow
            await anyio.sleep(0.05)


async def test_unacknowledged_mail_counts_and_a_full_stream_refuses_by_name(cli: Cli) -> None:
    cli.run("up", "--detach", env=LIMIT)
    row = cli.json("spawn", "s1", "--agent", "scribe")
    uid = row["lifecycleUid"]
    c = await client(cli)
    async with c, broker(cli.root) as js:
        # Some acknowledged history first: the trim makes room for it, never for what waits.
        await acknowledged_sends(c, js, 2 * N)
        await held_by_a_slow_turn(c, js, uid, 8000)
        sent: list[str] = []
        while True:
            try:
                out = await c.call("send", {"name": "s1", "text": f"queued-{len(sent)}"})
            except Refusal as exc:
                assert exc.code == "dm-stream-full", exc
                break
            sent.append(out["id"])
            assert len(sent) <= N
        # Full of what nobody acknowledged: the slow turn's message and the queued mail, the
        # seat's last reply (its fence's expectation) and its fence marker.
        assert (await js.stream_info(STREAM)).state.messages == N
        waiting = await durable(js, "s1", uid)
        assert waiting.num_pending == len(sent) == N - 3 and waiting.num_ack_pending == 1
        assert await subjects(js) == {
            f"cotal.{SPACE}.inst.local.s1.local.operator": len(sent) + 1,
            f"cotal.{SPACE}.inst.local.operator.local.s1": 1,
            marker_subject(SPACE, "local", "s1", 0): 1,
        }
        started = time.monotonic()
        proc = cli.run("send", "s1", "one too many", "--json", check=False)
        # At once, by name: not a broker retried for an election's worth of seconds.
        assert time.monotonic() - started < 10
        assert proc.returncode == 2, proc.stderr
        refusal = json.loads(proc.stderr.splitlines()[-1])
        assert refusal["code"] == "dm-stream-full"
        assert f"the DM stream {STREAM} is full: {N} messages" in refusal["error"]
        assert f"limit of {N} messages" in refusal["error"]
        assert "COTAL_DM_MAX_MSGS" in refusal["error"]
        assert (await js.stream_info(STREAM)).state.messages == N
        # The seat works its inbox down in order, and the room comes back.
        await drained(js, "s1", uid)
        reply = await c.call("send", {"name": "s1", "text": "What was the phrase?", "wait": True})
        assert reply["reply"] == f"The phrase is p-{2 * N - 1}."
        done = await durable(js, "s1", uid)
        assert done.num_pending == 0 and done.num_redelivered == 0
    cli.run("down")


async def test_a_cut_after_trims_carries_exactly_the_unacknowledged_mail(
    tmp_path: Path, cli: Cli
) -> None:
    committed_root(cli.root)
    cli.run("up", "--detach", env=LIMIT)
    row = cli.json("spawn", "s1", "--agent", "scribe")
    uid = row["lifecycleUid"]
    c = await client(cli)
    async with c, broker(cli.root) as js:
        await acknowledged_sends(c, js, 3 * N)
        # The trims removed the acknowledged mail: six times the limit went through.
        info = await js.stream_info(STREAM)
        assert info.state.last_seq > 6 * N and info.state.messages <= N
        # The slow turn holds the inbox, so the notes are queued, never delivered, at the fence.
        slow = await held_by_a_slow_turn(c, js, uid, 8000)
        notes = [
            await c.call("send", {"name": "s1", "text": f"Remember the phrase note-{i}"})
            for i in range(3)
        ]
    out = cli.run("down", "--preserve-state", "--drain-timeout", "30", "--json")
    cut = json.loads(out.stdout)
    assert cut["journal"] == "ready" and cut["failures"] == [] and cut["midTurn"] == [], cut
    attempt = Path(cut["checkpointDir"])
    state = read_seat_checkpoint(attempt / "s1").space_state
    assert state is not None
    # The slow turn reached its boundary and was acknowledged: the floor is its sequence.
    assert state.durable.ack_floor == slow["seq"]
    assert state.durable.start_seq == slow["seq"] + 1
    carried = decode_inbox((attempt / "s1" / INBOX_FILE).read_bytes(), state)
    assert [m.seq for m in carried] == [n["seq"] for n in notes]
    assert [decode_dm(base64.b64decode(m.payload)).id for m in carried] == [n["id"] for n in notes]

    copy = carry_to_new_host(cli.root, attempt, tmp_path)
    result = json.loads(cli.run("up", "--restore", str(copy), "--json", env=LIMIT).stdout)
    [inbox] = result["inbox"]
    assert inbox["kept"] is False and inbox["republished"] == 3
    async with broker(cli.root) as js:
        await drained(js, "s1", uid)
        assert (await js.stream_info(STREAM)).config.max_msgs == N
    reply = cli.json("send", "s1", "What was the phrase?", "--wait")
    assert reply["reply"] == "The phrase is note-2."
    cli.run("down")


async def test_a_stream_made_the_old_way_is_trimmed_in_place_by_up(
    cli: Cli, bare_broker: SharedBroker
) -> None:
    url, creds = bare_broker.url, bare_broker.creds
    old_uid, keep_uid = names.mint_lifecycle_uid(), names.mint_lifecycle_uid()
    async with broker_at(url, creds) as js:
        # Exactly what the previous release declared: limits retention, discard new, 1,000,000.
        await js.add_stream(
            api.StreamConfig(
                name=STREAM,
                subjects=[names.dm_stream_subjects(SPACE)],
                retention=api.RetentionPolicy.LIMITS,
                discard=api.DiscardPolicy.NEW,
                storage=api.StorageType.FILE,
                max_msgs_per_subject=-1,
                max_msgs=1_000_000,
                max_bytes=4 * 1024**3,
                duplicate_window=120.0,
                num_replicas=1,
            )
        )
        await ensure_dm_durable(js, SPACE, "local", "old", old_uid)
        await ensure_dm_durable(js, SPACE, "local", "keep", keep_uid)
        psub = await js.pull_subscribe_bind(
            durable=names.dm_durable("local", "old", old_uid), stream=STREAM
        )
        for i in range(40):
            await js.publish(f"cotal.{SPACE}.inst.local.old.local.operator", b"asked %d" % i)
            [msg] = await psub.fetch(1, timeout=5)
            await msg.ack_sync()
            await js.publish(f"cotal.{SPACE}.inst.local.operator.local.old", b"reply %d" % i)
        waiting = [
            (await js.publish(f"cotal.{SPACE}.inst.local.keep.local.operator", b"wait %d" % i)).seq
            for i in range(5)
        ]
        before = await durable(js, "old", old_uid)
    cli.run("up", "--detach", "--server", url, "--creds", creds, env={"COTAL_DM_MAX_MSGS": "40"})
    async with broker_at(url, creds) as js:
        info = await js.stream_info(STREAM, subjects_filter=names.dm_stream_subjects(SPACE))
        assert info.config.retention == api.RetentionPolicy.LIMITS
        assert info.config.discard == api.DiscardPolicy.NEW and info.config.max_msgs == 40
        # The old 120 s duplicate window is widened in the same update, to the recency horizon.
        assert info.config.duplicate_window == 24 * 60 * 60
        assert info.state.subjects == {
            f"cotal.{SPACE}.inst.local.old.local.operator": 1,
            f"cotal.{SPACE}.inst.local.operator.local.old": 1,
            f"cotal.{SPACE}.inst.local.keep.local.operator": 5,
        }
        for seq in waiting:
            assert (await js.get_msg(STREAM, seq=seq)).data.startswith(b"wait ")
        after = await durable(js, "old", old_uid)
        assert after.ack_floor == before.ack_floor and after.num_pending == 0
        assert (await durable(js, "keep", keep_uid)).num_pending == 5
    cli.json("spawn", "s1", "--agent", "scribe")
    assert cli.json("send", "s1", "Remember the phrase fresh-1", "--wait")["reply"] == (
        "Noted: fresh-1."
    )
    cli.run("down")


async def test_a_stream_of_another_retention_is_refused_by_name(js: JetStreamContext) -> None:
    await js.add_stream(
        api.StreamConfig(
            name=STREAM,
            subjects=[names.dm_stream_subjects(SPACE)],
            retention=api.RetentionPolicy.INTEREST,
            storage=api.StorageType.FILE,
        )
    )
    with pytest.raises(Refusal) as refused:
        await ensure_dm_stream(js, SPACE)
    assert refused.value.code == "dm-stream-retention"
    assert f"{STREAM} has interest retention" in refused.value.message
    assert f"nats stream rm {STREAM}" in refused.value.cure
    # Refused, and changed nothing.
    assert (await js.stream_info(STREAM)).config.retention == api.RetentionPolicy.INTEREST


async def test_the_duplicate_window_is_made_at_the_horizon_and_never_narrowed(
    js: JetStreamContext,
) -> None:
    async def window() -> float:
        return float((await js.stream_info(STREAM)).config.duplicate_window or 0.0)

    # Made by a restore that knows no horizon: the floor.
    await ensure_dm_stream(js, SPACE)
    assert await window() == 120.0
    # A manager whose horizon is an hour widens it in place, messages and all.
    seq = (await js.publish(f"cotal.{SPACE}.inst.local.keep.local.operator", b"kept")).seq
    await ensure_dm_stream(js, SPACE, horizon_s=3600)
    assert await window() == 3600.0
    # Another manager of the same broker with a shorter horizon does not narrow it.
    await ensure_dm_stream(js, SPACE, horizon_s=600)
    assert await window() == 3600.0
    assert (await js.get_msg(STREAM, seq=seq)).data == b"kept"
    # Inside the window, the same id is the broker's duplicate.
    again = await js.publish(
        f"cotal.{SPACE}.inst.local.keep.local.operator", b"once", headers={"Nats-Msg-Id": "x1"}
    )
    copy = await js.publish(
        f"cotal.{SPACE}.inst.local.keep.local.operator", b"once", headers={"Nats-Msg-Id": "x1"}
    )
    assert copy.duplicate and copy.seq == again.seq


async def test_a_stream_made_at_the_horizon_keeps_it(js: JetStreamContext) -> None:
    await ensure_dm_stream(js, SPACE, horizon_s=7200)
    assert (await js.stream_info(STREAM)).config.duplicate_window == 7200.0


async def test_a_malformed_limit_refuses_before_anything_starts(cli: Cli) -> None:
    proc = cli.run("up", "--detach", "--json", env={"COTAL_DM_MAX_MSGS": "lots"}, check=False)
    assert proc.returncode == 2, proc.stderr
    refusal = json.loads(proc.stderr.splitlines()[-1])
    assert refusal["code"] == "bad-dm-limit" and "COTAL_DM_MAX_MSGS='lots'" in refusal["error"]
    assert not (cli.root / ".cotal").exists()
