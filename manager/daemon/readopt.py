"""Re-adoption: a manager that starts in `active` takes back the seats its dead predecessor ran.

Seats die with their manager (design decision 12), so each persisted `SeatRecord` names a seat
whose process is gone and whose footprint (durable, custody, pointer, store) was left behind on
purpose. The successor enters every record in its table as `exited`, then relaunches each seat
under its own lifecycle uid and into its own session, exactly as a crash restart would, after
the same proofs a resume asks for: custody still held by this instance at the recorded
generation, the `dm_` durable at the broker, and no process of the lifecycle alive. A seat that
fails a proof is not launched and not deprovisioned: it stays in the table as `failed`, with the
reason, until an operator removes it (`cotal rm`) or stops and starts it again. A seat the
operator had stopped (`cotal stop`) is proven dead and kept `stopped`: a manager restart never
starts what the operator stopped.

The predecessor's last delivery (a turn it handed over and never settled) would otherwise wait
out `ack_wait` at the broker, and the durable admits one unacknowledged message at a time, so
the seat's inbox would stall for a minute. Once the lifecycle is proven dead, that delivery is
negatively acknowledged on the predecessor's behalf and comes back at once.
"""

from __future__ import annotations

import shutil
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

import anyio
import structlog
from anyio.abc import TaskStatus
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from manager import concurrency, registry
from manager.broker import custody, footprint, presence
from manager.broker.retry import TRANSIENT
from manager.daemon import seatfile
from manager.daemon.seat import Seat, session_to_reopen
from manager.daemon.survivors import SurvivorScan
from manager.workspace.identity import InstanceIdentity
from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from protocol import names
from protocol.errors import Refusal
from protocol.lifecycle import SeatLifecycle, SeatRecord
from protocol.maintenance import CUT_STATES
from protocol.refusals import Code

log = structlog.get_logger("cotal.readopt")

# A pdeathsig is delivered as the parent dies, but the kernel may still be tearing the child
# down when the successor looks.
SURVIVOR_WAIT_S = 10.0
# The seat states a successor relaunches.
LIVE_STATES = frozenset({"starting", "running", "exited", "restarting"})
# A stop the operator asked for (or had begun) keeps the seat, stopped, across managers.
KEPT_STATES = frozenset({"stopping", "stopped", "unproven"})


class Readopter(Protocol):
    """What re-adoption asks of the Manager: the records and the broker it reads, the fence
    that counts each re-adoption as lifecycle work, and the owner's own moves (adopt, relaunch,
    stop and prove, refuse), so the table keeps its one writer."""

    @property
    def space(self) -> str: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def identity(self) -> InstanceIdentity: ...

    @property
    def nc(self) -> Client: ...

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def survivor_scan(self) -> SurvivorScan: ...

    def custody_bucket(self) -> KeyValue: ...

    def lifecycle(
        self, what: str, seat: str | None = None
    ) -> AbstractAsyncContextManager[None]: ...

    def adopt(self, seat: Seat) -> None: ...

    async def relaunch(
        self, seat: Seat, *, continue_session: str | None = None, resume: str | None = None
    ) -> None: ...

    async def stop_and_prove(self, seat: Seat, *, graceful: bool) -> None: ...

    def refuse(self, seat: Seat, reason: str, *, footprint_owned: bool) -> None: ...

    def remove(self, seat: Seat) -> None: ...


class Readoption:
    def __init__(self, owner: Readopter) -> None:
        self.mgr = owner
        self._jobs: anyio.CapacityLimiter | None = None

    def enter_all(self) -> list[tuple[Seat, SeatRecord]]:
        """Every readable record becomes a seat in the table, in `exited`, before any await,
        so `ps` lists it from the first answer on and a spawn cannot take its name."""
        mgr = self.mgr
        entered: list[tuple[Seat, SeatRecord]] = []
        for loaded in seatfile.load_all(mgr.layout):
            record = loaded.record
            if record is None:
                log.error("seat.record_unreadable", path=str(loaded.path), error=loaded.error)
                continue
            try:
                connector = registry.load_connector(record.agent)
            except Refusal as exc:
                log.error("seat.readopt_failed", seat=record.name, error=exc.text)
                continue
            seat = Seat(
                name=record.name,
                agent=record.agent,
                uid=record.lifecycle_uid,
                cwd=Path(record.cwd),
                connector=connector,
                continuity=record.continuity,
                model=record.model,
                started_at=record.started_at,
                pointer_path=Path(record.pointer_path),
                custody_revision=record.custody_revision,
                generation_at_broker=record.generation,
                lifecycle=SeatLifecycle("exited"),
                session_id=record.session_id,
                restarts=record.restarts,
                last_exit=record.last_exit,
                allow_send=tuple(record.allow_send),
                subscribe=tuple(record.subscribe),
                allow_post=tuple(record.allow_post),
                profile=record.profile,
            )
            try:
                mgr.adopt(seat)
            except Refusal as exc:
                log.error("seat.readopt_failed", seat=record.name, uid=seat.uid, error=exc.text)
                continue
            entered.append((seat, record))
        return entered

    async def run(self, seat: Seat, record: SeatRecord, *, task_status: TaskStatus[None]) -> None:
        # Counted before the caller goes on, so a cut prepared meanwhile drains this too.
        async with self.mgr.lifecycle("re-adopt", seat=seat.name):
            task_status.started()
            try:
                # Every seat's re-adoption is its own task, started in table order; the shared
                # limiter lets only a few relaunch at once, each still failing on its own.
                async with self._limiter():
                    await self._readopt(seat, record)
            except Refusal as exc:
                self.mgr.refuse(seat, exc.text, footprint_owned=True)

    def _limiter(self) -> anyio.CapacityLimiter:
        # Made at the first re-adoption, so a COTAL_JOBS that does not parse refuses each seat
        # by name (kept `failed`, footprint kept) instead of failing the manager's start.
        if self._jobs is None:
            self._jobs = concurrency.limiter()
        return self._jobs

    async def _readopt(self, seat: Seat, record: SeatRecord) -> None:
        mgr = self.mgr
        if not await self._custody_ours(seat) or not self._not_carried(seat):
            return
        if record.state in KEPT_STATES:
            # Stopped by the operator (or on the way there): its process died with the
            # predecessor, which is proven here, and it stays stopped until `cotal start`.
            await self._prove_lifecycle_dead(seat)
            await mgr.stop_and_prove(seat, graceful=True)
            log.info("seat.readopted_stopped", seat=seat.name, uid=seat.uid, was=record.state)
            return
        if record.state not in LIVE_STATES:
            mgr.refuse(
                seat,
                f"not relaunched: the seat was {record.state}"
                + (f" ({record.reason})" if record.reason else "")
                + f" when the previous manager died; `cotal rm {seat.name}` removes it",
                footprint_owned=record.state not in ("evicting", "evicted"),
            )
            return
        await footprint.confirm_dm_durable(mgr.js, mgr.space, names.SEAT_OWNER, seat.name, seat.uid)
        await self._prove_lifecycle_dead(seat)
        continue_session, fork_from = session_to_reopen(seat)
        await self._release_predecessor_delivery(seat)
        before = seat.session_id
        await mgr.relaunch(seat, continue_session=continue_session, resume=fork_from)
        log.info(
            "seat.readopted",
            seat=seat.name,
            uid=seat.uid,
            continuity=seat.continuity,
            session_before=before,
            session_after=seat.session_id,
            observation={
                "exact": "reopened its session",
                "fork": "forked: a new session carrying its history",
                "fresh": "started fresh: this harness cannot reopen a session",
                "drain-only": "started fresh: this harness cannot continue a session (drain-only)",
            }[seat.continuity],
        )

    async def _custody_ours(self, seat: Seat) -> bool:
        """True when this manager holds the seat's custody at its generation; otherwise the
        seat is kept, refused, with its footprint left to the holder."""
        mgr = self.mgr
        held = await custody.read(mgr.custody_bucket(), seat.name, seat.uid)
        if (
            held is not None
            and held.record.holder == mgr.identity.instance_id
            and held.record.generation == seat.generation_at_broker
        ):
            seat.custody_revision = held.revision
            return True
        if (
            held is not None
            and held.record.generation > seat.generation_at_broker
            and await self._runs_at(seat, held.record.holder)
        ):
            self._forget(seat, held.record.holder, held.record.generation)
            return False
        who = (
            f"instance {held.record.holder} at generation {held.record.generation}"
            if held is not None
            else "nobody"
        )
        mgr.refuse(
            seat,
            f"custody-not-held: custody of {seat.name} is held by {who}, not by this "
            f"manager at generation {seat.generation_at_broker}; not relaunched, "
            "footprint kept",
            footprint_owned=False,
        )
        return False

    async def _runs_at(self, seat: Seat, holder: str) -> bool:
        """Whether `holder`'s presence entry claims the seat's uid: the new holder runs it."""
        try:
            live = await presence.live_uids(self.mgr.js, self.mgr.space)
        except Refusal:
            return False
        except TRANSIENT:
            # Unread now: kept and refused, as before; `cotal rm` drops it.
            return False
        here = live.get(seat.uid)
        return here is not None and here.instance_id == holder

    def _forget(self, seat: Seat, holder: str, generation: int) -> None:
        """The seat was taken over or moved and runs at its new holder: this root keeps nothing
        of it that could start it again (its record, its session pointer and the store this
        root chose for it, its standing captures), and says so once."""
        layout = self.mgr.layout
        for path in (
            layout.session_pointer(seat.agent, seat.name, seat.uid),
            layout.seat_record(seat.name, seat.uid),
        ):
            path.unlink(missing_ok=True)
        for tree in (
            layout.seat_store(seat.agent, seat.name, seat.uid),
            layout.standing / seat.name,
        ):
            if tree.is_dir() and not tree.is_symlink():
                shutil.rmtree(tree, ignore_errors=True)
        self.mgr.remove(seat)
        log.warning(
            "seat.forgotten",
            seat=seat.name,
            uid=seat.uid,
            holder_now=holder,
            generation_now=generation,
            reason="its custody moved on and its new holder runs it",
        )

    def _not_carried(self, seat: Seat) -> bool:
        """False, with the seat refused, when a cut of this root carries it. A cut of some seats
        carries only the seats its plan names: the others are this mesh's and come back."""
        store = Journal(self.mgr.layout)
        journal = store.load()
        if journal is not None and journal.state in CUT_STATES:
            try:
                planned = {a.identity.lifecycle_uid for a in store.resume_document(journal).agents}
            except Refusal:
                # A plan that cannot be read is no proof the seat is not in it.
                planned = {seat.uid}
            if seat.uid not in planned:
                return True
            self.mgr.refuse(
                seat,
                f"preserved: cut attempt {journal.attempt_id} ({journal.state}) carries this seat; "
                "finish it with `cotal down --preserve-state` and resume with `cotal up --restore`",
                footprint_owned=False,
            )
            return False
        return True

    async def _prove_lifecycle_dead(self, seat: Seat) -> None:
        scan = self.mgr.survivor_scan
        survivors = await scan.survivors(seat.uid)
        with anyio.move_on_after(SURVIVOR_WAIT_S):
            while survivors:
                await anyio.sleep(0.1)
                survivors = await scan.survivors(seat.uid)
        if survivors:
            raise Refusal(
                Code.UID_LIVE,
                f"processes of {seat.name}'s lifecycle outlived its manager: {survivors}",
                f"kill {' '.join(map(str, survivors))}, then `cotal stop {seat.name}` and "
                f"`cotal start {seat.name}`",
            )

    async def _release_predecessor_delivery(self, seat: Seat) -> None:
        mgr = self.mgr
        stream = names.dm_stream(mgr.space)
        durable = names.dm_durable(names.SEAT_OWNER, seat.name, seat.uid)
        try:
            with anyio.fail_after(5.0):
                info = await mgr.js.consumer_info(stream, durable)
                if not info.num_ack_pending:
                    return
                # The ack subject of the one outstanding delivery (the durable admits one):
                # $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>
                sseq, dseq = info.delivered.stream_seq, info.delivered.consumer_seq
                await mgr.nc.publish(f"$JS.ACK.{stream}.{durable}.1.{sseq}.{dseq}.0.0", b"-NAK")
                await mgr.nc.flush()
        except TRANSIENT as exc:
            # The broker redelivers it after ack_wait anyway.
            log.warning("seat.release_deferred", seat=seat.name, error=repr(exc))
            return
        log.info("delivery.released", seat=seat.name, seq=sseq, reason="its manager died mid-turn")
