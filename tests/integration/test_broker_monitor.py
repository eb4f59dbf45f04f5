"""The broker's monitor is not the seats' (issue 21, item 5): the embedded broker answers no
HTTP on any port, and eviction evidence asks it over the authenticated NATS connection instead,
where a garbled, partial, forged or missing answer is a refusal, never a pass."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Set
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from manager.broker import embedded, evict
from manager.broker.evict import ACCOUNT_CONNZ, AccountConnz, evict_ghosts, verify_gone
from manager.broker.presence import live_uids, presence_kv
from protocol.errors import Refusal
from protocol.messages import Presence, encode
from tests.cluster import Cluster

pytestmark = pytest.mark.anyio

PREDECESSOR = "inst-predecessor-0001"


@pytest.fixture
def broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[embedded.BrokerInfo]:
    monkeypatch.delenv(embedded.MONITOR_ENV, raising=False)
    info = embedded.start_embedded(tmp_path / "nats", tmp_path / "auth" / "broker.creds")
    try:
        yield info
    finally:
        embedded.stop_embedded(info.identity)


@asynccontextmanager
async def client(url: str, seed: str, name: str, **kw: object) -> AsyncIterator[Client]:
    nc = await nats.connect(url, nkeys_seed=seed, name=name, allow_reconnect=False, **kw)
    try:
        yield nc
    finally:
        await nc.close()


def listening_ports(pid: int) -> set[int]:
    """Every TCP port the process listens on, read from its own sockets in /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def http_probe(port: int) -> bytes:
    """What a port says to an HTTP request for the connection list."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /connz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        return s.recv(64)


def lock_free(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_the_embedded_broker_answers_no_http_on_any_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(embedded.MONITOR_ENV, raising=False)
    store = tmp_path / "nats"
    # A store whose broker last ran with monitoring on (an older cotal): its config is
    # rewritten at the start, so the monitor does not come back with it.
    store.mkdir(mode=0o700)
    (store / "server.conf").write_text("listen: 127.0.0.1:-1\nhttp: 127.0.0.1:-1\n")
    info = embedded.start_embedded(store, tmp_path / "auth" / "broker.creds")
    try:
        assert info.monitor is None
        conf = (store / "server.conf").read_text()
        assert "http" not in conf
        [ports_file] = (store / "ports").glob("*.ports")
        assert json.loads(ports_file.read_text()) == {"nats": [info.url]}
        assert listening_ports(info.pid) == {port_of(info.url)}
        # The one port it listens on speaks NATS, not HTTP.
        assert http_probe(port_of(info.url)).startswith(b"INFO {")
    finally:
        embedded.stop_embedded(info.identity)


def test_the_operator_turns_the_monitor_on_with_cotal_broker_monitor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(embedded.MONITOR_ENV, "127.0.0.1:0")
    info = embedded.start_embedded(tmp_path / "nats", tmp_path / "auth" / "broker.creds")
    try:
        assert info.monitor is not None and info.monitor.startswith("http://127.0.0.1:")
        assert listening_ports(info.pid) == {port_of(info.url), port_of(info.monitor)}
        with urllib.request.urlopen(info.monitor + "/connz", timeout=5) as r:  # noqa: S310
            assert r.status == 200 and json.load(r)["num_connections"] == 0
        assert "http: 127.0.0.1:-1\n" in (tmp_path / "nats" / "server.conf").read_text()
    finally:
        embedded.stop_embedded(info.identity)
    # Unset again, the next start on the same store has none (once the last thread of the
    # stopped broker lets go of the store's lock).
    monkeypatch.delenv(embedded.MONITOR_ENV)
    deadline = time.monotonic() + 10
    while not lock_free(tmp_path / "nats" / "owner.lock"):
        assert time.monotonic() < deadline, "the stopped broker kept its store's lock"
        time.sleep(0.02)
    info = embedded.start_embedded(tmp_path / "nats", tmp_path / "auth" / "broker.creds")
    try:
        assert info.monitor is None and listening_ports(info.pid) == {port_of(info.url)}
    finally:
        embedded.stop_embedded(info.identity)


@pytest.mark.parametrize(
    "value",
    [
        "0.0.0.0:8222",
        "localhost:8222",
        "[::1]:8222",
        "127.0.0.1",
        "127.0.0.1:",
        "127.0.0.1:-1",
        "127.0.0.1:65536",
        "127.0.0.1:8222x",
        "127.0.0.1:\uff18\uff12",
    ],
)
def test_a_bad_monitor_setting_refuses_before_the_store_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(embedded.MONITOR_ENV, value)
    with pytest.raises(Refusal) as refused:
        embedded.start_embedded(tmp_path / "nats", tmp_path / "auth" / "broker.creds")
    assert refused.value.code == "bad-broker-monitor"
    assert refused.value.message == f"COTAL_BROKER_MONITOR={value!r} is not 127.0.0.1:PORT"
    assert "127.0.0.1:PORT" in refused.value.cure
    assert not (tmp_path / "nats").exists() and not (tmp_path / "auth").exists()


async def until_unlisted(oracle: AccountConnz, cid: int) -> None:
    """Wait until the broker's own list no longer shows a connection just closed."""
    with anyio.fail_after(10):
        while True:
            page = await oracle.page(0, 1024)
            conns = page["connections"]
            assert isinstance(conns, list)
            if cid not in {c["cid"] for c in conns}:
                return
            await anyio.sleep(0.02)


async def test_eviction_evidence_over_nats_pages_the_whole_list(
    broker: embedded.BrokerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two connections a page: the predecessor, connected last, is on the third page.
    monkeypatch.setattr(evict, "PAGE", 2)
    url, seed = broker.url, broker.creds
    async with client(url, seed, "cotal-resume") as asker:
        oracle = AccountConnz(asker)
        assert oracle.label == f"{url} {ACCOUNT_CONNZ}"
        async with (
            client(url, seed, "bystander-1"),
            client(url, seed, "bystander-2"),
            client(url, seed, "bystander-3"),
        ):
            predecessor = await nats.connect(
                url, nkeys_seed=seed, name=f"cotal-manager:{PREDECESSOR}", allow_reconnect=False
            )
            cid = predecessor.client_id
            assert cid is not None
            try:
                with pytest.raises(Refusal) as refused:
                    await verify_gone([oracle], PREDECESSOR)
                assert refused.value.code == "predecessor-live"
                assert refused.value.message == (
                    f"the predecessor manager (cotal-manager:{PREDECESSOR}) still holds a broker "
                    f"connection (cid {cid} on {oracle.label})"
                )
            finally:
                await predecessor.close()
            await until_unlisted(oracle, cid)
            proof = await verify_gone([oracle], PREDECESSOR)
            # The asker and the three bystanders: the whole list, read across pages.
            assert proof.as_dict() == {
                "instanceId": PREDECESSOR,
                "servers": [oracle.label],
                "connectionsScanned": 4,
                "remaining": 0,
            }


class Shifting:
    """The real oracle, with a real connection before the read position closed after each first
    page: the list moves under the read, as it does when a client leaves mid-scan."""

    def __init__(self, inner: AccountConnz, victims: list[Client]) -> None:
        self.inner, self.victims = inner, victims
        self.label, self.cure = inner.label, inner.cure

    async def page(self, offset: int, limit: int) -> Mapping[str, object]:
        data = await self.inner.page(offset, limit)
        if offset == 0 and self.victims:
            victim = self.victims.pop(0)
            cid = victim.client_id
            assert cid is not None
            await victim.close()
            await until_unlisted(self.inner, cid)
        return data

    def incomplete(self, cids: Set[int]) -> str | None:
        return self.inner.incomplete(cids)


async def connections(url: str, seed: str, names: list[str]) -> list[Client]:
    return [await nats.connect(url, nkeys_seed=seed, name=n, allow_reconnect=False) for n in names]


async def test_a_list_that_shifts_under_the_read_never_hides_the_predecessor(
    broker: embedded.BrokerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # [asker, b0, b1, predecessor, b2], three a page: b0 closes after the first page, and an
    # offset walk's second page (offset 3) would start past the predecessor.
    monkeypatch.setattr(evict, "PAGE", 3)
    url, seed = broker.url, broker.creds
    async with client(url, seed, "cotal-resume") as asker:
        b0, b1 = await connections(url, seed, ["b0", "b1"])
        [predecessor] = await connections(url, seed, [f"cotal-manager:{PREDECESSOR}"])
        [b2] = await connections(url, seed, ["b2"])
        try:
            with pytest.raises(Refusal) as refused:
                await verify_gone([Shifting(AccountConnz(asker), [b0])], PREDECESSOR)
            assert refused.value.code == "predecessor-live"
            assert f"cid {predecessor.client_id} on " in refused.value.message
        finally:
            for nc in (b0, b1, predecessor, b2):
                await nc.close()


async def test_a_list_that_never_holds_still_is_unverified(
    broker: embedded.BrokerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(evict, "PAGE", 3)
    url, seed = broker.url, broker.creds
    async with client(url, seed, "cotal-resume") as asker:
        bystanders = await connections(url, seed, [f"b{i}" for i in range(7)])
        try:
            oracle = Shifting(AccountConnz(asker), list(bystanders[:3]))
            with pytest.raises(Refusal) as refused:
                await verify_gone([oracle], PREDECESSOR)
            assert refused.value.code == "eviction-unverified"
            assert refused.value.message == (
                f"cannot verify the predecessor is gone: {oracle.label} changed while it was "
                "read, on each of 3 reads"
            )
            assert ACCOUNT_CONNZ in refused.value.cure
        finally:
            for nc in bystanders:
                await nc.close()


async def test_nothing_in_the_account_can_answer_in_the_brokers_place(
    broker: embedded.BrokerInfo,
) -> None:
    url, seed = broker.url, broker.creds
    errors: list[str] = []
    refused = anyio.Event()

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))
        refused.set()

    async with (
        client(url, seed, "forger", error_cb=on_error) as forger,
        client(url, seed, "cotal-resume") as asker,
    ):

        async def forge(msg: Msg) -> None:
            await msg.respond(b'{"server":{"name":"cotal-embedded","id":"X"},"data":{}}')

        await forger.subscribe(ACCOUNT_CONNZ, cb=forge)
        await forger.flush()
        with anyio.fail_after(5):
            await refused.wait()
        assert errors == [
            f'nats: permissions violation for subscription to "{ACCOUNT_CONNZ.lower()}"'
        ]
        proof = await verify_gone([AccountConnz(asker)], PREDECESSOR)
        assert proof.scanned == 2


def start_server(tmp_path: Path, body: str) -> tuple[str, subprocess.Popen[bytes]]:
    """A plain nats-server on 127.0.0.1 with the given config body; returns its URL."""
    tmp_path.mkdir(mode=0o700)
    conf = tmp_path / "server.conf"
    conf.write_text(
        f'listen: 127.0.0.1:-1\nports_file_dir: "{tmp_path}"\nserver_name: "cotal-embedded"\n'
        + body
    )
    proc = subprocess.Popen(
        [embedded.nats_server_binary(), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        for found in tmp_path.glob("*.ports"):
            try:
                return json.loads(found.read_text())["nats"][0], proc
            except ValueError:
                continue
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise AssertionError(f"nats-server did not start on {conf}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=10)


def user(tmp_path: Path, name: str, permissions: str = "") -> tuple[str, str]:
    seed = tmp_path / f"{name}.seed"
    pub = embedded.generate_user_seed(seed)
    entry = f'{{ nkey: "{pub}"{", permissions: " + permissions if permissions else ""} }}'
    return str(seed), entry


async def test_no_system_account_means_no_answer_and_no_pass(tmp_path: Path) -> None:
    seed, entry = user(tmp_path / "auth", "u")
    # Without JetStream (which needs one) a broker can run with no system account at all.
    url, proc = start_server(
        tmp_path / "srv", f"no_sys_acc: true\nauthorization {{ users = [ {entry} ] }}\n"
    )
    try:
        async with client(url, seed, "cotal-resume") as asker:
            oracle = AccountConnz(asker)
            with pytest.raises(Refusal) as refused:
                await verify_gone([oracle], PREDECESSOR)
            assert refused.value.code == "eviction-unverified"
            assert refused.value.message == (
                f"cannot verify the predecessor is gone: {oracle.label} did not answer "
                "(nats: no responders available for request)"
            )
    finally:
        stop_server(proc)


async def test_a_user_without_permission_gets_no_pass(tmp_path: Path) -> None:
    seed, entry = user(tmp_path / "auth", "u", '{ publish: { deny: ["$SYS.>"] } }')
    open_seed, open_entry = user(tmp_path / "auth", "open")
    url, proc = start_server(
        tmp_path / "srv", f"authorization {{ users = [ {entry}, {open_entry} ] }}\n"
    )
    try:
        async with client(url, seed, "cotal-resume") as asker:
            oracle = AccountConnz(asker)
            with pytest.raises(Refusal) as refused:
                await verify_gone([oracle], PREDECESSOR)
            assert refused.value.code == "eviction-unverified"
            assert refused.value.message.endswith(" did not answer (nats: timeout)")
        # The same broker answers a user allowed to ask: it was the permission, not the broker.
        async with client(url, open_seed, "cotal-resume") as asker:
            assert (await verify_gone([AccountConnz(asker)], PREDECESSOR)).scanned == 1
    finally:
        stop_server(proc)


FORGERIES: list[tuple[Callable[[int], bytes], str]] = [
    (lambda cid: b"not json", "returned a garbled answer (not JSON)"),
    (lambda cid: b"[1, 2]", "returned a garbled answer (not an object)"),
    (
        lambda cid: (
            b'{"server":{"name":"cotal-embedded","id":"S"},"error":{"code":500,'
            b'"description":"boom"}}'
        ),
        "answered an error (boom)",
    ),
    (lambda cid: b'{"server":{"name":"cotal-embedded","id":"S"}}', "returned a garbled answer"),
    (
        lambda cid: json.dumps(
            {"server": {"name": "other", "id": "S"}, "data": {"server_id": "S"}}
        ).encode(),
        "answered as 'other', not the embedded broker",
    ),
    (
        lambda cid: json.dumps(
            {
                "server": {"name": "cotal-embedded", "id": "S"},
                "data": {"server_id": "S", "total": "1", "offset": 0, "connections": []},
            }
        ).encode(),
        "returned a garbled connection list",
    ),
    # A well-formed empty list: the asker itself is missing from it, so it is not the list.
    (
        lambda cid: json.dumps(
            {
                "server": {"name": "cotal-embedded", "id": "S"},
                "data": {"server_id": "S", "total": 0, "offset": 0, "connections": []},
            }
        ).encode(),
        "returned a list without this connection",
    ),
    # Partial: one connection of five, and no more however it is paged.
    (
        lambda cid: json.dumps(
            {
                "server": {"name": "cotal-embedded", "id": "S"},
                "data": {
                    "server_id": "S",
                    "total": 5,
                    "offset": 0,
                    "connections": [{"cid": cid, "name": "cotal-resume"}],
                },
            }
        ).encode(),
        "listed 1 of 5 connections",
    ),
]


async def test_a_garbled_or_partial_answer_is_never_a_pass(tmp_path: Path) -> None:
    seed, entry = user(tmp_path / "auth", "u")
    # No system account, so the only answer is the one a client of the account sends.
    url, proc = start_server(
        tmp_path / "srv", f"no_sys_acc: true\nauthorization {{ users = [ {entry} ] }}\n"
    )
    try:
        async with (
            client(url, seed, "forger") as forger,
            client(url, seed, "cotal-resume") as asker,
        ):
            forged: list[Callable[[int], bytes]] = []
            cid = asker.client_id
            assert cid is not None

            async def answer(msg: Msg) -> None:
                await msg.respond(forged[0](cid))

            await forger.subscribe(ACCOUNT_CONNZ, cb=answer)
            await forger.flush()
            # Under load the forger's interest was once not yet there for the asker's first
            # request (no responders): every forgery below is asked only once an answer came back.
            forged[:] = [lambda _cid: b"ready"]
            with anyio.fail_after(10):
                while True:
                    try:
                        ready = await asker.request(ACCOUNT_CONNZ, b"{}", timeout=1)
                    except nats.errors.NoRespondersError:
                        await anyio.sleep(0.05)
                        continue
                    assert ready.data == b"ready", ready.data
                    break
            for make, detail in FORGERIES:
                forged[:] = [make]
                oracle = AccountConnz(asker)
                with pytest.raises(Refusal) as refused:
                    await verify_gone([oracle], PREDECESSOR)
                assert refused.value.code == "eviction-unverified", detail
                assert refused.value.message.startswith(
                    f"cannot verify the predecessor is gone: {oracle.label} {detail}"
                ), refused.value.message
    finally:
        stop_server(proc)


async def test_one_node_of_a_cluster_is_not_the_whole_list(nats_cluster: Cluster) -> None:
    node = nats_cluster.nodes[0]
    async with client(node.client_url, nats_cluster.creds, "cotal-resume") as asker:
        # Even named as the node it is: its answer would list that node's connections only.
        oracle = AccountConnz(asker, server_name=node.name)
        with pytest.raises(Refusal) as refused:
            await verify_gone([oracle], PREDECESSOR)
        assert refused.value.code == "eviction-unverified"
        assert refused.value.message == (
            f"cannot verify the predecessor is gone: {oracle.label} is one node of a cluster: "
            "its answer lists that node's connections"
        )


async def put_ghost(nc: Client, uid: str) -> int:
    kv = await presence_kv(nc.jetstream(), "main")
    return await kv.put(
        f"local.ghost.{uid}",
        encode(
            Presence(
                seat="ghost",
                lifecycle_uid=uid,
                instance_id=PREDECESSOR,
                agent="scribe",
                pid=1,
                since="2026-11-29T00:00:00Z",
            )
        ),
    )


async def test_a_ghost_is_retired_only_once_its_manager_is_gone(
    broker: embedded.BrokerInfo,
) -> None:
    url, seed, uid = broker.url, broker.creds, "uidghost0001"
    async with client(url, seed, "cotal-resume") as asker:
        js = asker.jetstream()
        oracle = AccountConnz(asker)
        predecessor = await nats.connect(
            url, nkeys_seed=seed, name=f"cotal-manager:{PREDECESSOR}", allow_reconnect=False
        )
        try:
            revision = await put_ghost(asker, uid)
            live = await live_uids(js, "main")
            # No connection list to ask: the uid stays live for the identity gate to refuse.
            kept = await evict_ghosts(js, "main", {"ghost": uid}, live, [])
            assert kept.evidence == [] and set(kept.live) == {uid}
            with pytest.raises(Refusal) as refused:
                await evict_ghosts(js, "main", {"ghost": uid}, live, [oracle])
            assert refused.value.code == "predecessor-live"
            kv = await presence_kv(js, "main")
            assert (await kv.get(f"local.ghost.{uid}")).revision == revision
        finally:
            cid = predecessor.client_id
            await predecessor.close()
        assert cid is not None
        await until_unlisted(oracle, cid)
        await put_ghost(asker, uid)
        live = await live_uids(js, "main")
        eviction = await evict_ghosts(js, "main", {"ghost": uid}, live, [oracle])
        assert eviction.live == {}
        assert eviction.evidence == [
            {
                "seat": "ghost",
                "instanceId": PREDECESSOR,
                "servers": [oracle.label],
                "connectionsScanned": 1,
                "remaining": 0,
            }
        ]
        assert await live_uids(js, "main") == {}
