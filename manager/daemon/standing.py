"""Standing checkpoints (issue 39, items 1 and 2): a failover seat captured at every turn's end.

For a root with `[failover] enabled = true`, each clean turn of a seat ends here, between the
reply's publish and the inbound message's acknowledgement: the seat is captured as a cut
captures it (repository, session store and pointer, the resume entry), sealed and signed by
this manager, packed, and put into the broker's object store under one name per seat
lifecycle (`names.standing_object`), which supersedes the one before. Only then is the message
acknowledged, so a message whose turn its sender saw answered is either in a stored standing
checkpoint or still unacknowledged, and redelivered to whoever holds the seat next.

Why a live capture is safe here: the seat's bridge is the only thing that hands its harness a
turn, and it is inside the turn's settle, so the harness is idle (its turn ended, nothing new
is handed to it) and its session store holds the finished turn; the next message waits behind
this capture exactly as it waits behind a long turn, and a cut's drain waits for it too. What
it cannot carry: processes the seat started and left running, and effects outside its tree
(docs/design.md, "Standing checkpoints").

The record says what it is: `standing = "turn-boundary"` in the seat's record, beside its
continuity class, never a proven stop. The inbox is not in it: the seat's durable stays on the
broker, which is what a standby takes over with the custody.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Protocol

import anyio
import msgspec
import structlog
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from connectors.privatefs import DIR_MODE, ensure_private_dir, write_private_atomic
from manager import failpoint
from manager.broker import carry, custody
from manager.checkpoint import cut
from manager.checkpoint.archive import write_archive
from manager.daemon.events import Events
from manager.daemon.preserve import Preservation
from manager.daemon.seat import Seat
from manager.registry import FileConfig
from manager.workspace.identity import InstanceIdentity
from manager.workspace.layout import Layout
from protocol import names
from protocol.errors import Refusal
from protocol.events import EventDetail
from protocol.instant import now_iso
from protocol.inventory import encode_inventory
from protocol.names import AttemptIdField as AttemptId
from protocol.refusals import Code
from protocol.standing import StandingMeta, encode_standing_meta

log = structlog.get_logger("cotal.standing")


class StandingOwner(Protocol):
    """What a standing checkpoint asks of the Manager: who and where it is, its configuration
    and broker, the cut's own inventory rules, and its events."""

    @property
    def config(self) -> FileConfig: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def identity(self) -> InstanceIdentity: ...

    @property
    def space(self) -> str: ...

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def replicas(self) -> int: ...

    @property
    def events(self) -> Events: ...

    @property
    def preservation(self) -> Preservation: ...

    def custody_bucket(self) -> KeyValue: ...


class StandingCheckpoints:
    """Takes, seals and stores one seat's standing checkpoint at a time per seat (a seat's
    turns are sequential, so its captures are too); seats capture side by side."""

    def __init__(self, mgr: StandingOwner) -> None:
        self.mgr = mgr

    @property
    def enabled(self) -> bool:
        return self.mgr.config.failover.enabled

    async def take(self, seat: Seat) -> None:
        """Capture the idle seat and store it; a failure is logged and said as an event, and
        the turn's message is acknowledged all the same (see `settle`)."""
        t0 = time.monotonic()
        attempt = names.mint_attempt_id()
        try:
            size = await self._take(seat, attempt)
        except Exception as exc:
            # Whatever failed (a full disk, a broker that refused the put, a bug): the net is
            # down for this turn, said loudly, and the seat's delivery goes on.
            text = exc.text if isinstance(exc, Refusal) else f"{type(exc).__name__}: {exc}"
            code = exc.code if isinstance(exc, Refusal) else Code.CAPTURE_FAILED
            log.error("standing.failed", seat=seat.name, uid=seat.uid, error=text)
            detail = EventDetail(code=code, attempt_id=attempt)
            self.mgr.events.emit("checkpoint.standing_failed", seat.name, seat.uid, detail)
            return
        took_ms = int((time.monotonic() - t0) * 1000)
        log.info(
            "standing.stored",
            seat=seat.name,
            uid=seat.uid,
            attempt=attempt,
            bytes=size,
            took_ms=took_ms,
        )
        detail = EventDetail(attempt_id=attempt, duration_s=round(took_ms / 1000, 3))
        self.mgr.events.emit("checkpoint.standing", seat.name, seat.uid, detail)

    async def _take(self, seat: Seat, attempt: str) -> int:
        mgr = self.mgr
        held = await self._held(seat)
        captured_at = now_iso()
        inventory = mgr.preservation.inventory_of(attempt, frozenset({seat.name}))
        (agent,) = inventory.agents
        mine = mgr.layout.standing / seat.name
        here = await anyio.to_thread.run_sync(_fresh_dir, mgr.layout.standing, seat.name, attempt)
        base = await anyio.to_thread.run_sync(_read_base, mine, seat.uid)
        summary = await cut.capture_seat(
            mgr.layout,
            here,
            agent,
            pointer_path=seat.pointer_path,
            extra_stores=[],
            declared=seat.continuity,
            supports_fresh_start=seat.connector.capabilities.supports_fresh_start,
            identity=mgr.identity,
            space=mgr.space,
            horizon_ms=mgr.config.recency.horizon_s * 1000,
            custody_revision=held.revision,
            standing=True,
            since=base.attempt if base is not None else None,
            since_dir=mine / base.attempt if base is not None else None,
        )
        await anyio.to_thread.run_sync(
            cut.seal_attempt,
            here,
            attempt,
            mgr.space,
            [summary],
            encode_inventory(inventory),
            mgr.identity,
        )
        failpoint.reached("standing.after-seal", mgr.layout.root)
        on = summary.since if base is not None and summary.since == base.attempt else None

        def meta(of: str, builds_on: str | None) -> str:
            return encode_standing_meta(
                StandingMeta(
                    instance=mgr.identity.instance_id,
                    generation=held.record.generation,
                    after_s=mgr.config.failover.after_s,
                    attempt_id=of,
                    captured_at=captured_at,
                    base=builds_on,
                )
            )

        if on is not None and base is not None and not base.stored:
            # The base goes to the broker before the first head that needs it, so a standby
            # never finds a head whose base is not there.
            await self._put(
                mine / base.attempt,
                names.standing_base_object(seat.name, seat.uid),
                meta(base.attempt, None),
            )
            base = _Base(base.attempt, seat.uid, base.bundle_bytes, stored=True)
            await anyio.to_thread.run_sync(_write_base, mine, base)
        size = await self._put(here, names.standing_object(seat.name, seat.uid), meta(attempt, on))
        failpoint.reached("standing.after-put", mgr.layout.root)
        if on is None:
            # A full capture: the base the next turns' captures build on.
            base = _Base(attempt, seat.uid, summary.bundle_bytes, stored=False)
            await anyio.to_thread.run_sync(_write_base, mine, base)
        elif base is not None and summary.bundle_bytes * 2 > base.bundle_bytes:
            # The history grew by half the base since: the next capture carries it whole.
            await anyio.to_thread.run_sync(_drop_base, mine)
            base = None
        await anyio.to_thread.run_sync(
            _keep_only, here, mine / base.attempt if base is not None else None
        )
        return size

    async def _put(self, attempt_dir: Path, name: str, description: str) -> int:
        """The sealed attempt packed and streamed into the standing bucket under `name`."""
        mgr = self.mgr
        packed = attempt_dir.with_name(f".{attempt_dir.name}.tar")
        packed.unlink(missing_ok=True)
        try:
            digest, size = await anyio.to_thread.run_sync(write_archive, attempt_dir, packed)
            put = await carry.put(
                mgr.js,
                mgr.space,
                name,
                packed,
                bucket=names.standing_bucket(mgr.space),
                replicas=mgr.replicas,
                description=description,
            )
        finally:
            packed.unlink(missing_ok=True)
        if put != (size, digest):
            raise Refusal(
                Code.INTEGRITY,
                f"the standing checkpoint {attempt_dir.name} changed while it was put as {name} "
                f"({put[0]} bytes hashing to {put[1]}, not {size} bytes hashing to {digest})",
                "nothing to do: the next turn's end captures it again",
            )
        return size

    async def _held(self, seat: Seat) -> custody.Held:
        """The seat's custody record, held by this manager at the seat's generation; anything
        else refuses. A holder that lost the seat must never put a standing checkpoint: its put
        would supersede the new holder's. (A put racing the loss is told apart by the
        generation in the object's description, which a takeover checks.)"""
        mgr = self.mgr
        held = await custody.read(mgr.custody_bucket(), seat.name, seat.uid)
        if (
            held is None
            or held.record.holder != mgr.identity.instance_id
            or held.record.generation != seat.generation_at_broker
        ):
            who = "nobody" if held is None else f"{held.record.holder} at {held.record.generation}"
            raise Refusal(
                Code.CUSTODY_LOST,
                f"{seat.name}: this manager no longer holds its custody (held by {who}), so no "
                "standing checkpoint is taken",
                "nothing to do here: the seat's holder takes its own",
            )
        return held


def _fresh_dir(standing: Path, seat: str, attempt: str) -> Path:
    """`<standing>/<seat>/<attempt>`, 0700 all the way, new (an attempt id is never reused)."""
    names.check_seat_name(seat)
    ensure_private_dir(standing.parent)
    ensure_private_dir(standing)
    ensure_private_dir(standing / seat)
    path = standing / seat / attempt
    os.mkdir(path, DIR_MODE)
    return path


BASE_FILE = "base.json"


class _Base(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """The seat's base capture here: the full one its incremental standing checkpoints build
    on, its history bundle's size, and whether the broker holds it yet (as the base object)."""

    attempt: AttemptId
    uid: str
    bundle_bytes: int
    stored: bool


def _read_base(mine: Path, uid: str) -> _Base | None:
    """The base, when its record reads, is this lifecycle's and its sealed directory is here;
    anything else is no base (the next capture is full)."""
    try:
        base = msgspec.json.decode((mine / BASE_FILE).read_bytes(), type=_Base)
    except (OSError, msgspec.DecodeError):
        return None
    sealed = mine / base.attempt / "manifest.json"
    if base.uid != uid or not sealed.is_file() or sealed.is_symlink():
        return None
    return base


def _write_base(mine: Path, base: _Base) -> None:
    write_private_atomic(mine / BASE_FILE, msgspec.json.encode(base))


def _drop_base(mine: Path) -> None:
    (mine / BASE_FILE).unlink(missing_ok=True)


def _keep_only(newest: Path, base: Path | None) -> None:
    """The seat's older local captures (and any a crash left half-written) go once the newest
    is stored, but for the base the next captures build on: the broker's copies are the ones a
    standby reads, these are for the next capture and the operator."""
    for old in newest.parent.iterdir():
        if old in (newest, base) or old.name == BASE_FILE:
            continue
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
