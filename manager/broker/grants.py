"""Broker grants: each host's broker user may write as the seats it holds custody of, and as no
other seat (docs/design.md, "Credentials scoped by the broker").

A broker started with grants (every broker a mesh starts, and `cotal broker serve`, unless
told otherwise; a cluster rendered with `auth_include`) takes its `authorization` block from
`grants/auth.conf` under its store. The grant keeper (`manager/broker/keeper.py`) rewrites that
file from the custody buckets whenever custody changes and has nats-server reload it:
nats-server applies a user's new permissions to its live connections in place, so a grant
moves with custody without a reconnect. Once the broker runs the new file, the keeper records
each holder's granted seats in `cotal_grants`, and a manager that won custody waits for that
record (`wait_granted`) before it writes its fence marker: from the marker on, the old holder
is refused by the broker whatever headers it sends.

A manager joins its host first (`join`): the keeper counts its instance as the host's.

This module is the pure part (the records on disk, the subjects of a grant, the rendered
block) and the manager's wait; it imports no nats-py at its top.
"""

from __future__ import annotations

import json
import os
import signal
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
    from nats.aio.client import Client
    from nats.js import JetStreamContext
    from nats.js.kv import KeyValue

T = TypeVar("T")

GRANTS_ENV = "COTAL_BROKER_GRANTS"
# embedded.py reads both names without importing this module.
GRANTS_DIR = "grants"
PROBE_PREFIX = "cotal-grants.probe"
JOIN_PREFIX = "cotal-grants.join"
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
    # What the broker was started to grant. The keeper grants every space the broker carries,
    # each from when its custody bucket appears; the list is kept for the record.
    spaces: list[str]
    replicas: int
    targets: list[Target]
    # Leave when every target is gone (an embedded or standalone broker); a cluster's keeper
    # outlives a node's restart.
    exit_with_broker: bool = True
    # Run the keeper even with one host registered (`COTAL_BROKER_GRANTS`, `serve --grants`).
    always: bool = False


class JoinRequest(msgspec.Struct, forbid_unknown_fields=True):
    """A manager instance asking to be counted as the asking host's holder."""

    version: int
    instance: str


class JoinReply(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    ok: bool
    error: str = ""


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


# One bucket for every space: the keeper makes it before it reports ready, so a manager that
# finds no such bucket knows the broker serves no grants.
GRANTS_BUCKET = "cotal_grants"


def grant_key(space: str, holder: str) -> str:
    return f"grant.{names.check_space(space)}.{holder}"


def join_subject(nkey: str) -> str:
    """Where the host whose user is `nkey` asks for a manager instance to be counted as its
    own: only that user (and the keeper) may publish here, so the subject names the asker."""
    return f"{JOIN_PREFIX}.{nkey}"


def spaces_from_env(raw: str) -> list[str]:
    """`COTAL_BROKER_GRANTS=1` grants every space the broker carries; a comma-separated list
    names spaces the keeper watches from its start (it finds the others as they appear)."""
    if raw.strip() in ("1", "true", "yes", "on"):
        return []
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
    by a move), its post marker and its dead letters."""
    prefix = names.subject_prefix(space)
    owner = names.SEAT_OWNER
    return [
        f"{prefix}.inst.*.*.{owner}.{seat}",
        f"{prefix}.inst.{owner}.{seat}.>",
        names.chan_fence_subject(space, owner, seat),
        f"{prefix}.dead.{owner}.{seat}.*",
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


def _permissions(allow: list[str], deny: list[str], *, host: bool = True) -> str:
    publish = f"allow: {json.dumps(allow)}"
    if deny:
        publish += f", deny: {json.dumps(deny)}"
    # Nothing may subscribe under $SYS: the broker's own answers are eviction evidence. And no
    # host may read the keeper's mail: one that answered another host's join would tell it
    # it was counted when it was not.
    unread = ["$SYS.>", "cotal-grants.>"] if host else ["$SYS.>"]
    return (
        f"permissions: {{ publish: {{ {publish} }}, subscribe: {{ deny: {json.dumps(unread)} }} }}"
    )


Lifecycle = tuple[str, str, str]
"""(holder, seat, lifecycle uid): one custody record."""


def _host_deny(
    spaces: list[str],
    mine: set[str],
    others: set[str],
    lifecycles: Mapping[str, Iterable[Lifecycle]],
) -> list[str]:
    deny = [f"$KV.{GRANTS_BUCKET}.>", *DESTRUCTIVE]
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
    users = [f"    {{ nkey: {json.dumps(keeper_pub)}, {_permissions(keeper, [], host=False)} }}"]
    by_host = {h.name: holders_of(h, spaces) for h in hosts}
    registered = set().union(*by_host.values()) if by_host else set()
    for host in sorted(hosts, key=lambda h: h.name):
        mine = by_host[host.name]
        allow = [*common_publish(), join_subject(host.nkey)]
        for space in spaces:
            for holder in sorted(mine):
                for seat in sorted(held[space].get(holder, {})):
                    allow += seat_publish(space, seat)
        deny = _host_deny(spaces, mine, registered, records)
        users.append(f"    {{ nkey: {json.dumps(host.nkey)}, {_permissions(allow, deny)} }}")
    return "\n".join(["authorization {", "  users = [", *users, "  ]", "}", ""])


def write_auth(gdir: Path, text: str) -> None:
    write_private_atomic(auth_conf(gdir), text.encode())


def prepare(
    store_dir: Path, spaces: list[str], hosts: Iterable[Host], *, always: bool = False
) -> bool:
    """A grants directory ready for a broker's start: the keeper's seed and the registry, and
    whether the keeper must run. It must when asked to (`always`) or when two hosts or more are
    registered; then a first start writes an `auth.conf` granting no seat yet (a restart keeps
    the grants the last keeper wrote until its successor rewrites them). With one host alone
    there is nobody to keep apart: its `auth.conf` lets it write as any seat (`render_sole`),
    and the keeper starts once a second host is registered (`add_host_live`)."""
    from manager.broker.seeds import generate_user_seed, public_key_of

    gdir = ensure_private_dir(grants_dir(store_dir))
    seed = keeper_seed(gdir)
    keeper_pub = public_key_of(seed) if seed.exists() else generate_user_seed(seed)
    known = {(h.name, h.nkey): h for h in read_hosts(gdir).hosts}
    for host in hosts:
        # A restart keeps the instances that joined under this credential: their managers
        # may still be connected, and join again only when they restart.
        was = known.get((host.name, host.nkey))
        joined = [i for i in (was.holders if was else []) if i not in host.holders]
        add_host(gdir, msgspec.structs.replace(host, holders=[*host.holders, *joined]))
    registered = read_hosts(gdir).hosts
    conf = auth_conf(gdir)
    if not always and len(registered) < 2:
        write_auth(gdir, render_sole(keeper_pub, registered))
        return False
    if not conf.exists() or keeper_pub not in conf.read_text() or SOLE_MARK in conf.read_text():
        # A first start, a file another keeper wrote (a store put together from pieces) or
        # one a sole host ran under: the broker must at least let this keeper in, and it
        # grants no seat until the keeper runs.
        held: dict[str, dict[str, dict[str, int]]] = {s: {} for s in spaces}
        write_auth(gdir, render_auth(keeper_pub, "init", registered, held))
    return True


SOLE_MARK = "# one host: no keeper runs"


def render_sole(keeper_pub: str, hosts: Iterable[Host]) -> str:
    """The `authorization` block of a broker with one registered host (or none): it may write
    as any seat, since it holds every custody there is, but still not delete a stream nor
    write a grant; the keeper's user is there for the keeper a second host starts."""
    keeper = ["$JS.>", "$KV.>", "_INBOX.>", f"{PROBE_PREFIX}.>"]
    users = [f"    {{ nkey: {json.dumps(keeper_pub)}, {_permissions(keeper, [], host=False)} }}"]
    deny = [f"$KV.{GRANTS_BUCKET}.>", *DESTRUCTIVE]
    for host in hosts:
        users.append(f"    {{ nkey: {json.dumps(host.nkey)}, {_permissions(['>'], deny)} }}")
    return "\n".join([SOLE_MARK, "authorization {", "  users = [", *users, "  ]", "}", ""])


def keeper_pid(gdir: Path) -> int | None:
    """The pid of the keeper running for `gdir`, if one does."""
    from manager.procs import process_start_time

    try:
        pid = int(ready_file(gdir).read_text().strip() or "0")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    if b"manager.broker.keeper" not in cmdline or str(gdir).encode() not in cmdline:
        return None
    # A zombie (its parent, init here, reaps it late) runs nothing.
    return pid if process_start_time(pid) is not None else None


def adopt_file(gdir: Path) -> Path:
    return gdir / "keeper.adopt"


def add_host_live(gdir: Path, name: str, holders: list[str]) -> Path:
    """`new_host`, and on a broker that ran with one host alone, the keeper started: from now
    on two hosts are kept apart. The host that was alone is told to the keeper (`keeper.adopt`),
    which counts as its own every holder custody names that no host counts yet: until this
    moment every manager on the broker connected as that host. The marker is written first,
    so a keeper started by a rerun, or by the broker's next start, still adopts."""
    before = [h.name for h in read_hosts(gdir).hosts if h.name != name]
    if keeper_pid(gdir) is None and len(before) == 1:
        write_private_atomic(adopt_file(gdir), before[0].encode())
    creds = new_host(gdir, name, holders)
    if keeper_pid(gdir) is None and _broker_alive(gdir):
        spawn_keeper(gdir)
    return creds


def ensure_keeper(gdir: Path) -> None:
    """The keeper of a running broker that needs one (asked always, or two hosts or more) and
    has none: a start that died between the broker and its keeper, rerun, finishes here."""
    if not keeper_config_file(gdir).exists() or keeper_pid(gdir) is not None:
        return
    if not read_keeper_config(gdir).always and len(read_hosts(gdir).hosts) < 2:
        return
    if _broker_alive(gdir):
        spawn_keeper(gdir)


def revoke_host_live(gdir: Path, name: str) -> bool:
    """`revoke_host`, applied now: by the keeper's next reload, or, where no keeper runs (one
    host was left alone), by the sole grant rewritten and the broker told to reload it."""
    if not revoke_host(gdir, name):
        return False
    # Two hosts or more left: only a keeper may grant them (a restarted one reads the registry);
    # a sole grant would give each of them every seat.
    if keeper_pid(gdir) is None and len(read_hosts(gdir).hosts) <= 1 and _broker_alive(gdir):
        from manager.broker.seeds import public_key_of

        write_auth(gdir, render_sole(public_key_of(keeper_seed(gdir)), read_hosts(gdir).hosts))
        for target in read_keeper_config(gdir).targets:
            pid = pid_alive(target.pid_file)
            if pid is not None:
                os.kill(pid, signal.SIGHUP)
    return True


def _broker_alive(gdir: Path) -> bool:
    """Whether a server the keeper would serve runs now (its configuration names them)."""
    if not keeper_config_file(gdir).exists():
        return False
    return any(pid_alive(t.pid_file) for t in read_keeper_config(gdir).targets)


def write_keeper_config(gdir: Path, config: KeeperConfig) -> None:
    write_private_atomic(keeper_config_file(gdir), msgspec.json.encode(config))


# -- the manager's wait ---------------------------------------------------------------------------

# The instances each connection's host was told it counts.
_joined: weakref.WeakKeyDictionary[object, set[str]] = weakref.WeakKeyDictionary()


async def _grants_kv(js: JetStreamContext) -> KeyValue | None:
    """The grants bucket, or None on a broker whose keeper does not run (one host alone, or
    no grants at all). Asked at every claim, not remembered: a second host's registration
    starts the keeper under managers already connected."""
    from nats.js.errors import BucketNotFoundError

    from manager.broker.retry import riding_elections

    try:
        return await riding_elections(
            f"bucket {GRANTS_BUCKET}", lambda: js.key_value(GRANTS_BUCKET)
        )
    except BucketNotFoundError:
        return None


async def join(
    nc: Client, creds: Path | None, instance: str, *, timeout: float = GRANT_WAIT_S
) -> bool:
    """Have the broker's keeper count `instance` as a holder of the host whose credential this
    connection uses, before the instance writes anything (its lease, a claim). True once it
    does; False on a broker that serves no grants. Refused when another host already counts
    the instance, or when the keeper does not answer."""
    if creds is None:
        return False
    if instance in _joined.get(nc, set()):
        return True
    if await _grants_kv(nc.jetstream()) is None:
        return False
    return await _ask_join(nc, creds, instance, timeout)


async def _ask_join(nc: Client, creds: Path, instance: str, timeout: float) -> bool:
    """`join`'s request, on a broker known to serve grants; remembered per connection."""
    import nats.errors

    if instance in _joined.get(nc, set()):
        return True
    try:
        seed = creds.read_bytes()[:RECORD_CAP].strip()
    except OSError:
        return False
    if not seed.startswith(b"SU"):
        # A JWT credential file: its user is scoped by its own account, not by this keeper.
        return False
    from manager.broker.seeds import public_key_of

    subject = join_subject(public_key_of(creds))
    ask = msgspec.json.encode(JoinRequest(version=1, instance=instance))
    cure = (
        "check that the broker's grant keeper runs (its log is grants/keeper.log in the "
        "broker's store) and that this host's credential is the one registered for it"
    )
    try:
        msg = await nc.request(subject, ask, timeout=timeout)
        reply = msgspec.json.decode(msg.data[:RECORD_CAP], type=JoinReply)
    except (nats.errors.Error, TimeoutError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Refusal(
            Code.CUSTODY_NOT_HELD,
            f"the broker's grant keeper did not count instance {instance} as this host's: "
            f"{type(exc).__name__}: {exc}",
            cure,
        ) from None
    if not reply.ok:
        raise Refusal(Code.CUSTODY_NOT_HELD, reply.error, cure)
    _joined.setdefault(nc, set()).add(instance)
    return True


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

    if not seats:
        return
    kv = await _grants_kv(js)
    if kv is None:
        return
    # A claimant that is not a started manager (a restore before its manager runs, an
    # operator's takeover) joins here: the keeper grants only instances its host counts.
    from manager.broker.connection import creds_of

    nc: Client = js._nc
    creds = creds_of(nc)
    if creds is not None:
        await _ask_join(nc, creds, holder, timeout)
    watcher = await kv.watch(grant_key(space, holder))
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
    """The pid a target's pid file names, if that process lives. A stopped server's zombie
    (init reaps it late here) does not: a keeper started for it would wait for a broker that
    is gone."""
    from manager.procs import process_start_time

    try:
        pid = int(Path(pid_file).read_text().strip() or "0")
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and process_start_time(pid) is not None else None


def stop_keeper(gdir: Path, *, timeout: float = 5.0) -> None:
    """The keeper of a broker that was stopped: it leaves by itself within a tick of its
    broker's end; this ends it now (SIGTERM) and waits until it has, so nothing of the broker
    outlives its stop."""
    import time

    pid = keeper_pid(gdir)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while keeper_pid(gdir) is not None and time.monotonic() < deadline:
        time.sleep(0.02)


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
