"""Credentials scoped by the broker (issue 38, item 4), on real nats-servers.

Each host connects as its own broker user. The grant keeper (manager/broker/keeper.py) turns the
custody bucket into each user's publish permissions and has nats-server reload them in place:
a host may write as the seats it holds custody of and as no other, and when custody moves the
broker refuses the old holder's writes as the seat (and into its inbox) even with no header at
all, while the old holder's connection stays up for the seats it still holds. A host revoked
from the registry is disconnected and refused. Seats never hold a broker credential.

One standalone broker (`cotal broker serve --grants`) is shared by the standalone cases; the
cluster case runs its own three nodes with one keeper.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from manager.broker import custody, grants
from manager.broker.embedded import start_embedded, stop_embedded
from manager.broker.fence import WriterFence
from manager.broker.footprint import ensure_dm_stream, ensure_kv
from protocol import names
from protocol.errors import Refusal
from tests.cluster import Cluster
from tests.conftest import Cli, cotal_env
from tests.helpers import stop_broker

pytestmark = pytest.mark.anyio

SPACE = "main"
WAIT_S = 20.0


@dataclass
class GrantedBroker:
    url: str
    store: Path
    proc: subprocess.Popen[str]

    @property
    def grants_dir(self) -> Path:
        return grants.grants_dir(self.store)

    def add_host(self, name: str, holders: list[str]) -> str:
        return str(grants.new_host(self.grants_dir, name, holders))


@pytest.fixture(scope="module")
def granted_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrantedBroker]:
    store = tmp_path_factory.mktemp("granted") / "broker"
    proc = subprocess.Popen(
        [sys.executable, "-m", "manager.cli", "broker", "serve", "--store-dir", str(store)]
        + ["--grants", SPACE, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cotal_env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(f"broker serve failed: {proc.stderr.read() if proc.stderr else ''}")
    yield GrantedBroker(json.loads(line)["url"], store, proc)
    stop_broker(proc)


@dataclass
class Host:
    nc: Client
    js: JetStreamContext
    holder: str
    creds: str = ""
    errors: list[str] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)

    async def refused(self, subject: str) -> None:
        """A core publish with no header at all, refused by the broker as a permissions
        violation; and nothing of it stored."""
        await self.nc.publish(subject, b"stale write")
        await self.nc.flush()
        # nats-py hands the server's -ERR text on lowercased.
        want = f'permissions violation for publish to "{subject}"'.lower()
        with anyio.fail_after(WAIT_S):
            while not any(want in e.lower() for e in self.errors):
                await self.changed.wait()
        try:
            last = await self.js.get_last_msg(names.dm_stream(SPACE), subject)
        except NotFoundError:
            return
        assert last.data != b"stale write"

    async def lands(self, subject: str) -> None:
        ack = await self.js.publish(subject, b"holder's write")
        assert ack.seq


@asynccontextmanager
async def host(url: str, creds: str, holder: str) -> AsyncIterator[Host]:
    box: list[Host] = []

    async def on_error(exc: Exception) -> None:
        if box:
            box[0].errors.append(str(exc))
            event, box[0].changed = box[0].changed, anyio.Event()
            event.set()

    nc = await _accepted(url, creds, on_error)
    box.append(Host(nc, nc.jetstream(), holder, creds))
    try:
        yield box[0]
    finally:
        await nc.close()


@asynccontextmanager
async def two_hosts(
    broker: GrantedBroker, a_name: str, b_name: str
) -> AsyncIterator[tuple[Host, Host]]:
    """Two hosts registered on the broker, each counting one fresh instance, connected."""
    a_id, b_id = names.mint_instance_id(), names.mint_instance_id()
    a_creds = broker.add_host(a_name, [a_id])
    b_creds = broker.add_host(b_name, [b_id])
    async with host(broker.url, a_creds, a_id) as a, host(broker.url, b_creds, b_id) as b:
        yield a, b


async def _accepted(url: str, creds: str, on_error: Any) -> Client:
    """Connected once the keeper has loaded the newly registered host (it reads the registry
    every half second)."""
    with anyio.fail_after(WAIT_S):
        while True:
            try:
                return await nats.connect(
                    url, nkeys_seed=creds, error_cb=on_error, allow_reconnect=False
                )
            except Exception:
                pass
            await anyio.sleep(0.05)


def _as(seat: str, to: str = "peer") -> str:
    """The subject of a write as `seat`: its DM to `to`."""
    return names.dm_subject(SPACE, names.SEAT_OWNER, to, names.SEAT_OWNER, seat)


def _into(seat: str) -> str:
    """The subject of the operator's mail into `seat`'s inbox."""
    return names.dm_subject(SPACE, names.SEAT_OWNER, seat, names.SEAT_OWNER, names.OPERATOR_ACTOR)


async def _take(h: Host, seat: str, uid: str, *, replicas: int = 1) -> WriterFence:
    """Custody of a new lifecycle and its fence, as a manager's spawn takes them."""
    kv = await custody.custody_kv(h.js, SPACE, replicas=replicas)
    await custody.establish(kv, seat, uid, h.holder)
    fence = WriterFence(h.js, SPACE, seat, h.holder, 0)
    await fence.establish()
    return fence


async def _move(old: Host, new: Host, seat: str, uid: str, *, replicas: int = 1) -> None:
    """The seat's custody moved to `new` by compare-and-set, then `new` fences it, as a resume
    does (`custody.claim`, then the manager's `WriterFence.establish`)."""
    kv = await custody.custody_kv(new.js, SPACE, replicas=replicas)
    held = await custody.read(kv, seat, uid)
    assert held is not None and held.record.holder == old.holder
    await custody.claim(
        kv,
        seat,
        uid,
        expected_revision=held.revision,
        generation=held.record.generation + 1,
        holder=new.holder,
        attempt_id=names.mint_attempt_id(),
    )
    await WriterFence(new.js, SPACE, seat, new.holder, held.record.generation + 1).establish()


async def test_a_host_writes_as_its_own_seats_only(
    granted_broker: GrantedBroker, tmp_path: Path
) -> None:
    async with two_hosts(granted_broker, "hosta", "hostb") as (a, b):
        await ensure_dm_stream(a.js, SPACE)
        await _take(a, "xa", names.mint_lifecycle_uid())
        await _take(b, "yb", names.mint_lifecycle_uid())
        await a.lands(_as("xa"))
        await a.lands(_into("xa"))
        await a.refused(_as("yb"))
        await a.refused(_into("yb"))
        await b.lands(_as("yb"))
        await b.refused(_as("xa"))

    # Revoked: the broker closes the host's connection and refuses its credential at the
    # keeper's next reload (the registry's copy of the seed goes with it; the host keeps its).
    kept = tmp_path / "hostb.creds"
    kept.write_bytes(Path(b.creds).read_bytes())
    closed = anyio.Event()

    async def on_closed() -> None:
        closed.set()

    await nats.connect(
        granted_broker.url, nkeys_seed=str(kept), allow_reconnect=False, closed_cb=on_closed
    )
    assert grants.revoke_host(granted_broker.grants_dir, "hostb")
    with anyio.fail_after(WAIT_S):
        await closed.wait()
    assert await _connect_refused(granted_broker.url, str(kept))


def _durable_api(seat: str, uid: str, verb: str) -> str:
    durable = names.dm_durable(names.SEAT_OWNER, seat, uid)
    return f"$JS.API.CONSUMER.{verb}.{names.dm_stream(SPACE)}.{durable}"


async def _make_durable(h: Host, seat: str, uid: str) -> None:
    config = api.ConsumerConfig(
        durable_name=names.dm_durable(names.SEAT_OWNER, seat, uid),
        filter_subject=names.dm_filter(SPACE, names.SEAT_OWNER, seat),
        ack_policy=api.AckPolicy.EXPLICIT,
    )
    await h.js.add_consumer(names.dm_stream(SPACE), config)


async def _pulled(h: Host, seat: str, uid: str) -> bytes:
    durable = names.dm_durable(names.SEAT_OWNER, seat, uid)
    sub = await h.js.pull_subscribe_bind(durable=durable, stream=names.dm_stream(SPACE))
    try:
        [msg] = await sub.fetch(1, timeout=WAIT_S)
        await msg.ack_sync()
        return msg.data
    finally:
        await sub.unsubscribe()


async def test_another_hosts_inbox_durable_presence_and_lease_are_the_brokers_to_refuse(
    granted_broker: GrantedBroker,
) -> None:
    """Beyond writes as a seat: only the holder of a lifecycle may pull from, acknowledge,
    make, pause or delete its inbox durable, or write its presence, sent ledger or dead
    letters; only a manager may write its own lease; no host may delete a stream."""
    async with two_hosts(granted_broker, "durablea", "durableb") as (a, b):
        await ensure_dm_stream(a.js, SPACE)
        uid = names.mint_lifecycle_uid()
        await _take(a, "inboxed", uid)
        await _make_durable(a, "inboxed", uid)
        await a.lands(_into("inboxed"))
        durable = names.dm_durable(names.SEAT_OWNER, "inboxed", uid)
        stream = names.dm_stream(SPACE)
        for subject in [
            _durable_api("inboxed", uid, "MSG.NEXT"),
            _durable_api("inboxed", uid, "DELETE"),
            _durable_api("inboxed", uid, "CREATE"),
            _durable_api("inboxed", uid, "DURABLE.CREATE"),
            f"$JS.ACK.{stream}.{durable}.1.1.1.1.0",
            f"$KV.{names.presence_bucket(SPACE)}.{names.presence_key('local', 'inboxed', uid)}",
            f"$KV.{names.sent_bucket(SPACE)}.{names.sent_key(uid, '9' * 32)}",
            names.dead_subject(SPACE, names.SEAT_OWNER, "inboxed", uid),
            f"$KV.{names.manager_bucket(SPACE)}.{names.lease_key(a.holder)}",
            f"$KV.{names.custody_bucket(SPACE)}.{names.manager_mark_key(a.holder)}",
            f"$JS.API.STREAM.DELETE.{stream}",
        ]:
            await b.refused(subject)
        # The durable is whole: the holder pulls the one message and acknowledges it.
        assert await _pulled(a, "inboxed", uid) == b"holder's write"
        info = await a.js.consumer_info(stream, durable)
        assert (info.num_pending, info.num_ack_pending) == (0, 0)
        # The holder's own lease is its to write.
        kv = await ensure_kv(a.js, names.manager_bucket(SPACE), ttl=None)
        assert await kv.put(names.lease_key(a.holder), b"{}")
        await a.refused(f"$KV.{names.manager_bucket(SPACE)}.{names.lease_key(b.holder)}")


async def test_a_host_counts_its_managers_as_they_join(granted_broker: GrantedBroker) -> None:
    """An operator registers a host by name alone; each manager that starts there asks the
    keeper to count its instance as the host's (`grants.join`), and from then on is granted
    the seats it holds. An instance another host already counts is refused to any other."""
    a_creds = granted_broker.add_host("joina", [])
    b_creds = granted_broker.add_host("joinb", [])
    a_id = names.mint_instance_id()
    async with (
        host(granted_broker.url, a_creds, a_id) as a,
        host(granted_broker.url, b_creds, names.mint_instance_id()) as b,
    ):
        await ensure_dm_stream(a.js, SPACE)
        assert await grants.join(a.nc, Path(a_creds), a_id)
        # Asking again changes nothing and is answered the same.
        assert await grants.join(a.nc, Path(a_creds), a_id)
        await _take(a, "joined", names.mint_lifecycle_uid())
        await a.lands(_as("joined"))
        await b.refused(_as("joined"))
        with pytest.raises(Refusal) as taken:
            await grants.join(b.nc, Path(b_creds), a_id)
        assert taken.value.code == "custody-not-held"
        assert f"instance {a_id} is already counted as host joina's" in str(taken.value)
        [joina] = [
            h for h in grants.read_hosts(granted_broker.grants_dir).hosts if h.name == "joina"
        ]
        assert joina.holders == [a_id]
        # No host reads the keeper's mail, so none can answer another's join in its place.
        await b.nc.subscribe(f"{grants.JOIN_PREFIX}.*")
        want = f'permissions violation for subscription to "{grants.JOIN_PREFIX}.*"'
        with anyio.fail_after(WAIT_S):
            while not any(want in e.lower() for e in b.errors):
                await b.changed.wait()


async def test_a_second_host_starts_the_keeper_and_the_first_keeps_its_seats(
    tmp_path: Path,
) -> None:
    """A mesh's broker with its own credential alone needs no keeper: that one host holds every
    custody there is (it may still not delete a stream). Registering a second host starts the
    keeper; every holder already in custody is counted as the first host's, so its seats go on
    writing, and the second host may not write as them."""
    store = tmp_path / "store"
    info = start_embedded(store, store / "auth" / "broker.creds", grants=True)
    gdir = grants.grants_dir(store)
    try:
        assert grants.keeper_pid(gdir) is None
        a_id, b_id = names.mint_instance_id(), names.mint_instance_id()
        async with host(info.url, info.creds, a_id) as a:
            await ensure_dm_stream(a.js, SPACE)
            await _take(a, "first", names.mint_lifecycle_uid())
            await a.lands(_as("first"))
            await a.refused(f"$JS.API.STREAM.DELETE.{names.dm_stream(SPACE)}")
            b_creds = str(grants.add_host_live(gdir, "second", []))
            assert grants.keeper_pid(gdir) is not None
            [local] = [h for h in grants.read_hosts(gdir).hosts if h.name == "local"]
            assert local.holders == [a_id]
            async with host(info.url, b_creds, b_id) as b:
                await b.refused(_as("first"))
                await a.lands(_as("first", to="other"))
                # The second host's own seats are its, once its manager joins.
                assert await grants.join(b.nc, Path(b_creds), b_id)
                await _take(b, "second", names.mint_lifecycle_uid())
                await b.lands(_as("second"))
                await a.refused(_as("second"))
    finally:
        stop_embedded(info.identity)
    assert grants.keeper_pid(gdir) is None


async def test_a_host_added_while_the_broker_is_down_is_kept_apart_from_its_next_start(
    tmp_path: Path,
) -> None:
    """`add-host` with the broker stopped starts no keeper; the broker's next start counts two
    hosts and starts one, which still counts the first host's holders as its own."""
    store = tmp_path / "store"
    creds = store / "auth" / "broker.creds"
    info = start_embedded(store, creds, grants=True)
    gdir = grants.grants_dir(store)
    a_id = names.mint_instance_id()
    try:
        async with host(info.url, info.creds, a_id) as a:
            await ensure_dm_stream(a.js, SPACE)
            await _take(a, "early", names.mint_lifecycle_uid())
    finally:
        stop_embedded(info.identity)
    late_creds = str(grants.add_host_live(gdir, "late", []))
    assert grants.keeper_pid(gdir) is None
    assert grants.adopt_file(gdir).read_text() == "local"
    info = start_embedded(store, creds, grants=True)
    try:
        assert grants.keeper_pid(gdir) is not None
        assert not grants.adopt_file(gdir).exists()
        async with host(info.url, info.creds, a_id) as a, host(info.url, late_creds, "") as late:
            await a.lands(_as("early"))
            await late.refused(_as("early"))
    finally:
        stop_embedded(info.identity)


async def _connect_refused(url: str, creds: str) -> bool:
    said: list[str] = []

    async def on_error(exc: Exception) -> None:
        said.append(str(exc))

    try:
        nc = await nats.connect(url, nkeys_seed=creds, error_cb=on_error, allow_reconnect=False)
    except Exception as exc:
        said.append(str(exc))
        return any("authorization violation" in e.lower() for e in said)
    await nc.close()
    return False


async def _transfer_revokes(a: Host, b: Host, *, replicas: int) -> None:
    await ensure_dm_stream(a.js, SPACE, replicas=replicas)
    moving, staying = names.mint_lifecycle_uid(), names.mint_lifecycle_uid()
    await _take(a, "mover", moving, replicas=replicas)
    await _take(a, "stayer", staying, replicas=replicas)
    await a.lands(_as("mover"))
    await _make_durable(a, "mover", moving)
    await _move(a, b, "mover", moving, replicas=replicas)
    # The old holder, no header at all: refused as the seat, into its inbox, and at its durable.
    await a.refused(_as("mover"))
    await a.refused(_into("mover"))
    await a.refused(_durable_api("mover", moving, "MSG.NEXT"))
    # The new holder writes; the old one's connection is still up for the seat it kept.
    await b.lands(_as("mover"))
    await b.lands(_into("mover"))
    assert await _pulled(b, "mover", moving) == b"holder's write"
    assert a.nc.is_connected
    await a.lands(_as("stayer"))
    # And back: the grant follows custody again.
    await _move(b, a, "mover", moving, replicas=replicas)
    await b.refused(_as("mover", to="other"))
    await a.lands(_as("mover", to="other"))


async def test_custody_moved_takes_the_grant_with_it(granted_broker: GrantedBroker) -> None:
    async with two_hosts(granted_broker, "movera", "moverb") as (a, b):
        await _transfer_revokes(a, b, replicas=1)


async def test_custody_moved_on_the_cluster_takes_the_grant_with_it(tmp_path: Path) -> None:
    with Cluster(tmp_path / "cluster", grants=True) as cluster:
        await cluster.wait_ready()
        cluster.start_keeper()
        a_id, b_id = names.mint_instance_id(), names.mint_instance_id()
        a_creds = cluster.add_host("hosta", [a_id])
        b_creds = cluster.add_host("hostb", [b_id])
        # Each host on a node of its own: every node enforces the same grants.
        first, _, last = cluster.nodes
        async with (
            host(first.client_url, a_creds, a_id) as a,
            host(last.client_url, b_creds, b_id) as b,
        ):
            await _transfer_revokes(a, b, replicas=3)


def test_a_seat_holds_no_broker_credential(cli: Cli) -> None:
    """A mesh on an embedded broker with grants: the manager waits for its grant and its seat
    runs; the seat's environment names no credential and its view of the files reads none."""
    cli.env = {grants.GRANTS_ENV: SPACE}
    gdir = grants.grants_dir(cli.root / ".cotal" / "nats")
    cli.run("up", "--detach")
    try:
        cli.json("spawn", "w1")
        assert cli.json("send", "w1", "hello", "--wait")["reply"]
        [row] = [r for r in cli.ps() if r["name"] == "w1"]
        # The manager wrote as w1 under the broker's grant, which the keeper rendered.
        assert ".inst.*.*.local.w1" in grants.auth_conf(gdir).read_text()
        auth = cli.root / ".cotal" / "auth"
        secrets = [auth / "broker.creds", grants.keeper_seed(gdir)]
        environ = Path(f"/proc/{row['pid']}/environ").read_bytes()
        for path in secrets:
            seed = path.read_bytes().strip()
            assert seed.startswith(b"SU")
            assert seed not in environ and str(path).encode() not in environ
        assert b"creds" not in environ.lower()
        isolation = [
            r
            for r in map(json.loads, cli.run("doctor", "--json").stdout.splitlines())
            if r["name"] == "isolation"
        ]
        if not isolation or not isolation[0]["hidesSecrets"]:
            pytest.skip("this host cannot hide files from a seat (no mount namespace)")
        for path in [*secrets, gdir / "hosts.json"]:
            seen = Path(f"/proc/{row['pid']}/root{path}")
            with pytest.raises(OSError):
                seen.read_bytes()
        assert os.path.exists(gdir / "auth.conf")
    finally:
        cli.run("down", check=False)


async def test_a_keeper_that_is_down_freezes_the_grants_and_catches_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the keeper gone the broker keeps enforcing the last grants: a claimant is refused
    its grant (`custody-not-held`) rather than started unfenced; a new keeper reads custody
    whole and moves the grant."""
    monkeypatch.setenv(grants.GRANTS_ENV, SPACE)
    store = tmp_path / "store"
    info = start_embedded(store, store / "auth" / "broker.creds")
    try:
        gdir = grants.grants_dir(store)
        a_id, b_id = names.mint_instance_id(), names.mint_instance_id()
        a_creds = str(grants.new_host(gdir, "hosta", [a_id]))
        b_creds = str(grants.new_host(gdir, "hostb", [b_id]))
        async with host(info.url, a_creds, a_id) as a, host(info.url, b_creds, b_id) as b:
            await ensure_dm_stream(a.js, SPACE)
            uid = names.mint_lifecycle_uid()
            await _take(a, "frozen", uid)
            os.kill(int(grants.ready_file(gdir).read_text()), signal.SIGKILL)
            kv = await custody.custody_kv(b.js, SPACE)
            held = await custody.read(kv, "frozen", uid)
            assert held is not None
            await custody.claim(
                kv,
                "frozen",
                uid,
                expected_revision=held.revision,
                generation=1,
                holder=b_id,
                attempt_id=names.mint_attempt_id(),
            )
            with pytest.raises(Refusal) as waited:
                await grants.wait_granted(b.js, SPACE, b_id, {"frozen": 1}, timeout=0.5)
            assert waited.value.code == "custody-not-held"
            await b.refused(_as("frozen"))

            keeper = grants.spawn_keeper(gdir)
            await WriterFence(b.js, SPACE, "frozen", b_id, 1).establish()
            await a.refused(_as("frozen", to="other"))
            await b.lands(_as("frozen", to="other"))
            keeper.kill()
            keeper.wait()
    finally:
        stop_embedded(info.identity)
