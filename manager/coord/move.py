"""`cotal move NAME... --to INSTANCE`: move seats to another manager on the same broker.

One command at the source. The destination is asked first (`probe`: is it active, are the names
free, does it trust this root's signer, is its clock trusted, is there room in its table, and would
its admission and launch take each seat: its launch profile, its harness at the version the seat
runs, the disk its history needs? `moveneeds.py` says what), so a refusal it can give before
anything happens leaves the seats running as they were. Then the seats are cut while the rest of the
mesh runs (`down --preserve-state --seat`), the sealed attempt is packed and streamed into the
space's move bucket (a JetStream Object Store, chunked and digest-checked, never read whole into
memory), and the destination is offered it: it fetches it, checks the whole digest, and runs its own
`up --restore` on it, which admits it with its own trust store and adopts the seats into its running
mesh. The object is removed once the destination answered. A refusal from the destination before its
custody claim brings the seats back here (adopted from the same checkpoint, in their own sessions);
after its claim the destination owns them, and a rerun of the same command finishes the move there.

`downtimeMs` runs from the source's fence (the cut's prepare) to the destination's answer,
which comes once each moved seat is running there.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec
from msgspec import UNSET

from manager.coord import moveneeds, precopy
from manager.coord.records import MovedSeat, MoveResult, RestoreResult
from manager.coord.report import say as progress
from manager.coord.requests import CutRequest, MoveRequest, RestoreRequest
from protocol.errors import Refusal
from protocol.maintenance import READY
from protocol.refusals import Code

# The destination's whole resume of the moved seats (its own admission, restore and adoption).
OFFER_TIMEOUT_S = 330.0
# The destination's probe runs each agent's harness check (a `--version` run of up to 15 s).
PROBE_TIMEOUT_S = 45.0
PRESENCE_POLL_S = 0.5


async def move(req: MoveRequest, root: Path) -> MoveResult:
    from manager.broker.connection import LazyConnection
    from manager.workspace.layout import Layout

    t0 = time.monotonic()
    layout = Layout.at(root)
    names_asked = list(dict.fromkeys(req.names))
    here = await _here(layout, names_asked)
    if here.status.instance_id == req.to:
        raise Refusal(
            Code.BAD_ARGS,
            f"{req.to} is this root's own manager",
            "name another manager's instance (`cotal ps --fleet` lists them)",
        )
    async with LazyConnection(here.record.server, here.creds, name="cotal-move") as conn:
        nc = await conn.client()
        js = await conn.jetstream()
        rows = {r.name: r for r in await seats_here(layout)} if here.answered else {}
        uids = _uids_asked(names_asked, rows, here.pending)
        status, pending = here.status, here.pending
        # What the destination must have for each seat; a rerun past its fence has no seat
        # running here to describe, and the destination's admission checks it after the offer.
        needs = await moveneeds.needs_of(layout, rows, names_asked) if pending is None else []
        probed = await _ask(
            nc,
            status.space,
            req.to,
            "probe",
            _probe(layout, status, names_asked, uids, needs),
            PROBE_TIMEOUT_S,
        )
        if probed.already and pending is not None:
            # The destination adopted them before this command's first run died.
            progress(f"destination {req.to} already runs {', '.join(names_asked)}")
            await anyio.to_thread.run_sync(_forget_here, layout, pending.attempt)
            return _report(req, pending.attempt, names_asked, uids, None, 0, t0)
        shipped: dict[str, Any] = {}
        if pending is None:
            progress(f"destination {req.to} takes {', '.join(names_asked)}; shipping history")
            shipped = await precopy.ship(
                layout,
                js,
                status.space,
                status.instance_id,
                lambda verb, record, timeout: _ask(nc, status.space, req.to, verb, record, timeout),
                [(n, rows[n].lifecycle_uid, rows[n].cwd) for n in names_asked],
            )
        # The seats' downtime starts here: the pre-copy ran while they still worked.
        t_fence = time.monotonic()
        attempt, attempt_dir, increments = await _cut_here(
            req, root, layout, names_asked, pending, shipped
        )
        precopied = [base.bundle_sha256 for base in shipped.values()]
        offer = await _carry(
            js, layout, here, req.to, attempt, attempt_dir, names_asked, uids, precopied
        )
        answer = await _offered(nc, js, root, layout, here, req.to, offer, attempt_dir, shipped)
        downtime = int((time.monotonic() - t_fence) * 1000)
        await anyio.to_thread.run_sync(_forget_here, layout, attempt)
        await anyio.to_thread.run_sync(precopy.forget, layout, shipped)
    # The destination's restore result, strictly: what it says it adopted, under which claim.
    result = msgspec.json.decode(bytes(answer.result), type=RestoreResult | None)
    carried = {
        n: (shipped[n].bundle_bytes if n in shipped else 0, increments.get(n)) for n in names_asked
    }
    return _report(req, attempt, names_asked, uids, result, downtime, t0, carried)


@dataclass(frozen=True)
class _Here:
    """The source as the move found it: its manager's answer (or, for a rerun whose manager
    died, its identity from its files), the cut of these seats its journal holds, and the
    broker its mesh runs on."""

    answered: bool
    status: Any
    pending: _Pending | None
    record: Any
    creds: Path | None


async def _here(layout: Any, names_asked: list[str]) -> _Here:
    from manager.coord import mesh

    async with mesh.control(layout) as session:
        answered = await session.status()
    # A rerun after this root's manager died mid-move: the cut is finished offline, as
    # `down --preserve-state` would, so the move needs no manager here to go on.
    pending = _pending_cut(layout, names_asked)
    status = answered or (_source_of(layout) if pending is not None else None)
    if status is None:
        raise Refusal(
            Code.NOT_UP, f"no manager answers in {layout.root}", "start it with `cotal up --detach`"
        )
    record = mesh.read_mesh(layout)
    if record is None:
        raise Refusal(
            Code.NOT_UP, f"no mesh record in {layout.root}", "start it with `cotal up --detach`"
        )
    creds = (
        layout.broker_creds
        if record.embedded_broker is not None
        else (Path(record.creds) if record.creds else None)
    )
    return _Here(answered is not None, status, pending, record, creds)


def _uids_asked(
    names_asked: list[str], rows: dict[str, Any], pending: _Pending | None
) -> list[str]:
    # A rerun after this command died past its fence: the journal names the cut of exactly
    # these seats, and the move goes on from it (the cut is finished first if need be).
    missing = [n for n in names_asked if n not in rows]
    if missing and pending is None:
        raise Refusal(
            Code.NO_SUCH_SEAT,
            f"no seat named {', '.join(missing)} runs here",
            "see `cotal ps`; a move carries running seats",
        )
    if pending is not None:
        return [pending.uids[n] for n in names_asked]
    return [rows[n].lifecycle_uid for n in names_asked]


async def _cut_here(
    req: MoveRequest,
    root: Path,
    layout: Any,
    names_asked: list[str],
    pending: _Pending | None,
    shipped: dict[str, Any],
) -> tuple[str, Path, dict[str, int]]:
    """The sealed cut of the moved seats: made now, or the one a rerun's journal holds."""
    if pending is not None and pending.state == READY:
        progress(f"continuing the move of cut {pending.attempt} (journal ready)")
        return pending.attempt, layout.checkpoints / pending.attempt, {}
    progress(f"cutting {', '.join(names_asked)} here")
    try:
        sealed = await _cut_some(req, root, names_asked, shipped)
    except BaseException:
        # Nothing was sealed on top of the shipped history; a cut left prepared is aborted or
        # rerun, and a rerun carries the whole history.
        await anyio.to_thread.run_sync(precopy.forget, layout, shipped)
        raise
    increments = {seat.name: seat.bundle_bytes for seat in sealed.result.seats}
    return sealed.result.attempt_id, Path(sealed.result.checkpoint_dir), increments


async def _carry(
    js: Any,
    layout: Any,
    here: _Here,
    to: str,
    attempt: str,
    attempt_dir: Path,
    names_asked: list[str],
    uids: list[str],
    precopied: list[str],
) -> Any:
    """The sealed attempt packed into the move bucket, and the offer that names it, once no
    presence claims the moved seats live."""
    from protocol import move

    space = here.status.space
    obj, digest, size = await _put(js, space, attempt, attempt_dir, layout, to=to)
    await _presence_gone(js, space, uids)
    progress(f"carried {size} bytes through the broker; the destination adopts them")
    return move.MoveOffer(
        source=here.status.instance_id,
        attempt_id=attempt,
        object=obj,
        sha256=digest,
        bytes=size,
        seats=names_asked,
        uids=uids,
        precopy=precopied,
    )


async def _offered(
    nc: Any,
    js: Any,
    root: Path,
    layout: Any,
    here: _Here,
    to: str,
    offer: Any,
    attempt_dir: Path,
    shipped: dict[str, Any],
) -> Any:
    """The destination's answer to the offer. A refusal before its custody claim takes the
    seats back here; no answer at all leaves them sealed (two writers would be worse than a
    wait); the carried object is dropped from the bucket either way."""
    space = here.status.space
    try:
        return await _offer_answer(nc, js, space, to, offer)
    except Refusal as exc:
        if getattr(exc, "claimed", False):
            raise
        if not isinstance(exc, _Refused):
            # No answer: whether the destination claimed the seats cannot be told, so they
            # are not started here.
            raise Refusal(
                Code.MOVE_INCOMPLETE,
                f"{exc.message}; the seats are cut here and wait sealed (attempt "
                f"{offer.attempt_id})",
                f"once destination {to} runs again, rerun the same `cotal move`: it "
                "offers the cut again, and a destination that took them says so",
            ) from None
        progress(f"the destination refused ({exc.code}); the seats resume here")
        await _take_back(root, attempt_dir, space, here.record, here.creds)
        await anyio.to_thread.run_sync(precopy.forget, layout, shipped)
        raise Refusal(
            exc.code,
            f"{exc.message}; the seats run here again, in their own sessions",
            exc.cure,
        ) from None
    finally:
        await _drop(js, space, offer.object)


def _report(
    req: MoveRequest,
    attempt: str,
    names_asked: list[str],
    uids: list[str],
    result: RestoreResult | None,
    downtime: int,
    t0: float,
    carried: dict[str, tuple[int, int | None]] | None = None,
) -> MoveResult:
    """Per seat its uid, session, generation and downtime, and what carried its history:
    `precopyBytes` shipped before the fence, `bundleBytes` the cut's increment."""
    moved = {s.name: s for s in result.seats} if result is not None else {}
    claimed = {c.name: c.generation for c in result.claims} if result is not None else {}
    seats = []
    for n, u in zip(names_asked, uids, strict=True):
        precopy_bytes, bundle_bytes = (carried or {}).get(n, (None, None))
        seat = moved.get(n)
        seats.append(
            MovedSeat(
                name=n,
                lifecycle_uid=u,
                session=seat.session_after if seat is not None else None,
                generation=claimed.get(n),
                downtime_ms=downtime,
                precopy_bytes=UNSET if precopy_bytes is None else precopy_bytes,
                bundle_bytes=UNSET if bundle_bytes is None else bundle_bytes,
            )
        )
    return MoveResult(
        attempt_id=attempt,
        to=req.to,
        seats=seats,
        downtime_ms=downtime,
        total_ms=int((time.monotonic() - t0) * 1000),
        destination_clock=result.clock if result is not None else UNSET,
    )


@dataclass(frozen=True)
class _Source:
    """This root's manager as the move needs it: its space and instance."""

    space: str
    instance_id: str


def _source_of(layout: Any) -> _Source | None:
    """The source's identity read from its files, for a rerun whose manager is gone."""
    from manager.coord import mesh
    from manager.workspace import identity

    record = mesh.read_mesh(layout)
    if record is None:
        return None
    ident = identity._load(layout.instance_identity(record.space), record.space)
    return _Source(record.space, ident.instance_id)


@dataclass(frozen=True)
class _Pending:
    attempt: str
    state: str
    uids: dict[str, str]


def _pending_cut(layout: Any, names_asked: list[str]) -> _Pending | None:
    """The cut of exactly these seats this root's journal holds (begun or sealed), if any."""
    from manager.workspace.journal import Journal
    from protocol.maintenance import CUT_COMMITTED, CUT_INTENT

    journal = Journal(layout)
    record = journal.load() if layout.journal.exists() else None
    if record is None or record.state not in (CUT_INTENT, CUT_COMMITTED, READY):
        return None
    planned = {a.name: a.identity.lifecycle_uid for a in journal.resume_document(record).agents}
    if set(planned) != set(names_asked):
        return None
    return _Pending(record.attempt_id, record.state, planned)


async def _presence_gone(js: Any, space: str, uids: list[str]) -> None:
    """Until no presence claims the moved seats live: a manager that died mid-move could not
    delete theirs, and a destination refuses a seat that still shows present (`uid-live`).
    Their processes are proven gone by the cut, so this waits out the presence TTL at most."""
    from manager.broker.presence import live_uids
    from protocol import names

    polls = int((names.PRESENCE_TTL_S + 4.0) / PRESENCE_POLL_S)
    for _ in range(polls):
        if not set(uids) & set(await live_uids(js, space)):
            return
        await anyio.sleep(PRESENCE_POLL_S)


async def seats_here(layout: Any) -> list[Any]:
    """This root's manager's seats, as `cotal ps` lists them."""
    from manager.coord import mesh
    from protocol import control

    async with mesh.control(layout) as session:
        return await session.request(control.PS, control.NoArgs())


async def fleet_load(layout: Any) -> dict[str, int]:
    """Every other live manager of this root's broker, and how many seats it holds."""
    from manager.broker import fleet
    from manager.broker.connection import LazyConnection

    here = await _here(layout, [])
    async with LazyConnection(here.record.server, here.creds, name="cotal-drain") as conn:
        snap = await fleet.snapshot(await conn.jetstream(), here.status.space)
    held = fleet.load(snap)
    held.pop(here.status.instance_id, None)
    return held


def _probe(layout: Any, status: Any, seats: list[str], uids: list[str], needs: list[Any]) -> Any:
    from manager.workspace import identity
    from protocol import move

    signer = identity._load(layout.instance_identity(status.space), status.space).public_key_b64
    return move.MoveProbe(
        source=status.instance_id, signer=signer, seats=seats, uids=uids, needs=needs
    )


class _Refused(Refusal):
    def __init__(self, code: str, message: str, cure: str, *, claimed: bool) -> None:
        super().__init__(code, message, cure)
        self.claimed = claimed


async def _ask(nc: Any, space: str, to: str, verb: str, record: Any, timeout: float) -> Any:
    """One request to the destination's own subject; its refusal raised as ours."""
    from manager.broker import carry
    from protocol import move, names

    msg = await carry.ask(
        nc,
        names.move_subject(space, to, verb),
        move.encode(record),
        timeout=timeout,
        what=f"{verb} as instance {to}"
        + (" (the seats were not touched)" if verb == "probe" else ""),
    )
    answer = move.decode_answer(msg.data)
    if not answer.ok:
        code = answer.code or Code.MOVE_FAILED
        if answer.claimed:
            raise _Refused(
                Code.MOVE_INCOMPLETE,
                f"destination {to} claimed the seats and then refused ({code}: {answer.message})",
                "rerun the same `cotal move` to finish it there; the seats are its own now",
                claimed=True,
            )
        raise _Refused(
            code,
            f"destination {to}: {answer.message}",
            "see the destination's message; nothing was moved",
            claimed=False,
        )
    return answer


async def _offer_answer(nc: Any, js: Any, space: str, to: str, offer: Any) -> Any:
    """The destination's answer to the offer, or `destination-gone` as soon as its manager's
    lease is gone: a manager that died mid-adoption never answers, and waiting out the whole
    offer timeout would only keep the operator from the rerun that finishes the move."""
    from manager.broker.fleet import instance_gone

    answers: list[Any] = []
    errors: list[Refusal] = []
    async with anyio.create_task_group() as tg:

        async def ask() -> None:
            try:
                answers.append(await _ask(nc, space, to, "offer", offer, OFFER_TIMEOUT_S))
            except Refusal as exc:
                errors.append(exc)
            tg.cancel_scope.cancel()

        async def watch() -> None:
            try:
                await instance_gone(js, space, to)
            except Refusal:
                # The lease cannot be read now: the offer's own answer or timeout decides.
                await anyio.sleep_forever()
            tg.cancel_scope.cancel()

        tg.start_soon(ask)
        tg.start_soon(watch)
    if errors:
        raise errors[0]
    if not answers:
        raise Refusal(
            Code.DESTINATION_GONE,
            f"destination {to}'s manager went away (its lease is gone) before it answered the "
            "offer",
            "start the destination's manager again, then rerun the same `cotal move`",
        )
    return answers[0]


async def _cut_some(req: MoveRequest, root: Path, seats: list[str], shipped: dict[str, Any]) -> Any:
    from manager.coord import cut

    sealed = await cut.cut(
        CutRequest(drain_timeout=req.drain_timeout, seat=tuple(seats), precopy=shipped), root
    )
    if not isinstance(sealed, cut.Sealed):
        raise Refusal(
            Code.SEALED_CUT_WAITING,
            "a sealed cut already waits in this root",
            "resume, pack or discard it first (`cotal checkpoint list`), then move",
        )
    return sealed


async def _put(
    js: Any, space: str, attempt: str, attempt_dir: Path, layout: Any, *, to: str | None = None
) -> tuple[str, str, int]:
    from manager.checkpoint.archive import write_archive

    tmp = layout.control / f".move-{attempt}.{secrets.token_hex(4)}.tar"
    try:
        digest, size = await anyio.to_thread.run_sync(write_archive, attempt_dir, tmp)
        meta = await _carried_meta(layout, space, attempt, to)
        await _put_archive(js, space, attempt, tmp, (size, digest), meta)
    finally:
        tmp.unlink(missing_ok=True)
    return attempt, digest, size


async def _put_archive(
    js: Any, space: str, attempt: str, tmp: Path, want: tuple[int, str], meta: Any
) -> None:
    """The packed attempt streamed from its file into the bucket in bounded memory, hashed as
    it is read: what was put is the archive the offer names, byte for byte."""
    from manager.broker import carry

    put = await carry.put(js, space, attempt, tmp, meta=meta)
    if put != want:
        raise Refusal(
            Code.INTEGRITY,
            f"the packed attempt {tmp.name} changed while it was put ({put[0]} bytes hashing "
            f"to {put[1]}, not {want[0]} bytes hashing to {want[1]})",
            "rerun the same `cotal move`: it packs the sealed cut again",
        )


async def _carried_meta(layout: Any, space: str, attempt: str, to: str | None) -> Any:
    from manager.workspace import identity
    from manager.workspace.journal import Journal
    from protocol import move

    # The object names what it carries, so `cotal ps --fleet` shows the seats in transit (to
    # `to`) while it is in the bucket: the seats and generations of the plan this attempt cut.
    # Only a roster reads it, so a plan that cannot be read carries the object undescribed.
    meta = None
    try:
        plan = await anyio.to_thread.run_sync(Journal(layout).resume_document)
        if plan.attempt_id == attempt and plan.agents:
            meta = move.CarriedMeta(
                source=identity._load(layout.instance_identity(space), space).instance_id,
                attempt_id=attempt,
                seats=[
                    move.CarriedSeat(
                        name=a.name,
                        lifecycle_uid=a.identity.lifecycle_uid,
                        generation=a.generation,
                    )
                    for a in plan.agents
                ],
                to=to,
            )
    except (Refusal, OSError, ValueError) as exc:
        progress(f"note: the carried copy does not name its seats ({exc})")
    return meta


def _forget_here(layout: Any, attempt: str) -> None:
    """The destination runs the seats now: what this root kept of them goes, so nothing here can
    start them again or stand in the way of their coming back. Their session files (only under
    this root's `.cotal/sessions`) and pointers, then the sealed attempt and its journal."""
    import shutil

    from manager.coord import checkpoints
    from manager.workspace.journal import Journal

    inventory = Journal(layout).resume_document()
    sessions = Path(os.path.normpath(layout.sessions))
    for agent in inventory.agents:
        for store in agent.launch.session_stores:
            path = Path(os.path.normpath(store))
            if path.is_relative_to(sessions) and path != sessions and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
        pointer = layout.session_pointer(
            agent.launch.connector, agent.name, agent.identity.lifecycle_uid
        )
        pointer.unlink(missing_ok=True)
        # A manager that died mid-move kept the seat's record; the next one must not list it.
        layout.seat_record(agent.name, agent.identity.lifecycle_uid).unlink(missing_ok=True)
    checkpoints.discard(layout.root, attempt)


async def _drop(js: Any, space: str, obj: str) -> None:
    from manager.broker import carry

    if not await carry.drop(js, space, obj):
        progress(f"note: the carried copy {obj} stays in the move bucket")


async def _take_back(
    root: Path, attempt_dir: Path, space: str, record: Any, creds: Path | None
) -> None:
    """The destination refused before its claim: this mesh adopts the seats back from the
    checkpoint it just sealed, into their own sessions."""
    from manager.coord import restore

    back = RestoreRequest(
        restore=str(attempt_dir),
        space=space,
        # The broker the mesh runs on, never a new embedded one: the seats' inboxes and
        # custody are there.
        server=None if record.embedded_broker is not None else record.server,
        creds=None if record.embedded_broker is not None or creds is None else str(creds),
    )
    await restore.restore(back, root)
