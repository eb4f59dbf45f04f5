"""The grant keeper: the custody bucket turned into the broker's own permissions.

It runs beside a broker started with grants (a child of the embedded broker's start, of
`cotal broker serve --grants`, or of the test cluster), on the broker's host, as the one user
whose credential lives only there. It watches each space's custody bucket and the host
registry; whenever what they say changes it rewrites `grants/auth.conf`, signals each
nats-server to reload (nats-server swaps a user's permissions on its live connections), proves
each server runs the new text by a publish only that text allows (a probe subject of its own),
and only then records in `cotal_grants` what each holder is granted, which the holder
waits for before it writes as a seat (`grants.wait_granted`).

Run as `python -m manager.broker.keeper GRANTS_DIR`.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
from pathlib import Path

import anyio
import anyio.abc
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectSendStream
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from manager.broker import grants
from manager.broker.connection import close_quietly, connect
from manager.broker.footprint import ensure_kv
from manager.broker.reader import bucket_entries
from manager.broker.seeds import public_key_of
from manager.workspace.private import write_private_atomic
from protocol import names
from protocol.custody import decode_custody
from protocol.errors import DecodeError

log = structlog.get_logger("cotal.grants")

TICK_S = 0.5
# A probe crosses one local server in well under a millisecond; one that has not come back in
# 20 ms was refused (the server still runs the old text), and the next one goes out at once.
PROBE_WAIT_S = 0.02
# Signal again every 2 s of probing: a reload nats-server has not begun.
RESIGNAL_EVERY = 100
CONNECT_S = 30.0

Held = dict[str, dict[str, dict[str, int]]]


CUSTODY_STREAM_PREFIX = "KV_" + names.custody_bucket("x")[: -len("x")]


class Keeper:
    def __init__(self, gdir: Path) -> None:
        self.gdir = gdir
        self.config = grants.read_keeper_config(gdir)
        self.keeper_pub = public_key_of(grants.keeper_seed(gdir))
        # space -> custody key -> (holder, seat, generation), for every space being watched
        self.records: dict[str, dict[str, tuple[str, str, int]]] = {}
        self.applied_body: str | None = None
        self.published: dict[tuple[str, str], dict[str, int]] = {}
        self.dirty = True
        self.probes: list[tuple[grants.Target, Client, Subscription]] = []
        self.grant_kv: KeyValue | None = None
        # Joins answered once the grants that count them are applied.
        self.joined: list[tuple[Msg, grants.JoinReply]] = []

    def spaces(self) -> list[str]:
        return sorted(self.records)

    def held(self) -> Held:
        out: Held = {s: {} for s in self.records}
        for space, records in self.records.items():
            for holder, seat, generation in records.values():
                seats = out[space].setdefault(holder, {})
                seats[seat] = max(generation, seats.get(seat, -1))
        return out

    def lifecycles(self) -> dict[str, list[grants.Lifecycle]]:
        """Each space's custody records as (holder, seat, uid): the key is `local.<seat>.<uid>`."""
        return {
            space: [(holder, seat, key.split(".")[2]) for key, (holder, seat, _) in recs.items()]
            for space, recs in self.records.items()
        }

    def note(self, space: str, key: str, value: bytes | None) -> None:
        parts = key.split(".")
        if len(parts) != 3 or parts[0] != names.SEAT_OWNER:
            return
        if not value:
            self.records[space].pop(key, None)
            return
        try:
            record = decode_custody(value)
        except DecodeError:
            # An unreadable record grants nobody.
            self.records[space].pop(key, None)
            return
        self.records[space][key] = (record.holder, record.seat, record.generation)

    def join(self, msg: Msg) -> None:
        """A host asks that a manager instance count as its own. The subject names the host
        (only its user may publish there); an instance another host counts is refused. The
        answer goes out after the next apply, so a joined instance's lease is its own by then."""
        nkey = msg.subject.rsplit(".", 1)[-1]
        hosts = grants.read_hosts(self.gdir).hosts
        try:
            ask = msgspec.json.decode(msg.data[: grants.RECORD_CAP], type=grants.JoinRequest)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.joined.append((msg, grants.JoinReply(version=1, ok=False, error=str(exc))))
            return
        if not names.INSTANCE_ID_RE.fullmatch(ask.instance):
            error = f"{ask.instance[:64]!r} is not an instance id"
            self.joined.append((msg, grants.JoinReply(version=1, ok=False, error=error)))
            return
        host = next((h for h in hosts if h.nkey == nkey), None)
        spaces = self.spaces()
        other = [
            h.name for h in hosts if h is not host and ask.instance in grants.holders_of(h, spaces)
        ]
        if host is None or other:
            why = (
                f"instance {ask.instance} is already counted as host {other[0]}'s"
                if other
                else "the asking credential is not registered"
            )
            self.joined.append((msg, grants.JoinReply(version=1, ok=False, error=why)))
            return
        if ask.instance not in grants.holders_of(host, spaces):
            holders = [*host.holders, ask.instance]
            grants.add_host(self.gdir, msgspec.structs.replace(host, holders=holders))
            log.info("grants.joined", host=host.name, instance=ask.instance)
            self.dirty = True
        self.joined.append((msg, grants.JoinReply(version=1, ok=True)))

    def adopt(self) -> None:
        """A keeper started by a second host's registration: every holder custody names that
        no host counts is the host that was alone's (every manager connected as it until now);
        the marker goes once they are written down."""
        marker = grants.adopt_file(self.gdir)
        try:
            sole = marker.read_text().strip()
        except OSError:
            return
        hosts = grants.read_hosts(self.gdir).hosts
        counted = set().union(*(grants.holders_of(h, self.spaces()) for h in hosts))
        holders = {holder for recs in self.records.values() for holder, _, _ in recs.values()}
        for host in hosts:
            if host.name == sole:
                more = sorted(holders - counted)
                grants.add_host(
                    self.gdir, msgspec.structs.replace(host, holders=[*host.holders, *more])
                )
                log.info("grants.adopted", host=sole, holders=more)
        marker.unlink(missing_ok=True)

    async def apply(self) -> None:
        """Render, reload and prove, then publish each holder's grant and answer the joins."""
        hosts = grants.read_hosts(self.gdir).hosts
        held, lifecycles = self.held(), self.lifecycles()
        body = grants.render_auth(self.keeper_pub, "-", hosts, held, lifecycles)
        if body != self.applied_body:
            probe = secrets.token_hex(8)
            text = grants.render_auth(self.keeper_pub, probe, hosts, held, lifecycles)
            grants.write_auth(self.gdir, text)
            await self.reload(f"{grants.PROBE_PREFIX}.{probe}")
            self.applied_body = body
            log.info("grants.applied", holders={s: sorted(h) for s, h in held.items()})
        registered: set[str] = set()
        for host in hosts:
            registered |= grants.holders_of(host, self.spaces())
        await self.publish_grants(held, registered)
        self.dirty = False
        answers, self.joined = self.joined, []
        for msg, reply in answers:
            await msg.respond(msgspec.json.encode(reply))

    async def publish_grants(self, held: Held, registered: set[str]) -> None:
        assert self.grant_kv is not None
        for space, holders in held.items():
            known = {h for (s, h) in self.published if s == space}
            for holder in sorted(known | set(holders)):
                seats = holders.get(holder, {}) if holder in registered else {}
                if self.published.get((space, holder)) == seats:
                    continue
                record = grants.Grant(version=1, seats=seats)
                await self.grant_kv.put(
                    grants.grant_key(space, holder), msgspec.json.encode(record)
                )
                self.published[(space, holder)] = seats

    async def reload(self, subject: str) -> None:
        """Signal every live server to reload, and wait until each one lets the probe through.
        A server that is down reads the file when it starts."""
        for target, nc, sub in self.probes:
            tries = 0
            while True:
                pid = grants.pid_alive(target.pid_file)
                if pid is None:
                    break
                if tries % RESIGNAL_EVERY == 0:
                    if tries:
                        # A file the server will not load (read its log) keeps the old grants.
                        log.warning("grants.reload_unconfirmed", target=target.url, tries=tries)
                    os.kill(pid, signal.SIGHUP)
                tries += 1
                if await _probe(nc, sub, subject):
                    break

    async def run(self) -> None:
        seed = grants.keeper_seed(self.gdir)
        urls = ",".join(t.url for t in self.config.targets)
        nc = await connect(urls, seed, name="cotal-grant-keeper", deadline=CONNECT_S)
        try:
            for target in self.config.targets:
                probe_nc = await connect(
                    target.url, seed, name="cotal-grant-keeper-probe", deadline=CONNECT_S
                )
                sub = await probe_nc.subscribe(f"{grants.PROBE_PREFIX}.>")
                self.probes.append((target, probe_nc, sub))
            js = nc.jetstream()
            self.grant_kv = await ensure_kv(
                js, grants.GRANTS_BUCKET, ttl=None, replicas=self.config.replicas
            )
            # What a keeper before this one recorded may be ahead of what the broker runs
            # once this one reloads: every grant is written anew from the custody buckets.
            await js.purge_stream(f"KV_{grants.GRANTS_BUCKET}")
            await self._loop(nc, js)
        finally:
            for _, probe_nc, _ in self.probes:
                await close_quietly(probe_nc)
            await close_quietly(nc)

    async def _loop(self, nc: Client, js: JetStreamContext) -> None:
        send, receive = anyio.create_memory_object_stream[Msg | None](64)
        async with anyio.create_task_group() as tg, receive:
            joins = await nc.subscribe(f"{grants.JOIN_PREFIX}.*")
            # A stream's name is one token of the advisory's subject, and a wildcard matches
            # whole tokens only: every creation asks for the listing again.
            created = await nc.subscribe(f"{ADVISORY_CREATED}.*")
            tg.start_soon(_forward, joins, send.clone())
            tg.start_soon(_forward, created, send.clone())
            # Each space's custody read whole before the first apply: a keeper that restarts
            # renders what custody says, never an empty grant in between.
            await self._discover(nc, js, tg, send)
            self.adopt()
            tg.start_soon(self._tick, send.clone(), tg.cancel_scope)
            await self._apply_logged()
            write_private_atomic(grants.ready_file(self.gdir), str(os.getpid()).encode())
            async for item in receive:
                rescan = False
                while True:
                    if item is not None and item.subject.startswith(grants.JOIN_PREFIX):
                        self.join(item)
                    elif item is not None:
                        rescan = True
                    try:
                        item = receive.receive_nowait()
                    except anyio.WouldBlock:
                        break
                if rescan:
                    await self._discover(nc, js, tg, send)
                await self._apply_logged()

    async def _discover(
        self,
        nc: Client,
        js: JetStreamContext,
        tg: anyio.abc.TaskGroup,
        send: MemoryObjectSendStream[Msg | None],
    ) -> None:
        """Watch every space whose custody bucket the broker has and that is not watched yet."""
        for space in sorted(await _custody_spaces(nc) - set(self.records)):
            kv = await _bucket(js, names.custody_bucket(space))
            self.records[space] = {}
            for key, entry in (await bucket_entries(js, names.custody_bucket(space))).items():
                self.note(space, key, entry.value)
            log.info("grants.space_watched", space=space, records=len(self.records[space]))
            tg.start_soon(self._watch, kv, space, send.clone())
            self.dirty = True

    async def _apply_logged(self) -> None:
        try:
            await self.apply()
        except Exception as exc:
            # Nothing is recorded as granted; the next tick tries again.
            self.dirty = True
            log.warning("grants.apply_failed", error=f"{type(exc).__name__}: {exc}")

    async def _watch(
        self, kv: KeyValue, space: str, send: MemoryObjectSendStream[Msg | None]
    ) -> None:
        watcher = await kv.watchall()
        async for entry in watcher:
            if entry is not None:
                gone = entry.operation in ("DEL", "PURGE")
                self.note(space, entry.key, None if gone else entry.value)
            await send.send(None)

    async def _tick(
        self, send: MemoryObjectSendStream[Msg | None], scope: anyio.CancelScope
    ) -> None:
        """The registry's changes, a failed apply's retry, and the end of the broker."""
        stamp: tuple[int, int] | None = None
        while True:
            await anyio.sleep(TICK_S)
            if self.config.exit_with_broker and not any(
                grants.pid_alive(t.pid_file) for t in self.config.targets
            ):
                log.info("grants.broker_gone")
                scope.cancel()
                return
            try:
                st = grants.hosts_file(self.gdir).stat()
                now: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
            except OSError:
                now = None
            if now != stamp or self.dirty:
                stamp = now
                await send.send(None)


ADVISORY_CREATED = "$JS.EVENT.ADVISORY.STREAM.CREATED"


async def _forward(sub: Subscription, send: MemoryObjectSendStream[Msg | None]) -> None:
    async with send:
        async for msg in sub.messages:
            await send.send(msg)


async def _custody_spaces(nc: Client) -> set[str]:
    """The spaces whose custody bucket the broker holds (JetStream's stream listing)."""
    found: set[str] = set()
    offset = 0
    while True:
        ask = json.dumps({"offset": offset}).encode()
        reply = json.loads((await nc.request("$JS.API.STREAM.NAMES", ask, timeout=5.0)).data)
        streams = reply.get("streams") or []
        for stream in streams:
            if stream.startswith(CUSTODY_STREAM_PREFIX):
                found.add(stream[len(CUSTODY_STREAM_PREFIX) :])
        offset += len(streams)
        if not streams or offset >= int(reply.get("total", 0)):
            return found


async def _bucket(js: JetStreamContext, bucket: str) -> KeyValue:
    """A bucket the managers create; the keeper waits for it rather than creating it with a
    replica count of its own."""
    while True:
        try:
            return await js.key_value(bucket)
        except BucketNotFoundError:
            await anyio.sleep(TICK_S)


async def _probe(nc: Client, sub: Subscription, subject: str) -> bool:
    """True once `subject` comes back: the server runs the text that allows it."""
    if not nc.is_connected:
        await anyio.sleep(PROBE_WAIT_S)
        return False
    await nc.publish(subject, b"")
    await nc.flush()
    with anyio.move_on_after(PROBE_WAIT_S):
        while True:
            try:
                msg = await sub.next_msg(timeout=PROBE_WAIT_S)
            except NatsTimeout:
                return False
            if msg.subject == subject:
                return True
    return False


def main(argv: list[str]) -> int:
    gdir = Path(argv[0])
    anyio.run(Keeper(gdir).run)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
