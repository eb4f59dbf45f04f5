"""One writer per seat across hosts, enforced at the broker (issue 6), on a real 3-node cluster."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import anyio
import nats
import pytest
from nats.js.api import ConsumerInfo
from nats.js.kv import KeyValue

from manager.broker import custody
from manager.broker.fence import HOLDER, FencedOut, WriterFence, outbound_filter
from manager.broker.footprint import ensure_kv
from protocol import names
from protocol.custody import CustodyRecord, custody_key, encode_custody
from protocol.errors import Refusal
from protocol.messages import Presence, encode
from tests.cluster import Cluster
from tests.conftest import Cli, SharedBroker, cotal_env
from tests.gitrepo import git, init_repo, write
from tests.helpers import broker_at, trusting, wait_gone, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]


def git_root(root: Path) -> None:
    init_repo(root)
    write(root / "README.md", "# fence\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")


async def test_claim_storm_exactly_one_winner_every_time(nats_cluster: Cluster) -> None:
    urls = nats_cluster.urls.split(",")
    conns = [await nats.connect(urls[i % 3], nkeys_seed=nats_cluster.creds) for i in range(16)]
    try:
        kvs: list[KeyValue] = [
            await ensure_kv(nc.jetstream(), "cotal_custody_storm", ttl=None, replicas=3)
            for nc in conns
        ]
        holders = [names.mint_instance_id() for _ in range(16)]
        source = names.mint_instance_id()
        for round_no in range(200):
            uid = names.mint_lifecycle_uid()
            base = await custody.establish(kvs[0], "storm", uid, source)
            wins: list[int] = []
            losses: list[str] = []

            async def claim(
                i: int,
                uid: str = uid,
                rev: int = base.revision,
                round_no: int = round_no,
                wins: list[int] = wins,
                losses: list[str] = losses,
            ) -> None:
                try:
                    await custody.claim(
                        kvs[i],
                        "storm",
                        uid,
                        expected_revision=rev,
                        generation=1,
                        holder=holders[i],
                        attempt_id=f"storm-{round_no}-{i}",
                    )
                    wins.append(i)
                except Refusal as exc:
                    losses.append(exc.code)

            async with anyio.create_task_group() as tg:
                for i in range(16):
                    tg.start_soon(claim, i)
            assert len(wins) == 1, f"round {round_no}: winners {wins}"
            assert losses == ["custody-lost"] * 15
            held = await custody.read(kvs[0], "storm", uid)
            assert (
                held is not None
                and held.record.holder == holders[wins[0]]
                and held.record.generation == 1
            )
    finally:
        for nc in conns:
            await nc.close()


async def test_attempt_key_storm_one_destination_wins(nats_cluster: Cluster) -> None:
    urls = nats_cluster.urls.split(",")
    conns = [await nats.connect(urls[i % 3], nkeys_seed=nats_cluster.creds) for i in range(16)]
    try:
        kvs = [
            await ensure_kv(nc.jetstream(), "cotal_custody_attempts", ttl=None, replicas=3)
            for nc in conns
        ]
        for round_no in range(50):
            winners: list[int] = []

            async def create(
                i: int, round_no: int = round_no, winners: list[int] = winners
            ) -> None:
                if await custody.create_exclusive(
                    kvs[i], f"attempt.a{round_no}", f"holder-{i}".encode()
                ):
                    winners.append(i)

            async with anyio.create_task_group() as tg:
                for i in range(16):
                    tg.start_soon(create, i)
            assert len(winners) == 1
    finally:
        for nc in conns:
            await nc.close()


async def _takeover(urls: str, creds: str, seat: str, uid: str, new_holder: str) -> tuple[int, int]:
    """Another host wins custody (compare-and-set) and fences the seat's outbound writes."""
    nc = await nats.connect(urls.split(","), nkeys_seed=creds)
    try:
        js = nc.jetstream()
        kv = await js.key_value("cotal_custody_main")
        held = await custody.read(kv, seat, uid)
        assert held is not None
        record = CustodyRecord(
            seat=seat,
            lifecycle_uid=uid,
            generation=held.record.generation + 1,
            holder=new_holder,
            claimed_at="2026-11-29T00:00:00Z",
            attempt_id="takeover",
        )
        await kv.update(
            custody_key(names.SEAT_OWNER, seat, uid), encode_custody(record), last=held.revision
        )
        fence = WriterFence(js, "main", seat, new_holder, record.generation)
        return await fence.establish(), held.record.generation
    finally:
        await nc.close()


async def test_paused_holder_is_fenced_by_the_broker_and_stops_its_seat(
    cli: Cli, nats_cluster: Cluster
) -> None:
    git_root(cli.root)
    cli.run("up", "--detach", "--server", nats_cluster.urls, "--creds", nats_cluster.creds)
    row = cli.json("spawn", "held", "--prompt", "Remember the phrase before-pause")
    daemon = cli.json("status")["pid"]
    me = row["instanceId"]
    # A turn is in flight when the holder is paused.
    cli.json("send", "held", "#slow:2500 remember the phrase during-pause")
    nc = await nats.connect(nats_cluster.urls.split(","), nkeys_seed=nats_cluster.creds)
    js = nc.jetstream()
    stale = WriterFence(js, "main", "held", me, 0)
    stale.last_seq = int(
        (await js.get_last_msg("DM_main", outbound_filter("main", "local", "held"))).seq
    )
    os.kill(daemon, signal.SIGSTOP)
    try:
        newcomer = names.mint_instance_id()
        marker, _ = await _takeover(
            nats_cluster.urls, nats_cluster.creds, "held", row["lifecycleUid"], newcomer
        )
        # The broker itself refuses the stale holder's write, whatever the client believes.
        with pytest.raises(FencedOut):
            await stale.publish("cotal.main.inst.local.operator.local.held", b"stale write")
    finally:
        os.kill(daemon, signal.SIGCONT)
    log = cli.root / ".cotal/logs/manager.log"

    def evicted() -> bool:
        return '"event": "custody.evicted"' in log.read_text()

    await wait_until(evicted, timeout=30)
    await wait_gone([row["pid"]])
    events = [json.loads(line) for line in log.read_text().splitlines()]
    [ev] = [e for e in events if e["event"] == "custody.evicted"]
    assert ev["seat"] == "held" and ev["holder_was"] == me and ev["holder_now"] == newcomer
    assert cli.ps() == []
    # It never relaunched the seat after the eviction.
    after = events[events.index(ev) + 1 :]
    assert not [
        e for e in after if e["event"] in ("seat.started", "seat.restarted", "seat.spawned")
    ]
    # Nothing the stale holder wrote landed after the new holder's fence marker: the marker is
    # still the newest write on the seat's outbound subjects.
    last = int((await js.get_last_msg("DM_main", outbound_filter("main", "local", "held"))).seq)
    assert last == marker
    # Every message the stream holds from the marker on is read, and a read that fails fails
    # the test (the stream keeps everything: limits retention), so an empty pass is impossible.
    end = int((await js.stream_info("DM_main")).state.last_seq)
    holders = [(await js.get_msg("DM_main", seq)).headers or {} for seq in range(marker, end + 1)]
    assert len(holders) == end - marker + 1 >= 1
    assert holders[0].get(HOLDER) == newcomer
    assert me not in [h.get(HOLDER) for h in holders]
    # The stale holder's teardown does not touch what is now the newcomer's inbox: the
    # consumer survives with its delivery and ack positions exactly as they were.
    durable = f"dm_local-held-{row['lifecycleUid']}"

    def positions(info: ConsumerInfo) -> tuple[int | None, int | None, int | None, int | None]:
        return (
            info.delivered.stream_seq,
            info.ack_floor.stream_seq,
            info.num_pending,
            info.num_ack_pending,
        )

    before = positions(await js.consumer_info("DM_main", durable))
    cli.run("down")
    assert positions(await js.consumer_info("DM_main", durable)) == before
    await nc.close()


async def test_stale_source_cannot_launch_while_the_destination_runs_the_seat(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    if os.geteuid() != 0:
        pytest.skip("private mount namespaces need root")
    base, root = tmp_path / "host", tmp_path / "host" / "ws"
    host_a, host_b = tmp_path / "hostA", tmp_path / "hostB"
    (host_a / "ws").mkdir(parents=True)
    (host_b / "ws").mkdir(parents=True)
    root.mkdir(parents=True)

    def in_ns(host: Path, *args: str) -> list[str]:
        cmd = " ".join(f'"{a}"' for a in args)
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'mount --bind "{host}" "{base}" && '
            f'exec "{sys.executable}" -m manager.cli {cmd} --root "{root}"',
        ]

    async def run(host: Path, *args: str) -> tuple[int, str, str]:
        proc = await anyio.run_process(in_ns(host, *args), env=cotal_env(), check=False)
        return proc.returncode, proc.stdout.decode(), proc.stderr.decode()

    git_root(host_a / "ws")
    b = ["--server", shared_broker.url, "--creds", shared_broker.creds]
    assert (await run(host_a, "up", "--detach", *b))[0] == 0
    code, out, err = await run(host_a, "spawn", "moved", "--json")
    assert code == 0, err
    row = json.loads(out)
    code, out, err = await run(host_a, "down", "--preserve-state", "--json")
    assert code == 0, err
    sealed = Path(json.loads(out)["checkpointDir"].replace(str(root), str(host_a / "ws")))
    carried = tmp_path / "carried"
    shutil.copytree(sealed, carried)
    # Host B resumes the seat and runs it.
    code, out, err = await run(
        host_b, "up", "--restore", str(carried), *b, *trusting(carried), "--json"
    )
    assert code == 0, err
    assert json.loads(out)["seats"][0]["uidAfter"] == row["lifecycleUid"]
    # Host A comes back with its stale local record (its journal still says `ready`) while B
    # runs the seat: the identity gate refuses, the uid is live at the broker.
    stale = str(sealed).replace(str(host_a / "ws"), str(root))
    before = sorted(p.name for p in (host_a / "ws").iterdir())
    code, _, err = await run(host_a, "up", "--restore", stale, *b)
    assert code == 2 and "retained principal moved" in err and "already live" in err, err
    assert sorted(p.name for p in (host_a / "ws").iterdir()) == before
    assert not (host_a / "ws/.cotal/manager.sock").exists()
    code, out, err = await run(
        host_b, "send", "moved", "remember the phrase still-b", "--wait", "--json"
    )
    assert code == 0 and json.loads(out)["reply"] == "Noted: still-b.", err
    # Host B cuts the seat (nothing runs it now, its custody stays at generation 1): A's record
    # is behind, and A refuses by generation, naming the holder.
    code, _, err = await run(host_b, "down", "--preserve-state")
    assert code == 0, err
    code, _, err = await run(host_a, "up", "--restore", stale, *b)
    assert code == 2
    assert "this checkpoint is at writer generation 0, but custody is at generation 1" in err, err
    assert sorted(p.name for p in (host_a / "ws").iterdir()) == before
    assert not (host_a / "ws/.cotal/manager.sock").exists()


async def _ghost_presence(b: SharedBroker, seat: str, uid: str, instance: str) -> None:
    async with broker_at(b.url, b.creds) as js:
        kv = await js.key_value("cotal_presence_main")
        await kv.put(
            f"local.{seat}.{uid}",
            encode(
                Presence(
                    seat=seat,
                    lifecycle_uid=uid,
                    instance_id=instance,
                    agent="scribe",
                    pid=1,
                    since="2026-11-29T00:00:00Z",
                )
            ),
        )


async def test_resume_while_predecessor_shows_presence_needs_verified_eviction(
    tmp_path: Path, cli: Cli, shared_broker: SharedBroker
) -> None:
    git_root(cli.root)
    cli.run("up", "--detach", "--server", shared_broker.url, "--creds", shared_broker.creds)
    row = cli.json("spawn", "ghost")
    cut = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    carried = tmp_path / "carried"
    shutil.copytree(cut["checkpointDir"], carried)
    shutil.rmtree(cli.root)
    cli.root.mkdir()
    predecessor = row["instanceId"]
    restore = [
        "up",
        "--restore",
        str(carried),
        "--server",
        shared_broker.url,
        "--creds",
        shared_broker.creds,
        *trusting(carried),
    ]
    # Presence says the predecessor still runs the seat; with no way to check, refuse.
    await _ghost_presence(shared_broker, "ghost", row["lifecycleUid"], predecessor)
    out = cli.run(*restore, check=False)
    assert (
        out.returncode == 2
        and "uid-live" not in out.stdout
        and "already live at the broker" in out.stderr
    )
    assert "--monitor" in out.stderr
    # An oracle that cannot answer is a refusal, never a pass.
    await _ghost_presence(shared_broker, "ghost", row["lifecycleUid"], predecessor)
    out = cli.run(*restore, "--monitor", "http://127.0.0.1:9", check=False)
    assert out.returncode == 2 and "cannot verify the predecessor is gone" in out.stderr
    # The predecessor still holds a broker connection: refused, by name.
    live = await nats.connect(
        shared_broker.url, nkeys_seed=shared_broker.creds, name=f"cotal-manager:{predecessor}"
    )
    try:
        await _ghost_presence(shared_broker, "ghost", row["lifecycleUid"], predecessor)
        out = cli.run(*restore, "--monitor", shared_broker.monitor, check=False)
        assert (
            out.returncode == 2
            and f"cotal-manager:{predecessor}" in out.stderr
            and "still holds" in out.stderr
        )
    finally:
        await live.close()
    assert sorted(p.name for p in cli.root.iterdir()) in ([], [".cotal"])
    # Verified gone: a complete scan with none remaining. The resume proceeds and says why. A
    # bystander connection proves the scan read the list rather than an empty answer.
    bystander = await nats.connect(
        shared_broker.url, nkeys_seed=shared_broker.creds, name="bystander"
    )
    try:
        await _ghost_presence(shared_broker, "ghost", row["lifecycleUid"], predecessor)
        out = cli.run(*restore, "--monitor", shared_broker.monitor, "--json")
    finally:
        await bystander.close()
    result = json.loads(out.stdout)
    [proof] = result["evictionEvidence"]
    assert (
        proof["instanceId"] == predecessor
        and proof["remaining"] == 0
        and proof["connectionsScanned"] >= 1
    )
    assert "EVICTION EVIDENCE" in out.stderr
    assert result["seats"][0]["sameUid"]
    cli.run("down")
