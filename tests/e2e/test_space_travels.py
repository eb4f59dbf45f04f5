"""The space travels in the checkpoint (issue 12, items 1 and 2): a seat's inbox durable, its
unacknowledged messages and its custody move to a destination that does not share the source's
broker, on real brokers (embedded, and a real 3-node cluster) and real processes."""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from nats.js import JetStreamContext, api

from manager.broker import custody, embedded, space
from manager.broker.footprint import ensure_dm_stream
from manager.broker.retry import riding_elections
from manager.checkpoint.reader import read_seat_checkpoint
from manager.coord.restore import NO_FENCE_NOTE
from protocol import names
from protocol.checkpoint import (
    CHECKPOINT_FILE,
    INBOX_FILE,
    SpaceRecord,
    decode_inbox,
)
from protocol.errors import Refusal
from protocol.instant import format_instant
from tests.ckpt import reseal, source_identity
from tests.cluster import Cluster
from tests.conftest import Cli
from tests.gitrepo import git, init_repo, write
from tests.helpers import broker, broker_at, processes_mentioning, trusting

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SPACE = "main"
PHRASE = "alpha-travel-1"
NOTE = "a note queued-at-the-cut-7"


def seed(root: Path) -> None:
    init_repo(root)
    write(root / "README.md", "# travel\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    write(root / "work.txt", "uncommitted at the cut\n")


def refusal(proc: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(proc.stderr.splitlines()[-1])
    return doc


def store_texts(root: Path) -> str:
    """Everything the scribe session stores under a root hold, as text."""
    out = []
    for p in (root / ".cotal" / "sessions").rglob("*"):
        if p.is_file():
            out.append(p.read_text(errors="replace"))
    return "\n".join(out)


async def test_embedded_to_embedded_carries_the_inbox(tmp_path: Path, cli: Cli) -> None:
    seed(cli.root)
    cli.run("up", "--detach")
    row = cli.json(
        "spawn", "default", "--agent", "scribe", "--prompt", f"Remember the phrase {PHRASE}."
    )
    # A slow turn holds the inbox (one message in flight), so the note is still queued when the
    # cut fences delivery: the cut must carry it.
    cli.json("send", "default", "#slow:3000 take your time")
    cli.json("send", "default", NOTE)
    cut = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert cut["journal"] == "ready" and cut["failures"] == [], cut
    attempt = Path(cut["checkpointDir"])
    record = read_seat_checkpoint(attempt / "default")
    state = record.space_state
    assert state is not None and state.messages >= 1
    carried = decode_inbox((attempt / "default" / INBOX_FILE).read_bytes(), state)
    assert any(NOTE in m.data().decode() for m in carried)
    assert state.durable.max_ack_pending == 1 and state.durable.ack_wait_ms == 60_000
    assert state.custody.holder == row["instanceId"] and state.custody.generation == 0
    copy = tmp_path / "carried" / attempt.name
    shutil.copytree(attempt, copy)

    # Host A goes away whole: its broker was stopped by the cut; its root leaves the path.
    os.rename(cli.root, cli.root.with_name("ws.src"))
    cli.root.mkdir()

    # Tampering refuses at integrity before anything exists at the destination.
    bad_inbox = tmp_path / "bad-inbox" / attempt.name
    shutil.copytree(copy, bad_inbox)
    path = bad_inbox / "default" / INBOX_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    bad_durable = tmp_path / "bad-durable" / attempt.name
    shutil.copytree(copy, bad_durable)
    ck = bad_durable / "default" / CHECKPOINT_FILE
    text = ck.read_text()
    floor = f'"ackFloor": {state.durable.ack_floor}'
    assert floor in text
    ck.write_text(text.replace(floor, f'"ackFloor": {state.durable.ack_floor + 1}'))
    for bad in (bad_inbox, bad_durable):
        proc = cli.run("up", "--restore", str(bad), *trusting(bad), "--json", check=False)
        assert proc.returncode == 2 and refusal(proc)["code"] == "integrity", proc.stderr
        assert list(cli.root.iterdir()) == []
    # A refusal at the broker's gates stops the broker this resume started and removes it.
    when = format_instant(datetime.now(UTC) - timedelta(days=2))
    stale = reseal(
        copy,
        tmp_path / "stale" / attempt.name,
        source_identity(cli.root.with_name("ws.src")),
        edit=lambda r: msgspec.structs.replace(r, captured_at=when),
    )
    proc = cli.run("up", "--restore", str(stale), *trusting(stale), "--json", check=False)
    assert proc.returncode == 2 and refusal(proc)["code"] == "stale-checkpoint", proc.stderr
    assert list(cli.root.iterdir()) == [] and processes_mentioning(str(cli.root)) == []

    out = cli.run("up", "--restore", str(copy), *trusting(copy), "--json")
    assert out.stderr.count(NO_FENCE_NOTE) == 1, out.stderr
    result = json.loads(out.stdout)
    [seat] = result["seats"]
    assert seat["sameSession"] and seat["sameUid"], seat
    assert seat["uidAfter"] == row["lifecycleUid"] and seat["sessionAfter"] == row["sessionId"]
    assert result["sharedBroker"] is False
    [inbox] = result["inbox"]
    assert inbox["kept"] is False and inbox["republished"] == state.messages
    reply = cli.json("send", "default", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}."
    # FIFO with one in flight: the carried note was handled before the question was.
    assert NOTE in store_texts(cli.root)
    durable = names.dm_durable("local", "default", row["lifecycleUid"])
    async with broker(cli.root) as js:
        info = await js.consumer_info(f"DM_{SPACE}", durable)
        kv = await js.key_value(f"cotal_custody_{SPACE}")
        entry = await kv.get(f"local.default.{row['lifecycleUid']}")
    assert info.config.filter_subject == state.durable.filter_subject
    assert info.config.max_ack_pending == 1 and info.config.ack_wait == 60.0
    assert info.num_pending == 0 and info.num_ack_pending == 0
    held = json.loads(entry.value or b"")
    [ps] = cli.ps()
    assert held["generation"] == 1 and held["holder"] == ps["instanceId"] != row["instanceId"]
    cli.run("down")


# -- the export and import against real brokers -------------------------------------------------


@dataclass
class Broker:
    url: str
    creds: str
    info: embedded.BrokerInfo | None = None


@pytest.fixture
def two_brokers(tmp_path: Path) -> Iterator[tuple[Broker, Broker]]:
    started: list[embedded.BrokerInfo] = []
    try:
        for name in ("a", "b"):
            base = tmp_path / f"broker-{name}"
            info = embedded.start_embedded(base / "nats", base / "broker.creds")
            started.append(info)
        yield tuple(Broker(i.url, i.creds, i) for i in started)  # type: ignore[misc]
    finally:
        for info in started:
            embedded.stop_embedded(info.identity)


@asynccontextmanager
async def js_at(b: Broker | Cluster) -> AsyncIterator[JetStreamContext]:
    if isinstance(b, Cluster):
        nc = await nats.connect(b.urls.split(","), nkeys_seed=b.creds)
        try:
            yield nc.jetstream()
        finally:
            await nc.close()
        return
    async with broker_at(b.url, b.creds) as js:
        yield js


UID = names.mint_lifecycle_uid()


async def _seat_with_out_of_order_ack(js: JetStreamContext, seat: str, uid: str) -> list[int]:
    """Three messages for `seat` (and one for a neighbour between them); the durable admits
    several in flight, and the second is left unacknowledged while the third is acked."""
    await ensure_dm_stream(js, SPACE)
    stream, durable = names.dm_stream(SPACE), names.dm_durable("local", seat, uid)
    await js.add_consumer(
        stream,
        api.ConsumerConfig(
            durable_name=durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=60.0,
            filter_subject=names.dm_filter(SPACE, "local", seat),
            max_ack_pending=5,
            deliver_policy=api.DeliverPolicy.ALL,
        ),
    )
    seqs = []
    for i in range(3):
        ack = await js.publish(
            f"cotal.{SPACE}.inst.local.{seat}.local.operator",
            f"message {i}".encode(),
            headers={"Nats-Msg-Id": f"{seat}-m{i}"},
        )
        seqs.append(ack.seq)
        await js.publish(f"cotal.{SPACE}.inst.local.other.local.operator", b"not yours")
    sub = await js.pull_subscribe_bind(durable, stream)
    msgs = await sub.fetch(3, timeout=5)
    assert [m.data for m in msgs] == [b"message 0", b"message 1", b"message 2"]
    await msgs[0].ack_sync()
    await msgs[2].ack_sync()
    await sub.unsubscribe()
    info = await js.consumer_info(stream, durable)
    # The floor may stand on the neighbour's message after the first: it is not this filter's.
    assert seqs[0] <= info.ack_floor.stream_seq < seqs[1]
    return seqs


async def _drain(js: JetStreamContext, seat: str, uid: str, n: int) -> list[tuple[bytes, str]]:
    sub = await js.pull_subscribe_bind(names.dm_durable("local", seat, uid), names.dm_stream(SPACE))
    got: list[tuple[bytes, str]] = []
    while len(got) < n:
        # A durable just made on a cluster may not have its leader yet (a 503, nothing
        # delivered): the pull is asked again, as the manager's bridge does.
        for m in await riding_elections("drain", functools.partial(sub.fetch, 1, timeout=5)):
            got.append((m.data, (m.headers or {}).get("Nats-Msg-Id", "")))
            await m.ack_sync()
    await sub.unsubscribe()
    return got


async def test_out_of_order_ack_is_redelivered_in_another_broker(
    two_brokers: tuple[Broker, Broker],
) -> None:
    a, b = two_brokers
    async with js_at(a) as ja, js_at(b) as jb:
        seqs = await _seat_with_out_of_order_ack(ja, "s1", UID)
        record, messages = await space.export_inbox(ja, SPACE, "s1", UID)
        assert seqs[0] <= record.ack_floor < seqs[1] and record.start_seq == record.ack_floor + 1
        assert [m.seq for m in messages] == seqs[1:]
        assert [m.msg_id for m in messages] == ["s1-m1", "s1-m2"]
        # The same broker still holds the durable: it is kept exactly, frontier and all.
        kept = await space.import_inbox(
            ja, SPACE, "s1", UID, record, messages, attempt_id="at-1", shared=True
        )
        assert kept.kept
        # Another broker: rebuilt from the floor, so the out-of-order ack comes back too.
        done = await space.import_inbox(
            jb, SPACE, "s1", UID, record, messages, attempt_id="at-1", shared=False
        )
        assert not done.kept and done.republished == 2 and done.duplicates == 0
        again = await space.import_inbox(
            jb, SPACE, "s1", UID, record, messages, attempt_id="at-1", shared=False
        )
        assert again.kept
        assert await _drain(jb, "s1", UID, 2) == [(b"message 1", "s1-m1"), (b"message 2", "s1-m2")]
        info = await jb.consumer_info(names.dm_stream(SPACE), names.dm_durable("local", "s1", UID))
        assert info.config.max_ack_pending == 5 and info.num_pending == 0
        # A rerun into a broker that still holds the messages (the durable lost) deduplicates
        # them by id and starts at their original sequences.
        await ja.delete_consumer(names.dm_stream(SPACE), names.dm_durable("local", "s1", UID))
        redo = await space.import_inbox(
            ja, SPACE, "s1", UID, record, messages, attempt_id="at-1", shared=False
        )
        assert redo.duplicates == 2 and redo.start_seq == seqs[1]
        assert await _drain(ja, "s1", UID, 2) == [(b"message 1", "s1-m1"), (b"message 2", "s1-m2")]
        # Broker identity: one per broker, stable.
        id_a = await space.broker_identity(await custody.custody_kv(ja, SPACE))
        assert id_a == await space.broker_identity(await custody.custody_kv(ja, SPACE))
        assert await space.read_broker_identity(jb, SPACE) is None
        id_b = await space.broker_identity(await custody.custody_kv(jb, SPACE))
        assert id_a != id_b and await space.read_broker_identity(ja, SPACE) == id_a


async def test_an_empty_inbox_starts_after_everything_the_destination_holds(
    two_brokers: tuple[Broker, Broker],
) -> None:
    a, b = two_brokers
    async with js_at(a) as ja, js_at(b) as jb:
        await _seat_with_out_of_order_ack(ja, "s2", UID)
        await ensure_dm_stream(jb, SPACE)
        # Old mail for a former seat of the same name at the destination is not this uid's.
        await jb.publish(f"cotal.{SPACE}.inst.local.s2.local.operator", b"stale")
        record, _ = await space.export_inbox(ja, SPACE, "s2", UID)
        done = await space.import_inbox(
            jb, SPACE, "s2", UID, record, [], attempt_id="at-2", shared=False
        )
        assert done.start_seq == 2
        info = await jb.consumer_info(names.dm_stream(SPACE), names.dm_durable("local", "s2", UID))
        assert info.num_pending == 0


@dataclass
class Rec:
    """Stands in for a SeatCheckpoint in a claim: name, uid, generation and revision."""

    lifecycle_uid: str
    generation: int
    custody_revision: int | None


async def _claim_across(js: JetStreamContext, holder: str, attempt: str, rec: Rec) -> list[Any]:
    out: list[Any] = await custody.claim_across(
        js,
        SPACE,
        attempt,
        {"s1": rec},  # type: ignore[dict-item]
        holder=holder,
        root=Path("/nowhere"),
        replicas=1,
    )
    return out


async def _travel(
    src: JetStreamContext, dst: JetStreamContext, uid: str, replicas: int, attempt: str
) -> None:
    record, messages = await space.export_inbox(src, SPACE, "s1", uid)
    done = await space.import_inbox(
        dst, SPACE, "s1", uid, record, messages, attempt_id=attempt, shared=False, replicas=replicas
    )
    assert not done.kept
    got = await _drain(dst, "s1", uid, len(messages))
    assert [g[1] for g in got] == [m.msg_id for m in messages]


async def test_embedded_to_cluster_and_back(
    two_brokers: tuple[Broker, Broker], nats_cluster: Cluster
) -> None:
    a, b = two_brokers
    uid = names.mint_lifecycle_uid()
    holder_a, holder_c, holder_b = (names.mint_instance_id() for _ in range(3))
    async with js_at(a) as ja, js_at(nats_cluster) as jc, js_at(b) as jb:
        await _seat_with_out_of_order_ack(ja, "s1", uid)
        kva = await custody.custody_kv(ja, SPACE)
        base = await custody.establish(kva, "s1", uid, holder_a)
        # embedded -> cluster: the inbox and the custody chain continue at generation 1.
        await _travel(ja, jc, uid, 3, "attempt-c")
        rec = Rec(uid, 0, base.revision)
        [claim] = await _claim_across(jc, holder_c, "attempt-c", rec)
        assert claim["generation"] == 1
        assert (await _claim_across(jc, holder_c, "attempt-c", rec))[0]["generation"] == 1
        # A second destination sharing the cluster loses; one that does not cannot be stopped.
        with pytest.raises(Refusal) as lost:
            await _claim_across(jc, names.mint_instance_id(), "attempt-x", rec)
        assert lost.value.code == "generation-behind"
        info = await jc.stream_info(names.dm_stream(SPACE))
        assert info.config.num_replicas == 3
        # cluster -> embedded: publish one more there, cut from the cluster (generation 1).
        await jc.publish(
            f"cotal.{SPACE}.inst.local.s1.local.operator",
            b"from the cluster",
            headers={"Nats-Msg-Id": "s1-c1"},
        )
        await _travel(jc, jb, uid, 1, "attempt-b")
        kvc = await custody.custody_kv(jc, SPACE)
        held_c = await custody.read(kvc, "s1", uid)
        assert held_c is not None
        [back] = await _claim_across(jb, holder_b, "attempt-b", Rec(uid, 1, held_c.revision))
        assert back["generation"] == 2
        # Back to the first broker, which still holds generation 0 and the seat's old durable:
        # the chain moves custody on, and the stale durable gives way to the carried inbox.
        await jb.publish(
            f"cotal.{SPACE}.inst.local.s1.local.operator",
            b"from the second embedded",
            headers={"Nats-Msg-Id": "s1-b1"},
        )
        assert await space.read_broker_identity(ja, SPACE) != await space.broker_identity(
            await custody.custody_kv(jb, SPACE)
        )
        await _travel(jb, ja, uid, 1, "attempt-a")
        [home] = await _claim_across(ja, holder_a, "attempt-a", Rec(uid, 2, 99))
        assert home["generation"] == 3
        held_a = await custody.read(kva, "s1", uid)
        assert held_a is not None and held_a.record.holder == holder_a


async def test_a_stale_checkpoint_is_behind_a_broker_that_moved_on(
    two_brokers: tuple[Broker, Broker],
) -> None:
    a, _ = two_brokers
    uid = names.mint_lifecycle_uid()
    async with js_at(a) as ja:
        kv = await custody.custody_kv(ja, SPACE)
        await custody.establish(kv, "s1", uid, names.mint_instance_id())
        await _claim_across(ja, names.mint_instance_id(), "attempt-1", Rec(uid, 2, 1))
        with pytest.raises(Refusal) as behind:
            await _claim_across(ja, names.mint_instance_id(), "attempt-2", Rec(uid, 1, 1))
        assert behind.value.code == "generation-behind"


def _cut_with_a_queued_note(cli: Cli, note: str) -> tuple[Path, SpaceRecord]:
    cli.json("send", "default", "#slow:2000 take your time")
    cli.json("send", "default", note)
    cut = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert cut["journal"] == "ready" and cut["failures"] == [], cut
    attempt = Path(cut["checkpointDir"])
    state = read_seat_checkpoint(attempt / "default").space_state
    assert state is not None and state.messages >= 1
    return attempt, state


def _host_away(cli: Cli, attempt: Path, to: Path, tag: str) -> Path:
    copy = to / attempt.name
    shutil.copytree(attempt, copy)
    os.rename(cli.root, cli.root.with_name(f"ws.{tag}"))
    cli.root.mkdir()
    return copy


async def test_embedded_to_cluster_to_embedded_end_to_end(
    tmp_path: Path, cli: Cli, nats_cluster: Cluster
) -> None:
    seed(cli.root)
    cli.run("up", "--detach")
    row = cli.json(
        "spawn", "default", "--agent", "scribe", "--prompt", f"Remember the phrase {PHRASE}."
    )
    attempt, _ = _cut_with_a_queued_note(cli, "first note n1-queued")
    copy = _host_away(cli, attempt, tmp_path / "leg1", "a")
    cluster = ("--server", nats_cluster.urls, "--creds", nats_cluster.creds)
    out = cli.run("up", "--restore", str(copy), *cluster, *trusting(copy), "--json")
    assert out.stderr.count(NO_FENCE_NOTE) == 1, out.stderr
    [seat] = json.loads(out.stdout)["seats"]
    assert seat["sameSession"] and seat["uidAfter"] == row["lifecycleUid"]
    reply = cli.json("send", "default", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}."
    assert "n1-queued" in store_texts(cli.root)
    async with js_at(nats_cluster) as jc:
        info = await jc.stream_info(f"DM_{SPACE}")
        assert info.config.num_replicas == 3

    # Back to an embedded broker of its own, from the cluster.
    attempt, state = _cut_with_a_queued_note(cli, "second note n2-queued")
    assert state.custody.generation == 1
    copy = _host_away(cli, attempt, tmp_path / "leg2", "c")
    out = cli.run("up", "--restore", str(copy), *trusting(copy), "--json")
    assert out.stderr.count(NO_FENCE_NOTE) == 1, out.stderr
    [seat] = json.loads(out.stdout)["seats"]
    assert seat["sameSession"] and seat["uidAfter"] == row["lifecycleUid"]
    reply = cli.json("send", "default", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}."
    assert "n2-queued" in store_texts(cli.root)
    async with broker(cli.root) as js:
        entry = await (await js.key_value(f"cotal_custody_{SPACE}")).get(
            f"local.default.{row['lifecycleUid']}"
        )
    assert json.loads(entry.value or b"")["generation"] == 2
    cli.run("down")
