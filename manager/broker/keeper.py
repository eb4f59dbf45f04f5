"""The grant keeper: the custody bucket turned into the broker's own permissions.

It runs beside a broker started with grants (a child of the embedded broker's start, of
`cotal broker serve --grants`, or of the test cluster), on the broker's host, as the one user
whose credential lives only there. It watches each space's custody bucket and the host
registry; whenever what they say changes it rewrites `grants/auth.conf`, signals each
nats-server to reload (nats-server swaps a user's permissions on its live connections), proves
each server runs the new text by a publish only that text allows (a probe subject of its own),
and only then records in `cotal_grants_<space>` what each holder is granted, which the holder
waits for before it writes as a seat (`grants.wait_granted`).

Run as `python -m manager.broker.keeper GRANTS_DIR`.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
from pathlib import Path

import anyio
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectSendStream
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from manager.broker import grants
from manager.broker.connection import close_quietly, connect
from manager.broker.footprint import ensure_kv
from manager.broker.seeds import public_key_of
from manager.workspace.private import write_private_atomic
from protocol import names
from protocol.custody import decode_custody
from protocol.errors import DecodeError

log = structlog.get_logger("cotal.grants")

TICK_S = 0.5
PROBE_WAIT_S = 0.2
RESIGNAL_EVERY = 10
CONNECT_S = 30.0

Held = dict[str, dict[str, dict[str, int]]]


class Keeper:
    def __init__(self, gdir: Path) -> None:
        self.gdir = gdir
        self.config = grants.read_keeper_config(gdir)
        self.keeper_pub = public_key_of(grants.keeper_seed(gdir))
        # space -> custody key -> (holder, seat, generation)
        self.records: dict[str, dict[str, tuple[str, str, int]]] = {
            s: {} for s in self.config.spaces
        }
        self.applied_body: str | None = None
        self.published: dict[tuple[str, str], dict[str, int]] = {}
        self.dirty = True
        self.probes: list[tuple[grants.Target, Client, Subscription]] = []
        self.grant_kvs: dict[str, KeyValue] = {}

    def held(self) -> Held:
        out: Held = {s: {} for s in self.config.spaces}
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

    def note(self, space: str, entry: KeyValue.Entry) -> None:
        parts = entry.key.split(".")
        if len(parts) != 3 or parts[0] != names.SEAT_OWNER:
            return
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            self.records[space].pop(entry.key, None)
            return
        try:
            record = decode_custody(entry.value)
        except DecodeError:
            # An unreadable record grants nobody.
            self.records[space].pop(entry.key, None)
            return
        self.records[space][entry.key] = (record.holder, record.seat, record.generation)

    async def apply(self) -> None:
        """Render, reload and prove, then publish each holder's grant."""
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
            registered |= grants.holders_of(host, self.config.spaces)
        await self.publish_grants(held, registered)
        self.dirty = False

    async def publish_grants(self, held: Held, registered: set[str]) -> None:
        for space, holders in held.items():
            known = {h for (s, h) in self.published if s == space}
            for holder in sorted(known | set(holders)):
                seats = holders.get(holder, {}) if holder in registered else {}
                if self.published.get((space, holder)) == seats:
                    continue
                record = grants.Grant(version=1, seats=seats)
                await self.grant_kvs[space].put(
                    grants.grant_key(holder), msgspec.json.encode(record)
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
            for space in self.config.spaces:
                bucket = grants.grants_bucket(space)
                self.grant_kvs[space] = await ensure_kv(
                    js, bucket, ttl=None, replicas=self.config.replicas
                )
                # What a keeper before this one recorded may be ahead of what the broker runs
                # once this one reloads: every grant is written anew from the custody bucket.
                await js.purge_stream(f"KV_{bucket}")
            await self._loop(js)
        finally:
            for _, probe_nc, _ in self.probes:
                await close_quietly(probe_nc)
            await close_quietly(nc)

    async def _loop(self, js: JetStreamContext) -> None:
        send, receive = anyio.create_memory_object_stream[None](64)
        async with anyio.create_task_group() as tg, receive:
            for space in self.config.spaces:
                tg.start_soon(self._watch, js, space, send.clone())
            tg.start_soon(self._tick, send.clone(), tg.cancel_scope)
            await self._apply_logged()
            write_private_atomic(grants.ready_file(self.gdir), str(os.getpid()).encode())
            async for _ in receive:
                while True:
                    try:
                        receive.receive_nowait()
                    except anyio.WouldBlock:
                        break
                await self._apply_logged()

    async def _apply_logged(self) -> None:
        try:
            await self.apply()
        except Exception as exc:
            # Nothing is recorded as granted; the next tick tries again.
            self.dirty = True
            log.warning("grants.apply_failed", error=f"{type(exc).__name__}: {exc}")

    async def _watch(
        self, js: JetStreamContext, space: str, send: MemoryObjectSendStream[None]
    ) -> None:
        kv = await _bucket(js, names.custody_bucket(space))
        watcher = await kv.watchall()
        async for entry in watcher:
            if entry is not None:
                self.note(space, entry)
            await send.send(None)

    async def _tick(self, send: MemoryObjectSendStream[None], scope: anyio.CancelScope) -> None:
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
