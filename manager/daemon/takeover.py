"""Taking a lost host's seat over (issue 39, item 4): `cotal takeover NAME... [--from INSTANCE]`.

A seat whose root ran with `[failover] enabled` has a standing checkpoint at the broker, the
newest capture at one of its turn boundaries (manager/daemon/standing.py). When its holder's
manager lease is gone, any manager of the space may take the seat over from it: the same
admission (this root's trust store, integrity, recency), custody claim at generation + 1 by
compare-and-set, restore and adoption as `cotal up --restore` and a move's destination run,
through this root's own restore coordinator in this process (`Mover.restore_here`).

Two writers are what this must never make, so before anything is claimed:
- the holder's lease must be gone (a holder that still renews is refused, `holder-alive`);
- the standing checkpoint must be the holder's own at the generation custody records now
  (`standing-stale` otherwise: a put that raced a takeover, or a seat held elsewhere since);
- and the takeover waits out the holder's self-fence (manager/daemon/selffence.py). A holder
  that lost the broker kills its failover seats `after_s` after its last acknowledged lease
  renewal, on its own clock. Its lease expires `MANAGER_LEASE_TTL_S` after the broker stored
  that renewal, which came after the renewal was sent, so when this manager first sees the
  lease gone the holder's last renewal was at least `TTL` ago, and its seats are dead once
  `after_s - TTL` more has passed, stretched by a clock-rate allowance, plus its watchdog's
  tick and the time a SIGKILL and its proof take (`fence_wait_s`). The lease is read again
  through the wait; a renewal that shows up ends the takeover with `holder-alive`.

The custody claim's compare-and-set is what makes two takeovers (two operators, two standbys)
end with one winner: the loser is refused `custody-lost` and has claimed nothing.
"""

from __future__ import annotations

import functools
import shutil
import time
from pathlib import Path
from typing import Protocol

import anyio
import structlog
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyDeletedError, KeyNotFoundError, NotFoundError

from manager.broker import carry, fleet
from manager.broker.retry import riding_elections
from manager.checkpoint import archive
from manager.daemon.events import Events
from manager.daemon.mover import Mover
from manager.workspace.identity import InstanceIdentity
from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from manager.workspace.private import ensure_private_dir
from protocol import control, names
from protocol.errors import DecodeError, Refusal
from protocol.events import EventDetail
from protocol.fleet import FleetRow
from protocol.maintenance import RESUME_UNDER_WAY
from protocol.refusals import Code
from protocol.standing import StandingMeta, decode_standing_meta

log = structlog.get_logger("cotal.takeover")

# How much faster this host's clock may run than the holder's or the broker's, as a fraction of
# what is waited: 1% is 10,000 ppm, a hundred times what an undisciplined crystal drifts (a
# clock *stepped* by a time daemon does not matter: every wait here is on a monotonic clock).
CLOCK_RATE_ALLOWANCE = 0.01
# The holder's watchdog tick (at most 0.25 s), its SIGKILL of each seat and the proof of exit
# (one pass over /proc), with room to spare.
KILL_MARGIN_S = 1.0
# How often the holder's lease is read again while the wait runs.
LEASE_CHECK_S = 0.5


def fence_wait_s(after_s: float) -> float:
    """How long after first seeing the holder's lease gone its failover seats are proven dead."""
    silent = after_s * (1 + CLOCK_RATE_ALLOWANCE) - names.MANAGER_LEASE_TTL_S * (
        1 - CLOCK_RATE_ALLOWANCE
    )
    return max(0.0, silent) + KILL_MARGIN_S


class TakeoverOwner(Protocol):
    """What a takeover asks of the Manager: who and where it is, its broker, its events, and
    the move's destination, whose restore it runs."""

    @property
    def layout(self) -> Layout: ...

    @property
    def identity(self) -> InstanceIdentity: ...

    @property
    def space(self) -> str: ...

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def events(self) -> Events: ...

    @property
    def mover(self) -> Mover: ...


class Takeover:
    def __init__(self, mgr: TakeoverOwner) -> None:
        self.mgr = mgr

    async def take(self, args: control.TakeoverArgs) -> control.TakeoverReply:
        taken: list[control.TakenSeat] = []
        for name in args.names:
            names.check_seat_name(name)
            taken.append(await self.take_one(name, args.from_instance))
        return control.TakeoverReply(seats=taken)

    async def take_one(
        self, name: str, from_instance: str | None, *, seen_gone_at: float | None = None
    ) -> control.TakenSeat:
        """One seat; `seen_gone_at` is when this manager first saw its holder's lease gone (a
        standby watching), else now: the self-fence wait counts from it."""
        begun = await self._finish_begun(name)
        if begun is not None:
            return begun
        row = await self._lost_row(name, from_instance)
        assert row.instance is not None and row.generation is not None
        meta = await self._standing(row)
        began = time.monotonic() if seen_gone_at is None else seen_gone_at
        await self._wait_out_fence(row.instance, meta.after_s, began)
        waited = round(time.monotonic() - began, 3)
        log.info(
            "takeover.fenced_out",
            seat=name,
            uid=row.lifecycle_uid,
            holder=row.instance,
            waited_s=waited,
        )
        if meta.base is not None:
            await self._fetch_base(row, meta)
        path = await self._fetch(row, meta)
        await self._restore(path, meta.attempt_id, name, row.lifecycle_uid)
        await self._drop_base(meta.base)
        log.info("takeover.done", seat=name, uid=row.lifecycle_uid, holder=row.instance)
        return control.TakenSeat(
            name=name,
            lifecycle_uid=row.lifecycle_uid,
            from_instance=row.instance,
            generation=row.generation + 1,
            attempt_id=meta.attempt_id,
            captured_at=meta.captured_at,
            waited_s=waited,
        )

    async def _finish_begun(self, name: str) -> control.TakenSeat | None:
        """A takeover of `name` this root began and whose manager died past its custody claim
        (its journal holds the attempt under way, the fetched standing checkpoint is still in
        `incoming`): run the same restore again, which goes on from the journal's state. None
        when there is no such takeover."""
        mgr = self.mgr
        journal = Journal(mgr.layout)
        record = journal.load() if mgr.layout.journal.exists() else None
        if record is None or record.state not in RESUME_UNDER_WAY:
            return None
        path = mgr.layout.incoming / f"{record.attempt_id}.standing.tar"
        if not path.is_file() or path.is_symlink():
            return None
        inventory = journal.resume_document(record)
        agents = {a.name: a for a in inventory.agents}
        if name not in agents:
            return None
        uid = agents[name].identity.lifecycle_uid
        log.warning("takeover.continuing", seat=name, uid=uid, attempt=record.attempt_id)
        await self._restore(path, record.attempt_id, name, uid)
        try:
            meta = await self._described(names.standing_object(name, uid))
        except DecodeError:
            meta = None
        await self._drop_base(meta.base if meta is not None else None)
        generation = agents[name].generation
        return control.TakenSeat(
            name=name,
            lifecycle_uid=uid,
            from_instance=inventory.instance_id or "",
            generation=generation + 1,
            attempt_id=record.attempt_id,
            captured_at=inventory.created_at,
            waited_s=0.0,
        )

    async def _restore(self, path: Path, attempt: str, name: str, uid: str) -> None:
        """The fetched standing checkpoint through the move destination's restore, here; the
        file goes once the restore is done with it, whatever its end."""
        mgr = self.mgr
        try:
            await mgr.mover.restore_here(path, attempt, seat=name, progress="takeover.progress")
        finally:
            path.unlink(missing_ok=True)
        mgr.events.emit("seat.taken_over", name, uid, EventDetail(attempt_id=attempt))

    async def _drop_base(self, base: str | None) -> None:
        """The unpacked base a standing checkpoint built on: the restore unbundled it into the
        seat's tree, so it is needed no more (a rerun after a crash drops it too)."""
        if base is not None:
            where = self.mgr.layout.incoming / names.check_attempt_id(base)
            await anyio.to_thread.run_sync(
                functools.partial(shutil.rmtree, where, ignore_errors=True)
            )

    async def _lost_row(self, name: str, from_instance: str | None) -> FleetRow:
        """The seat's roster row, held by a manager other than this one whose lease is gone."""
        mgr = self.mgr
        rows = [r for r in await fleet.roster(mgr.js, mgr.space) if r.name == name]
        held = [r for r in rows if r.instance is not None and r.generation is not None]
        if from_instance is not None:
            mine = [r for r in held if r.instance == from_instance]
            if held and not mine:
                holders = ", ".join(sorted(f"{r.instance} at {r.generation}" for r in held))
                raise Refusal(
                    Code.STANDING_STALE,
                    f"{name} is held by {holders}, not by {from_instance}",
                    "see `cotal ps --fleet`: the seat moved or was taken over already",
                )
            held = mine
        if not held:
            raise Refusal(
                Code.NO_SUCH_SEAT,
                f"no seat named {name!r} is held by any manager in space {mgr.space}",
                "see `cotal ps --fleet`",
            )
        if len(held) > 1:
            uids = ", ".join(sorted(f"{r.lifecycle_uid} ({r.instance})" for r in held))
            raise Refusal(
                Code.DUPLICATE_NAME,
                f"seat name {name!r} has {len(held)} lifecycles with custody records: {uids}",
                "name the holder to take it from: `cotal takeover NAME --from INSTANCE`",
            )
        (row,) = held
        if row.instance == mgr.identity.instance_id:
            raise Refusal(
                Code.HOLDER_ALIVE,
                f"{name} is held by this manager ({row.instance}); there is nothing to take over",
                "see `cotal ps`",
            )
        if row.manager_live:
            raise Refusal(
                Code.HOLDER_ALIVE,
                f"{name}'s holder {row.instance} (host {row.host or 'unknown'}) still renews its "
                "lease at the broker",
                Code.HOLDER_ALIVE.cure,
            )
        return row

    async def _standing(self, row: FleetRow) -> StandingMeta:
        """The description of the seat's standing checkpoint, proven to be its holder's own at
        the generation custody records now."""
        try:
            meta = await self._described(names.standing_object(row.name, row.lifecycle_uid))
        except DecodeError as exc:
            raise Refusal(
                Code.STANDING_STALE,
                f"{row.name}'s standing checkpoint does not say whose it is: {exc.text}",
                "nothing of it is used; take the seat from its last cut (`cotal up --restore`)",
            ) from None
        if meta is None:
            raise Refusal(
                Code.NO_STANDING_CHECKPOINT,
                f"{row.name} (uid {row.lifecycle_uid}) has no standing checkpoint at the broker",
                Code.NO_STANDING_CHECKPOINT.cure,
            )
        if meta.instance != row.instance or meta.generation != row.generation:
            raise Refusal(
                Code.STANDING_STALE,
                f"{row.name}'s standing checkpoint was taken by {meta.instance} at generation "
                f"{meta.generation}; custody says {row.instance} at generation {row.generation}",
                Code.STANDING_STALE.cure,
            )
        return meta

    async def _described(self, obj: str) -> StandingMeta | None:
        """What an object of the standing bucket says of itself; None when the bucket or the
        object is not there. A description that does not decode raises `DecodeError`."""
        mgr = self.mgr
        try:
            store = await riding_elections(
                "standing bucket",
                functools.partial(mgr.js.object_store, names.standing_bucket(mgr.space)),
            )
            info = await riding_elections(f"standing {obj}", functools.partial(store.get_info, obj))
        except (BucketNotFoundError, NotFoundError):
            return None
        return decode_standing_meta(info.description or "")

    async def _wait_out_fence(self, holder: str, after_s: float, began: float) -> None:
        deadline = began + fence_wait_s(after_s)
        while True:
            if await self._lease_held(holder):
                raise Refusal(
                    Code.HOLDER_ALIVE,
                    f"{holder} renewed its lease during the takeover's wait: it is not lost",
                    Code.HOLDER_ALIVE.cure,
                )
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await anyio.sleep(min(LEASE_CHECK_S, left))

    async def _lease_held(self, instance: str) -> bool:
        mgr = self.mgr
        key = names.lease_key(instance)
        try:
            kv = await riding_elections(
                "manager bucket",
                functools.partial(mgr.js.key_value, names.manager_bucket(mgr.space)),
            )
            await riding_elections(f"lease {key}", functools.partial(kv.get, key))
        except (KeyNotFoundError, KeyDeletedError, BucketNotFoundError):
            return False
        return True

    async def _fetch_base(self, row: FleetRow, meta: StandingMeta) -> None:
        """The base the standing checkpoint's history builds on, proven to be the one it names
        and its holder's, unpacked into `incoming/<base>` beside where the restore unpacks the
        standing checkpoint itself, so the restore's chain finds it there."""
        mgr = self.mgr
        name = names.standing_base_object(row.name, row.lifecycle_uid)
        try:
            got = await self._described(name)
        except DecodeError:
            got = None
        if got is None or got.attempt_id != meta.base or got.instance != meta.instance:
            raise Refusal(
                Code.STANDING_STALE,
                f"{row.name}'s standing checkpoint {meta.attempt_id} builds on {meta.base}, and "
                "the broker does not hold that base (or holds another)",
                "nothing of it is used; take the seat from its last cut (`cotal up --restore`)",
            )
        ensure_private_dir(mgr.layout.incoming)
        path = mgr.layout.incoming / f"{meta.base}.standing-base.tar"
        try:
            await carry.get_into(
                mgr.js, mgr.space, name, path, bucket=names.standing_bucket(mgr.space)
            )
            await anyio.to_thread.run_sync(archive.unpack, path, mgr.layout)
        finally:
            path.unlink(missing_ok=True)

    async def _fetch(self, row: FleetRow, meta: StandingMeta) -> Path:
        mgr = self.mgr
        ensure_private_dir(mgr.layout.incoming)
        path = mgr.layout.incoming / f"{meta.attempt_id}.standing.tar"
        await carry.get_into(
            mgr.js,
            mgr.space,
            names.standing_object(row.name, row.lifecycle_uid),
            path,
            bucket=names.standing_bucket(mgr.space),
        )
        return path
