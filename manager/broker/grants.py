"""Broker grants: each host's broker user may write as the seats it holds custody of, and as no
other seat (docs/design.md, "Credentials scoped by the broker").

A broker started with grants (`COTAL_BROKER_GRANTS`, `cotal broker serve --grants`, a cluster
rendered with `auth_include`) takes its `authorization` block from `grants/auth.conf` under its
store. The grant keeper (`manager/broker/keeper.py`) rewrites that file from the custody bucket
whenever custody changes and has nats-server reload it: nats-server applies a user's new
permissions to its live connections in place, so a grant moves with custody without a
reconnect. Once the broker runs the new file, the keeper records each holder's granted seats in
`cotal_grants_<space>`, and a manager that won custody waits for that record (`wait_granted`)
before it writes its fence marker: from the marker on, the old holder is refused by the broker
whatever headers it sends.

This module is the pure part (the records on disk, the subjects of a grant, the rendered
block) and the manager's wait; it imports no nats-py at its top.
"""

from __future__ import annotations

import json
import os
import subprocess
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import msgspec

from manager.workspace.private import ensure_private_dir, write_private_atomic
from protocol import names
from protocol.errors import Refusal
from protocol.refusals import Code

if TYPE_CHECKING:
    from nats.js import JetStreamContext

T = TypeVar("T")

GRANTS_ENV = "COTAL_BROKER_GRANTS"
# embedded.py reads both names without importing this module.
GRANTS_DIR = "grants"
PROBE_PREFIX = "cotal-grants.probe"
GRANT_WAIT_S = 15.0
RECORD_CAP = 1 << 20


class Host(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One broker user: its nkey, and the holders (manager instance ids) it answers for. `root`
    is an embedded broker's own root, whose instance identities are its holders."""

    name: str
    nkey: str
    holders: list[str] = []
    root: str | None = None


class Hosts(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    hosts: list[Host]


class Target(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One nats-server the keeper reloads: its client URL and the pid file its config names."""

    url: str
    pid_file: str


class KeeperConfig(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    spaces: list[str]
    replicas: int
    targets: list[Target]
    # Leave when every target is gone (an embedded or standalone broker); a cluster's keeper
    # outlives a node's restart.
    exit_with_broker: bool = True


class Grant(msgspec.Struct, forbid_unknown_fields=True):
    """What the broker runs for one holder: each seat it may write as, at its generation."""

    version: int
    seats: dict[str, int]


def grants_dir(store_dir: Path) -> Path:
    return store_dir / GRANTS_DIR


def keeper_seed(gdir: Path) -> Path:
    return gdir / "keeper.seed"


def hosts_file(gdir: Path) -> Path:
    return gdir / "hosts.json"


def auth_conf(gdir: Path) -> Path:
    return gdir / "auth.conf"


def keeper_config_file(gdir: Path) -> Path:
    return gdir / "keeper.json"


def ready_file(gdir: Path) -> Path:
    return gdir / "keeper.ready"


def grants_bucket(space: str) -> str:
    return f"cotal_grants_{names.check_space(space)}"


def grant_key(holder: str) -> str:
    return f"grant.{holder}"


def spaces_from_env(raw: str) -> list[str]:
    """`COTAL_BROKER_GRANTS=1` grants space `main`; a comma-separated list names the spaces."""
    if raw.strip() in ("1", "true", "yes", "on"):
        return ["main"]
    return [names.check_space(s.strip()) for s in raw.split(",") if s.strip()]


# -- the records on disk --------------------------------------------------------------------------


def _decode(data: bytes, kind: type[T], what: str) -> T:
    try:
        return msgspec.json.decode(data, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Refusal(
            Code.BAD_CREDS, f"{what} is malformed: {exc}", f"fix or remove {what}"
        ) from None


def read_hosts(gdir: Path) -> Hosts:
    path = hosts_file(gdir)
    if not path.exists():
        return Hosts(version=1, hosts=[])
    return _decode(path.read_bytes()[:RECORD_CAP], Hosts, str(path))


def write_hosts(gdir: Path, hosts: Hosts) -> None:
    write_private_atomic(hosts_file(gdir), msgspec.json.encode(hosts))


def read_keeper_config(gdir: Path) -> KeeperConfig:
    path = keeper_config_file(gdir)
    return _decode(path.read_bytes()[:RECORD_CAP], KeeperConfig, str(path))


def decode_grant(data: bytes) -> Grant:
    return msgspec.json.decode(data, type=Grant)


def add_host(gdir: Path, host: Host) -> None:
    """Register (or replace) one host by name."""
    ensure_private_dir(gdir)
    hosts = read_hosts(gdir)
    kept = [h for h in hosts.hosts if h.name != host.name and h.nkey != host.nkey]
    write_hosts(gdir, Hosts(version=1, hosts=[*kept, host]))


def new_host(gdir: Path, name: str, holders: list[str]) -> Path:
    """A fresh credential for a host that will hold custody as `holders`, registered; the
    path of its seed (0600), which the host passes as `--creds`."""
    from manager.broker.seeds import generate_user_seed

    names.check_seat_name(name)
    creds = ensure_private_dir(ensure_private_dir(gdir) / "hosts") / f"{name}.creds"
    add_host(gdir, Host(name=name, nkey=generate_user_seed(creds), holders=holders))
    return creds


def revoke_host(gdir: Path, name: str) -> bool:
    """Drop a host: at the keeper's next reload the broker closes its connections and refuses
    its credential. False when no host has that name."""
    hosts = read_hosts(gdir)
    kept = [h for h in hosts.hosts if h.name != name]
    if len(kept) == len(hosts.hosts):
        return False
    write_hosts(gdir, Hosts(version=1, hosts=kept))
    (gdir / "hosts" / f"{name}.creds").unlink(missing_ok=True)
    return True


def root_holders(root: str, spaces: Iterable[str]) -> list[str]:
    """The instance ids of an embedded broker's own root, one per space it has started."""
    from manager.workspace.identity import InstanceRecord
    from manager.workspace.layout import Layout

    found = []
    for space in spaces:
        path = Layout.at(root).instance_identity(space)
        try:
            record = msgspec.json.decode(path.read_bytes()[:RECORD_CAP], type=InstanceRecord)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            continue
        found.append(record.instance_id)
    return found


def holders_of(host: Host, spaces: Iterable[str]) -> set[str]:
    mine = set(host.holders)
    if host.root is not None:
        mine.update(root_holders(host.root, spaces))
    return mine


# -- the subjects of a grant ----------------------------------------------------------------------


def common_publish() -> list[str]:
    """What every host may publish: the JetStream and bucket APIs, replies, and the subjects of
    no single seat (channel posts, a move's requests, lifecycle events)."""
    return [
        "$JS.>",
        "$KV.>",
        "$O.>",
        "$SYS.>",
        "_INBOX.>",
        "cotal.*.chan.*",
        "cotal.*.chan.*.carried.*",
        "cotal.*.move.>",
        "cotal.*.events.>",
    ]


def seat_publish(space: str, seat: str) -> list[str]:
    """What only the holder of `seat` may publish: its writes as the seat (its sends and its
    fence marker), writes into its inbox (the operator's mail, a redelivery, an inbox carried in
    by a move) and its post marker."""
    prefix = names.subject_prefix(space)
    owner = names.SEAT_OWNER
    return [
        f"{prefix}.inst.*.*.{owner}.{seat}",
        f"{prefix}.inst.{owner}.{seat}.>",
        names.chan_fence_subject(space, owner, seat),
    ]


# JetStream's verbs that destroy what every seat shares: cotal deletes no stream and removes no
# server, so no host needs them, and one that could would take every seat's inbox with it.
DESTRUCTIVE = [
    "$JS.API.STREAM.DELETE.>",
    "$JS.API.ACCOUNT.PURGE.>",
    "$JS.API.SERVER.REMOVE",
    "$JS.API.STREAM.PEER.REMOVE.>",
]


def lifecycle_private(space: str, seat: str, uid: str) -> list[str]:
    """What only the holder of one seat lifecycle may touch in JetStream: its inbox durable
    (made, pulled, acknowledged, paused, reset, deleted), its presence, its sent ledger and its
    dead letters. Every other host is denied them, and a deny outranks every allow."""
    owner = names.SEAT_OWNER
    stream, durable = names.dm_stream(space), names.dm_durable(owner, seat, uid)
    api = "$JS.API.CONSUMER"
    return [
        f"{api}.CREATE.{stream}.{durable}",
        f"{api}.CREATE.{stream}.{durable}.>",
        f"{api}.DURABLE.CREATE.{stream}.{durable}",
        f"{api}.DELETE.{stream}.{durable}",
        f"{api}.MSG.NEXT.{stream}.{durable}",
        f"{api}.PAUSE.{stream}.{durable}",
        f"{api}.RESET.{stream}.{durable}",
        f"{api}.UNPIN.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
        f"$KV.{names.presence_bucket(space)}.{names.presence_key(owner, seat, uid)}",
        f"$KV.{names.sent_bucket(space)}.{names.check_lifecycle_uid(uid)}.>",
        names.dead_subject(space, owner, seat, uid),
    ]


def instance_private(space: str, instance: str) -> list[str]:
    """A manager instance's own keys: its lease and its up/down mark."""
    return [
        f"$KV.{names.manager_bucket(space)}.{names.lease_key(instance)}",
        f"$KV.{names.custody_bucket(space)}.{names.manager_mark_key(instance)}",
    ]


def _permissions(allow: list[str], deny: list[str]) -> str:
    publish = f"allow: {json.dumps(allow)}"
    if deny:
        publish += f", deny: {json.dumps(deny)}"
    # Nothing may subscribe under $SYS: the broker's own answers are eviction evidence.
    return f'permissions: {{ publish: {{ {publish} }}, subscribe: {{ deny: ["$SYS.>"] }} }}'


Lifecycle = tuple[str, str, str]
"""(holder, seat, lifecycle uid): one custody record."""


def _host_deny(
    spaces: list[str],
    mine: set[str],
    others: set[str],
    lifecycles: Mapping[str, Iterable[Lifecycle]],
) -> list[str]:
    deny = [f"$KV.{grants_bucket(s)}.>" for s in spaces] + DESTRUCTIVE
    for space in spaces:
        for holder, seat, uid in sorted(lifecycles.get(space, ())):
            if holder not in mine:
                deny += lifecycle_private(space, seat, uid)
        for instance in sorted(others - mine):
            deny += instance_private(space, instance)
    return deny


def render_auth(
    keeper_pub: str,
    probe: str,
    hosts: Iterable[Host],
    held: Mapping[str, Mapping[str, Mapping[str, int]]],
    lifecycles: Mapping[str, Iterable[Lifecycle]] | None = None,
) -> str:
    """The `authorization` block: the keeper's user, and each host's user with the common
    subjects and its seats'. `held` is space -> holder -> seat -> generation, `lifecycles`
    space -> the custody records behind it (each denied to every host but its holder's); the
    probe subject lets the keeper see that the broker runs this very text."""
    spaces, hosts = sorted(held), list(hosts)
    records = {s: list(v) for s, v in (lifecycles or {}).items()}
    keeper = ["$JS.>", "$KV.>", "_INBOX.>", f"{PROBE_PREFIX}.{probe}"]
    users = [f"    {{ nkey: {json.dumps(keeper_pub)}, {_permissions(keeper, [])} }}"]
    by_host = {h.name: holders_of(h, spaces) for h in hosts}
    registered = set().union(*by_host.values()) if by_host else set()
    for host in sorted(hosts, key=lambda h: h.name):
        mine = by_host[host.name]
        allow = common_publish()
        for space in spaces:
            for holder in sorted(mine):
                for seat in sorted(held[space].get(holder, {})):
                    allow += seat_publish(space, seat)
        deny = _host_deny(spaces, mine, registered, records)
        users.append(f"    {{ nkey: {json.dumps(host.nkey)}, {_permissions(allow, deny)} }}")
    return "\n".join(["authorization {", "  users = [", *users, "  ]", "}", ""])


def write_auth(gdir: Path, text: str) -> None:
    write_private_atomic(auth_conf(gdir), text.encode())


def prepare(store_dir: Path, spaces: list[str], hosts: Iterable[Host]) -> Path:
    """A grants directory ready for a broker's start: the keeper's seed, the registry and, for
    a first start, an `auth.conf` granting no seat yet (a restart keeps the grants the last
    keeper wrote until its successor rewrites them). Returns the directory."""
    from manager.broker.seeds import generate_user_seed, public_key_of

    gdir = ensure_private_dir(grants_dir(store_dir))
    seed = keeper_seed(gdir)
    keeper_pub = public_key_of(seed) if seed.exists() else generate_user_seed(seed)
    for host in hosts:
        add_host(gdir, host)
    if not auth_conf(gdir).exists():
        held: dict[str, dict[str, dict[str, int]]] = {s: {} for s in spaces}
        write_auth(gdir, render_auth(keeper_pub, "init", read_hosts(gdir).hosts, held))
    return gdir


def write_keeper_config(gdir: Path, config: KeeperConfig) -> None:
    write_private_atomic(keeper_config_file(gdir), msgspec.json.encode(config))


# -- the manager's wait ---------------------------------------------------------------------------

# Connections known to serve no grants (no `cotal_grants_<space>` bucket), per space.
_ungranted: weakref.WeakKeyDictionary[object, set[str]] = weakref.WeakKeyDictionary()


async def wait_granted(
    js: JetStreamContext,
    space: str,
    holder: str,
    seats: Mapping[str, int],
    *,
    timeout: float = GRANT_WAIT_S,
) -> None:
    """Return once the broker grants `holder` each seat at its generation or later; at once on
    a broker that serves no grants. A manager calls it after it won custody and before its
    first write as the seat."""
    import anyio
    from nats.js.errors import BucketNotFoundError

    conn = getattr(js, "_nc", js)
    if not seats or space in _ungranted.get(conn, set()):
        return
    from manager.broker.retry import riding_elections

    bucket = grants_bucket(space)
    try:
        kv = await riding_elections(f"bucket {bucket}", lambda: js.key_value(bucket))
    except BucketNotFoundError:
        _ungranted.setdefault(conn, set()).add(space)
        return
    watcher = await kv.watch(grant_key(holder))
    try:
        with anyio.fail_after(timeout):
            async for entry in watcher:
                if entry is None or not entry.value:
                    continue
                grant = decode_grant(entry.value)
                if all(grant.seats.get(s, -1) >= g for s, g in seats.items()):
                    return
    except TimeoutError:
        raise Refusal(
            Code.CUSTODY_NOT_HELD,
            f"the broker has not granted instance {holder} the seats {sorted(seats)} within "
            f"{timeout:g}s of winning their custody",
            "check that the broker's grant keeper runs (its log is grants/keeper.log in the "
            "broker's store) and that this host's credential is registered for this instance",
        ) from None
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]


def pid_alive(pid_file: str) -> int | None:
    """The pid a target's pid file names, if that process lives."""
    try:
        pid = int(Path(pid_file).read_text().strip() or "0")
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def spawn_keeper(gdir: Path, *, timeout: float = 30.0) -> subprocess.Popen[bytes]:
    """Start the keeper for `gdir` in a session of its own and wait until it has applied the
    grants once; its pid. It leaves by itself when its broker is gone (unless its config says
    otherwise)."""
    import time

    from connectors.interpreter import own_python

    ready = ready_file(gdir)
    ready.unlink(missing_ok=True)
    log = open(gdir / "keeper.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(
            [*own_python("manager.broker.keeper"), str(gdir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        log.close()
    deadline = time.monotonic() + timeout
    while not ready.exists():
        rc = proc.poll()
        if rc is not None or time.monotonic() > deadline:
            if rc is None:
                proc.kill()
                proc.wait()
            raise Refusal(
                Code.BROKER_FAILED,
                f"the broker's grant keeper did not start (exit {rc})",
                f"read {gdir / 'keeper.log'} for the reason",
            )
        time.sleep(0.02)
    return proc
