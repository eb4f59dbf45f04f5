"""`cotal ps --fleet` (issue 24, item 6): two managers on one real standalone broker, a scribe
seat on each; the roster from either root lists both seats where they run, and a seat cut at
one root as its custody record then says it is (held; in transit, to its destination, while a
move's packed attempt is in the move bucket, and once packed to be carried away). The roster's
rules for a move's object, and `instance_gone` (the source's view of a destination manager's
end), against the real broker's buckets. Real broker, real daemons, real seats, real git."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import nats
import pytest
from nats.js.errors import BucketNotFoundError

from manager.broker import carry, fleet, footprint
from manager.broker.retry import riding_elections
from manager.cli.fleet import run_fleet
from protocol import names
from protocol.custody import CustodyRecord, encode_custody
from protocol.errors import Refusal
from protocol.instant import parse_instant
from protocol.messages import ManagerLease, Presence, encode
from protocol.move import CarriedMeta, CarriedSeat
from tests.cluster import Cluster
from tests.conftest import Cli, SharedBroker
from tests.e2e.test_cluster_faults import cluster_nc, election_seconds, leader_of, place_leader
from tests.gitrepo import git, init_repo, write
from tests.helpers import ask, broker_at, wait_gone

pytestmark = pytest.mark.usefixtures("isolated_home")


def fleet_of(cli: Cli, *, as_json: bool = True) -> Any:
    proc = cli.run("ps", "--fleet", *(["--json"] if as_json else []), timeout=60)
    if not as_json:
        return proc.stdout
    [line] = proc.stdout.splitlines()
    return json.loads(line)


def committed_root(root: Path) -> Path:
    init_repo(root)
    write(root / "README.md", "# fleet\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    return root


@pytest.fixture
def two_roots(tmp_path: Path, shared_broker: SharedBroker) -> Iterator[tuple[Cli, Cli]]:
    a, b = Cli(committed_root(tmp_path / "a")), Cli(committed_root(tmp_path / "b"))
    for cli, host in ((a, "host-a"), (b, "host-b")):
        cli.run(
            "up",
            "--detach",
            "--server",
            shared_broker.url,
            "--creds",
            shared_broker.creds,
            env={"COTAL_HOST_LABEL": host},
        )
    yield a, b
    for cli in (a, b):
        if (cli.root / ".cotal" / "mesh.json").exists():
            cli.run("down", check=False)


def fleet_row(
    name: str, uid: str, instance: str, host: str | None, state: str, **over: Any
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": name,
        "lifecycleUid": uid,
        "instance": instance,
        "host": host,
        "state": state,
        "generation": 0,
        "attemptId": None,
        "presenceInstance": instance if state == "running" else None,
        "managerLive": host is not None,
        "errors": [],
        "to": None,
        "since": None,
        "takeover": None,
    }
    return {**row, **over}


@pytest.mark.anyio
async def test_fleet_shows_every_managers_seats_and_a_cut_seat_as_its_custody_says(
    tmp_path: Path, shared_broker: SharedBroker, two_roots: tuple[Cli, Cli]
) -> None:
    a, b = two_roots
    alpha = a.json("spawn", "alpha", "--agent", "scribe")
    beta = b.json("spawn", "beta", "--agent", "scribe")
    ia, ib = alpha["instanceId"], beta["instanceId"]
    assert ia != ib
    both = [
        fleet_row("alpha", alpha["lifecycleUid"], ia, "host-a", "running"),
        fleet_row("beta", beta["lifecycleUid"], ib, "host-b", "running"),
    ]
    assert fleet_of(a) == both
    assert fleet_of(b) == both
    table = fleet_of(b, as_json=False)
    assert [line.split() for line in table.splitlines()] == [
        ["NAME", "INSTANCE", "HOST", "STATE", "GEN", "TO"],
        ["alpha", ia, "host-a", "running", "0", "-"],
        ["beta", ib, "host-b", "running", "0", "-"],
    ]

    # A cut of root A on the shared broker: its seat stops, its manager goes, custody stays.
    cut = json.loads(a.run("down", "--preserve-state", "--json").stdout)
    assert [s["name"] for s in cut["seats"]] == ["alpha"]
    await wait_gone([alpha["pid"]])
    # The cut leaves custody exactly as it was (holder A, generation 0, no attempt named): the
    # record says held, not in transit. Once A's presence and lease have run out (TTLs 6 s and
    # 10 s) the row is that and nothing else.
    held = fleet_row("alpha", alpha["lifecycleUid"], ia, None, "held")
    running_beta = both[1]
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        with anyio.fail_after(30):
            while (rows := await fleet.roster(js, "main"))[0] != fleet.FleetRow(
                name="alpha",
                lifecycle_uid=alpha["lifecycleUid"],
                instance=ia,
                host=None,
                state="held",
                generation=0,
                attempt_id=None,
                presence_instance=None,
                manager_live=False,
            ):
                # While the lease lives on, the seat is already not running and still held.
                assert (rows[0].state, rows[0].instance) in (("running", ia), ("held", ia))
                await anyio.sleep(0.5)
        # The broker drops an expired entry lazily: one read may miss a lease the next still
        # finds for a moment, so B's own view is waited for too, within the same budget.
        with anyio.fail_after(15):
            while (seen := fleet_of(b)) != [held, running_beta]:
                assert seen[0]["state"] == "held", seen
                await anyio.sleep(0.5)

    # A move of it to B puts the packed attempt in the move bucket, its description naming the
    # seat at its generation and the destination: while it is there the seat is in transit to B.
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        await carry.put(
            js,
            "main",
            cut["attemptId"],
            b"the packed attempt",
            meta=CarriedMeta(
                source=ia,
                attempt_id=cut["attemptId"],
                seats=[
                    CarriedSeat(name="alpha", lifecycle_uid=alpha["lifecycleUid"], generation=0)
                ],
                to=ib,
            ),
        )
        assert fleet_of(b) == [{**held, "state": "in transit", "to": ib}, running_beta]
        assert [line.split() for line in fleet_of(b, as_json=False).splitlines()] == [
            ["NAME", "INSTANCE", "HOST", "STATE", "GEN", "TO"],
            ["alpha", ia, "-", "in", "transit", "0", ib],
            ["beta", ib, "host-b", "running", "0", "-"],
        ]
        assert await carry.drop(js, "main", cut["attemptId"]) is True
    assert fleet_of(b) == [held, running_beta]

    # Packed to be carried away, the seat is in transit: the hand-off record names it at the
    # generation its custody holds.
    packed = tmp_path / "alpha.tar"
    a.run(
        "checkpoint",
        "pack",
        cut["checkpointDir"],
        "-o",
        str(packed),
        "--server",
        shared_broker.url,
        "--creds",
        shared_broker.creds,
    )
    in_transit = [{**held, "state": "in transit"}, running_beta]
    assert fleet_of(b) == in_transit
    # So far B's own manager answered (the `fleet` op). With it gone, its mesh record still
    # names the shared broker, which the command then reads itself: the same rows, B's seat's
    # lease and presence not yet expired.
    manager_b = b.json("status")["pid"]
    os.kill(manager_b, signal.SIGKILL)
    await wait_gone([manager_b])
    assert fleet_of(b) == in_transit
    # And a root whose mesh is gone has no broker to ask.
    with pytest.raises(Refusal) as refused:
        run_fleet(argparse.Namespace(root=str(a.root), json=True))
    assert refused.value.code == "not-up"
    assert refused.value.message == (
        f"no mesh is up in {a.root} (no .cotal/mesh.json), so there is no broker to ask"
    )


def test_a_root_with_no_mesh_refuses_by_name(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as refused:
        run_fleet(argparse.Namespace(root=str(tmp_path), json=False))
    assert refused.value.code == "not-up"
    assert "cotal up --server URL --creds FILE" in refused.value.cure


A = "a" * 26
B = "b" * 26
SRC_UID = "1" * 26
BACK_UID = "2" * 26
ATTEMPT = "20261203T170000Z-0a1b2c3d"
WHEN = "2026-12-03T17:00:00.000Z"


async def put_custody(
    js: Any, space: str, seat: str, uid: str, holder: str, generation: int, attempt: str | None
) -> None:
    kv = await js.key_value(names.custody_bucket(space))
    record = CustodyRecord(
        seat=seat,
        lifecycle_uid=uid,
        generation=generation,
        holder=holder,
        claimed_at=WHEN,
        attempt_id=attempt,
    )
    await kv.put(f"local.{seat}.{uid}", encode_custody(record))


def row(seat: str, uid: str, holder: str, state: str, generation: int, **over: Any) -> Any:
    fields: dict[str, Any] = {
        "name": seat,
        "lifecycle_uid": uid,
        "instance": holder,
        "host": f"host-{holder[0]}",
        "state": state,
        "generation": generation,
        "attempt_id": None,
        "presence_instance": None,
        "manager_live": True,
        **over,
    }
    return fleet.FleetRow(**fields)


@pytest.mark.anyio
async def test_a_seat_a_move_carries_is_in_transit_to_its_destination_until_it_runs_there(
    bare_broker: SharedBroker,
) -> None:
    space = "transit"
    async with broker_at(bare_broker.url, bare_broker.creds) as js:
        await footprint.ensure_kv(js, names.custody_bucket(space), ttl=None)
        leases = await footprint.ensure_kv(js, names.manager_bucket(space), ttl=60)
        presence = await footprint.ensure_kv(js, names.presence_bucket(space), ttl=60)
        for instance in (A, B):
            lease = ManagerLease(
                holder=instance, root="/r", pid=7, since=WHEN, host=f"host-{instance[0]}"
            )
            await leases.put(names.lease_key(instance), encode(lease))
        # `src` is cut at A (generation 3) and moved to B; `back` is cut at A (generation 0),
        # refused by B and taken back by A.
        await put_custody(js, space, "src", SRC_UID, A, 3, None)
        await put_custody(js, space, "back", BACK_UID, A, 0, None)
        held = [row("back", BACK_UID, A, "held", 0), row("src", SRC_UID, A, "held", 3)]
        # No move bucket: nothing is in transit, and the roster does not make one.
        assert await fleet.roster(js, space) == held
        with pytest.raises(BucketNotFoundError):
            await js.object_store(names.move_bucket(space))

        # A pre-copied bundle says nothing of itself and marks nothing.
        await carry.put(js, space, "precopy-src", b"history")
        assert await fleet.roster(js, space) == held
        for attempt, seat, uid, generation in (
            (ATTEMPT, "src", SRC_UID, 3),
            ("20261203T170001Z-0a1b2c3e", "back", BACK_UID, 0),
        ):
            meta = CarriedMeta(
                source=A,
                attempt_id=attempt,
                seats=[CarriedSeat(name=seat, lifecycle_uid=uid, generation=generation)],
                to=B,
            )
            await carry.put(js, space, attempt, b"packed " + seat.encode(), meta=meta)
        assert await fleet.roster(js, space) == [
            row("back", BACK_UID, A, "in transit", 0, to=B),
            row("src", SRC_UID, A, "in transit", 3, to=B),
        ]

        # B claims `src` (generation 4) and starts it: in transit to B, now B's; `back` is
        # claimed back by A (generation 1): held at A, whatever copy the bucket keeps.
        await put_custody(js, space, "src", SRC_UID, B, 4, ATTEMPT)
        await put_custody(js, space, "back", BACK_UID, A, 1, "20261203T170001Z-0a1b2c3e")
        claimed = row("src", SRC_UID, B, "in transit", 4, attempt_id=ATTEMPT, to=B)
        back = row("back", BACK_UID, A, "held", 1, attempt_id="20261203T170001Z-0a1b2c3e")
        assert await fleet.roster(js, space) == [back, claimed]

        # `src` runs at B: running, and no longer in transit although its object is still there.
        entry = Presence(
            seat="src", lifecycle_uid=SRC_UID, instance_id=B, agent="scribe", pid=42, since=WHEN
        )
        await presence.put(f"local.src.{SRC_UID}", encode(entry))
        running = row("src", SRC_UID, B, "running", 4, attempt_id=ATTEMPT, presence_instance=B)
        assert await fleet.roster(js, space) == [back, running]
        assert await carry.drop(js, space, ATTEMPT) is True
        assert await fleet.roster(js, space) == [back, running]


async def renewing(kv: Any, key: str, value: bytes, every_s: float) -> None:
    while True:
        await kv.put(key, value)
        await anyio.sleep(every_s)


@pytest.mark.anyio
async def test_instance_gone_returns_once_the_lease_is_deleted_or_expired_and_not_before(
    shared_broker: SharedBroker,
) -> None:
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        # No bucket, and a bucket without the lease: gone at once.
        with anyio.fail_after(5):
            await fleet.instance_gone(js, "gone", A)
        leases = await footprint.ensure_kv(js, names.manager_bucket("gone"), ttl=60)
        with anyio.fail_after(5):
            await fleet.instance_gone(js, "gone", A)

        value = encode(ManagerLease(holder=A, root="/r", pid=7, since=WHEN, host="host-a"))
        other = encode(ManagerLease(holder=B, root="/r", pid=8, since=WHEN, host="host-b"))
        await leases.put(names.lease_key(A), value)
        await leases.put(names.lease_key(B), other)
        done = anyio.Event()

        async def wait_gone() -> None:
            await fleet.instance_gone(js, "gone", A)
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_gone)
            # Renewed as a manager renews it, for longer than the renew window thrice over, and
            # another manager's lease deleted beside it: A is not gone.
            async with anyio.create_task_group() as renew:
                renew.start_soon(
                    renewing, leases, names.lease_key(A), value, names.MANAGER_LEASE_RENEW_S
                )
                await leases.delete(names.lease_key(B))
                await anyio.sleep(3 * (names.MANAGER_LEASE_RENEW_S + fleet.GONE_CHECK_S))
                assert not done.is_set()
                renew.cancel_scope.cancel()
            await leases.delete(names.lease_key(A))
            with anyio.fail_after(3):
                await done.wait()

        # Expired: a bucket whose TTL is 2 s, a lease renewed and then no more.
        short = await footprint.ensure_kv(js, names.manager_bucket("expiry"), ttl=2.0)
        done = anyio.Event()

        async def wait_expired() -> None:
            await fleet.instance_gone(js, "expiry", A)
            done.set()

        await short.put(names.lease_key(A), value)
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_expired)
            async with anyio.create_task_group() as renew:
                renew.start_soon(renewing, short, names.lease_key(A), value, 0.5)
                # Three TTLs of renewing: alive all along.
                await anyio.sleep(6.0)
                assert not done.is_set()
                renew.cancel_scope.cancel()
            stopped = anyio.current_time()
            # Its TTL runs out within 2 s of the last renew; a renew overdue is noticed within
            # the renew window and a check: so within those, and a check and a second of slack.
            with anyio.fail_after(names.MANAGER_LEASE_RENEW_S + 2 * fleet.GONE_CHECK_S + 2.0):
                await done.wait()
            # Not before the lease could have expired.
            assert anyio.current_time() - stopped >= 1.5


@pytest.mark.anyio
async def test_instance_gone_rides_out_the_lease_buckets_election(nats_cluster: Cluster) -> None:
    """The lease bucket's leader dies while `instance_gone` waits: it keeps waiting through the
    election (the lease is still there), and returns once the lease is deleted after it."""
    cluster = nats_cluster
    stream = f"KV_{names.manager_bucket('ride')}"
    nc = await nats.connect(servers=cluster.urls.split(","), nkeys_seed=cluster.creds)
    try:
        js = nc.jetstream()
        leases = await footprint.ensure_kv(js, names.manager_bucket("ride"), ttl=60, replicas=3)
        value = encode(ManagerLease(holder=A, root="/r", pid=7, since=WHEN, host="host-a"))
        await leases.put(names.lease_key(A), value)
        # The leader is a node this connection does not use: the election is the only fault.
        ours = next(n.name for n in cluster.nodes if n.client_url == nc.connected_url.geturl())
        await place_leader(cluster, stream, None, off=ours)
        async with cluster_nc(cluster) as probe:
            victim = await leader_of(probe, stream)
        assert victim is not None and victim != ours
        done = anyio.Event()

        async def wait_gone() -> None:
            await fleet.instance_gone(js, "ride", A)
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_gone)
            cluster.kill(victim)
            elections: dict[str, float] = {}
            await election_seconds(cluster, stream, time.monotonic(), victim, elections)
            # No renew comes the whole time, so past the renew window it asks the bucket, across
            # the election and after it: the lease is there, so it waits on.
            await anyio.sleep(names.MANAGER_LEASE_RENEW_S + 3 * fleet.GONE_CHECK_S)
            assert not done.is_set(), elections
            await riding_elections("delete lease", lambda: leases.delete(names.lease_key(A)))
            with anyio.fail_after(names.MANAGER_LEASE_RENEW_S + 2 * fleet.GONE_CHECK_S + 2.0):
                await done.wait()
    finally:
        await nc.close()


@pytest.mark.anyio
async def test_a_seat_whose_managers_lease_lapsed_is_lost_and_a_send_to_it_is_queued(
    shared_broker: SharedBroker, two_roots: tuple[Cli, Cli]
) -> None:
    """Issue 39, item 5: root A's manager killed (no word that it stopped), its lease runs out:
    its seat is `lost` since A was last seen, with what can take it over; a seat's send to it
    and the operator's send at the broker queue it and say so, never `delivered`; a send to a
    live seat, here or on another manager, still is."""
    a, b = two_roots
    alpha = a.json("spawn", "alpha", "--agent", "scribe")
    b.json("spawn", "delta", "--agent", "scribe")
    b.json("spawn", "beta", "--agent", "scribe", "--allow-send", "alpha", "--allow-send", "delta")
    ia, uid = alpha["instanceId"], alpha["lifecycleUid"]
    durable = f"dm_local-alpha-{uid}"
    # Another manager's seat whose manager lives: delivered, as ever.
    assert ask(b, "beta", "Tell alpha: first, while your host lives") == "Told alpha: delivered."
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        # Alpha's turn on it done and acknowledged: its inbox empty before its host goes.
        with anyio.fail_after(60):
            while True:
                info = await js.consumer_info("DM_main", durable)
                if not info.num_pending and not info.num_ack_pending:
                    break
                await anyio.sleep(0.2)

    manager_a = a.json("status")["pid"]
    os.kill(manager_a, signal.SIGKILL)
    await wait_gone([manager_a, alpha["pid"]])
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        with anyio.fail_after(30):
            await fleet.instance_gone(js, "main", ia)
        # The broker drops an expired entry lazily: a read may still meet the lease or the
        # presence for a moment, and the row is running or held until it does not.
        with anyio.fail_after(20):
            while (rows := await fleet.roster(js, "main"))[0].state != "lost":
                assert rows[0].state in ("running", "held"), rows[0]
                await anyio.sleep(0.5)
    read_at = datetime.now(UTC)
    [lost_row, beta_row, delta_row] = fleet_of(b)
    since = lost_row["since"]
    hint = fleet.takeover_hint("alpha", ia, [])
    assert lost_row == fleet_row("alpha", uid, ia, None, "lost", since=since, takeover=hint)
    assert (beta_row["state"], delta_row["state"]) == ("running", "running")
    # Last seen alive: at A's manager's start or its seat's spawn, whichever is newer; not
    # after its lease's last renewal, which was at least one lease TTL before now.
    seen = parse_instant(since)
    assert parse_instant(alpha["startedAt"]) - timedelta(seconds=2) <= seen
    # The holder's last write (a presence heartbeat) may follow its last lease renewal by up
    # to one renewal interval; the lease then lived one TTL past that renewal.
    assert seen <= read_at - timedelta(
        seconds=names.MANAGER_LEASE_TTL_S - names.MANAGER_LEASE_RENEW_S
    )

    table = fleet_of(b, as_json=False).splitlines()
    assert table[0].split() == ["NAME", "INSTANCE", "HOST", "STATE", "GEN", "TO"]
    cells = table[1].split()
    assert cells[:4] == ["alpha", ia, "-", "lost"] and cells[5:] == ["0", "-"]
    assert cells[4][-1] in "smhd", cells
    assert table[4] == (f"alpha ({uid}): lost: {ia} has no lease, last seen alive {since}; {hint}")

    # A seat's send to it: queued in its inbox, said so.
    assert ask(b, "beta", "Tell alpha: second, your host is gone") == (
        f"Told alpha: queued; its host is unreachable since {since}."
    )
    # A seat of its own manager, and so one whose host lives: delivered.
    assert ask(b, "beta", "Tell delta: hello") == "Told delta: delivered."
    # The operator's send at the broker: the same words, for people and in --json.
    server = ["--server", shared_broker.url, "--creds", shared_broker.creds]
    sent = b.json("send", "alpha", "third, from the operator", *server)
    assert sent["unreachableSince"] == since
    assert sent["message"] == f"queued; its host is unreachable since {since}"
    said = b.run("send", "alpha", "fourth, from the operator", *server).stdout
    assert re.fullmatch(
        rf"queued; its host is unreachable since {re.escape(since)}: \S+ for alpha at the broker"
        r" \(stream seq \d+\)\n",
        said,
    ), said
    # Beta's operator send to a live seat says no such thing.
    live = b.json("send", "delta", "to a live seat", *server)
    assert (live["unreachableSince"], live["message"]) == (None, None)
    # The three sent since are in alpha's inbox, queued for whoever runs it next.
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        info = await js.consumer_info("DM_main", durable)
    assert (info.num_pending, info.num_ack_pending) == (3, 0)
