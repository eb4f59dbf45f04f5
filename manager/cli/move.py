"""`cotal move NAME... --to INSTANCE`: move seats to another manager on the same broker.

One command at the source. The destination is asked first (`probe`: is it active, are the names
free, does it trust this root's signer?), so a refusal it can give before anything happens
leaves the seats running as they were. Then the seats are cut while the rest of the mesh runs
(`down --preserve-state --seat`), the sealed attempt is packed and put in the space's move
bucket (a JetStream Object Store, chunked and digest-checked), and the destination is offered
it: it fetches it, checks the whole digest, and runs its own `up --restore` on it, which admits
it with its own trust store and adopts the seats into its running mesh. The object is removed
once the destination answered. A refusal from the destination before its custody claim brings
the seats back here (adopted from the same checkpoint, in their own sessions); after its claim
the destination owns them, and a rerun of the same command finishes the move there.

`downtimeMs` runs from the source's fence (the cut's prepare) to the destination's answer,
which comes once each moved seat is running there.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from manager import eventloop
from manager.cli import precopy
from manager.cli.args import Subcommands, command, root_of
from manager.cli.output import emit_json, progress, say
from protocol.errors import Refusal
from protocol.maintenance import READY
from protocol.refusals import Code

# The destination's whole resume of the moved seats (its own admission, restore and adoption).
OFFER_TIMEOUT_S = 330.0
PROBE_TIMEOUT_S = 10.0
PRESENCE_POLL_S = 0.5


def register(sub: Subcommands) -> None:
    move = command(
        sub,
        "move",
        "move seats to another manager on this broker: cut here, adopted there",
        "cotal move alice --to q6a6ihz3a8bsldggwykb2u9ubzcil3y",
        "cotal move alice bob --to q6a6ihz3a8bsldggwykb2u9ubzcil3y --json",
    )
    move.add_argument("names", nargs="+", metavar="NAME", help="a seat to move (repeatable)")
    move.add_argument(
        "--to",
        required=True,
        metavar="INSTANCE",
        help="the destination manager's instance id, as its `cotal status` (or `cotal ps "
        "--fleet`) prints it",
    )
    move.add_argument(
        "--drain-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds each seat's turn in flight may take to finish before it is cut anyway",
    )
    move.set_defaults(run=run_move)


def run_move(args: argparse.Namespace) -> int:
    out = eventloop.run(_move, args, root_of(args))
    if args.json:
        emit_json(out)
        return 0
    for seat in out["seats"]:
        say(
            f"moved {seat['name']} to {out['to']}: uid {seat['lifecycleUid']}, session "
            f"{seat['session']}, generation {seat['generation']}"
        )
    say(f"downtime {out['downtimeMs']} ms, total {out['totalMs']} ms")
    return 0


async def _move(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from manager.broker.connection import LazyConnection
    from manager.cli import mesh
    from manager.workspace.layout import Layout

    t0 = time.monotonic()
    layout = Layout.at(root)
    names_asked = list(dict.fromkeys(args.names))
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
    if status.instance_id == args.to:
        raise Refusal(
            Code.BAD_ARGS,
            f"{args.to} is this root's own manager",
            "name another manager's instance (`cotal ps --fleet` lists them)",
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
    async with LazyConnection(record.server, creds, name="cotal-move") as conn:
        nc = await conn.client()
        js = await conn.jetstream()
        rows = {r.name: r for r in await _ps(layout)} if answered is not None else {}
        # A rerun after this command died past its fence: the journal names the cut of exactly
        # these seats, and the move goes on from it (the cut is finished first if need be).
        missing = [n for n in names_asked if n not in rows]
        if missing and pending is None:
            raise Refusal(
                Code.NO_SUCH_SEAT,
                f"no seat named {', '.join(missing)} runs here",
                "see `cotal ps`; a move carries running seats",
            )
        uids = (
            [pending.uids[n] for n in names_asked]
            if pending is not None
            else [rows[n].lifecycle_uid for n in names_asked]
        )
        probed = await _ask(
            nc,
            status.space,
            args.to,
            "probe",
            _probe(layout, status, names_asked, uids),
            PROBE_TIMEOUT_S,
        )
        if probed.already and pending is not None:
            # The destination adopted them before this command's first run died.
            progress(f"destination {args.to} already runs {', '.join(names_asked)}")
            await anyio.to_thread.run_sync(_forget_here, layout, pending.attempt)
            return _report(args, pending.attempt, names_asked, uids, {}, 0, t0)
        shipped: dict[str, Any] = {}
        increments: dict[str, int] = {}
        if pending is None:
            progress(f"destination {args.to} takes {', '.join(names_asked)}; shipping history")
            shipped = await precopy.ship(
                layout,
                js,
                status.space,
                status.instance_id,
                lambda verb, record, timeout: _ask(
                    nc, status.space, args.to, verb, record, timeout
                ),
                [(n, rows[n].lifecycle_uid, rows[n].cwd) for n in names_asked],
            )
        # The seats' downtime starts here: the pre-copy ran while they still worked.
        t_fence = time.monotonic()
        if pending is None or pending.state != READY:
            progress(f"cutting {', '.join(names_asked)} here")
            try:
                sealed = await _cut_some(args, root, names_asked, shipped)
            except BaseException:
                # Nothing was sealed on top of the shipped history; a cut left prepared is
                # aborted or rerun, and a rerun carries the whole history.
                await anyio.to_thread.run_sync(precopy.forget, layout, shipped)
                raise
            attempt, attempt_dir = sealed.result.attempt_id, Path(sealed.result.checkpoint_dir)
            increments = {seat.name: seat.bundle_bytes for seat in sealed.result.seats}
        else:
            progress(f"continuing the move of cut {pending.attempt} (journal ready)")
            attempt, attempt_dir = pending.attempt, layout.checkpoints / pending.attempt
        obj, digest, size = await _put(js, status.space, attempt, attempt_dir, layout, to=args.to)
        await _presence_gone(js, status.space, uids)
        progress(f"carried {size} bytes through the broker; the destination adopts them")
        from protocol import move

        offer = move.MoveOffer(
            source=status.instance_id,
            attempt_id=attempt,
            object=obj,
            sha256=digest,
            bytes=size,
            seats=names_asked,
            uids=uids,
            precopy=[base.bundle_sha256 for base in shipped.values()],
        )
        try:
            answer = await _offer_answer(nc, js, status.space, args.to, offer)
        except Refusal as exc:
            if getattr(exc, "claimed", False):
                raise
            if not isinstance(exc, _Refused):
                # No answer: whether the destination claimed the seats cannot be told, so they
                # are not started here (two writers would be worse than a wait).
                raise Refusal(
                    Code.MOVE_INCOMPLETE,
                    f"{exc.message}; the seats are cut here and wait sealed (attempt {attempt})",
                    f"once destination {args.to} runs again, rerun the same `cotal move`: it "
                    "offers the cut again, and a destination that took them says so",
                ) from None
            progress(f"the destination refused ({exc.code}); the seats resume here")
            await _take_back(root, attempt_dir, status.space, record, creds)
            await anyio.to_thread.run_sync(precopy.forget, layout, shipped)
            raise Refusal(
                exc.code,
                f"{exc.message}; the seats run here again, in their own sessions",
                exc.cure,
            ) from None
        finally:
            await _drop(js, status.space, obj)
        downtime = int((time.monotonic() - t_fence) * 1000)
        await anyio.to_thread.run_sync(_forget_here, layout, attempt)
        await anyio.to_thread.run_sync(precopy.forget, layout, shipped)
    result = json.loads(bytes(answer.result)) or {}
    carried = {
        n: {
            "precopyBytes": shipped[n].bundle_bytes if n in shipped else 0,
            **({"bundleBytes": increments[n]} if n in increments else {}),
        }
        for n in names_asked
    }
    return _report(args, attempt, names_asked, uids, result, downtime, t0, carried)


def _report(
    args: argparse.Namespace,
    attempt: str,
    names_asked: list[str],
    uids: list[str],
    result: dict[str, Any],
    downtime: int,
    t0: float,
    carried: dict[str, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """`--json`: per seat its uid, session, generation and downtime, and what carried its
    history: `precopyBytes` shipped before the fence, `bundleBytes` the cut's increment."""
    moved = {s["name"]: s for s in result.get("seats", [])}
    seats = [
        {
            "name": n,
            "lifecycleUid": u,
            "session": (moved.get(n) or {}).get("sessionAfter"),
            "generation": _generation_of(result, n),
            "downtimeMs": downtime,
            **(carried or {}).get(n, {}),
        }
        for n, u in zip(names_asked, uids, strict=True)
    ]
    return {
        "attemptId": attempt,
        "to": args.to,
        "seats": seats,
        "downtimeMs": downtime,
        "totalMs": int((time.monotonic() - t0) * 1000),
    }


@dataclass(frozen=True)
class _Source:
    """This root's manager as the move needs it: its space and instance."""

    space: str
    instance_id: str


def _source_of(layout: Any) -> _Source | None:
    """The source's identity read from its files, for a rerun whose manager is gone."""
    from manager.cli import mesh
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


def _generation_of(result: dict[str, Any], name: str) -> int | None:
    for claim in result.get("claims") or []:
        if isinstance(claim, dict) and name in (claim.get("name"), claim.get("seat")):
            generation = claim.get("generation")
            return generation if isinstance(generation, int) else None
    return None


async def _ps(layout: Any) -> list[Any]:
    from manager.cli import mesh
    from protocol import control

    async with mesh.control(layout) as session:
        return await session.request(control.PS, control.NoArgs())


def _probe(layout: Any, status: Any, seats: list[str], uids: list[str]) -> Any:
    from manager.workspace import identity
    from protocol import move

    signer = identity._load(layout.instance_identity(status.space), status.space).public_key_b64
    return move.MoveProbe(source=status.instance_id, signer=signer, seats=seats, uids=uids)


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


async def _cut_some(
    args: argparse.Namespace, root: Path, seats: list[str], shipped: dict[str, Any]
) -> Any:
    from manager.cli import cut

    cut_args = argparse.Namespace(
        root=str(root),
        json=True,
        session_store=[],
        drain_timeout=args.drain_timeout,
        include=[],
        since=None,
        abort=False,
        seat=seats,
        precopy=shipped,
    )
    sealed = await cut._cut(cut_args, root)
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
    from manager.broker import carry
    from manager.checkpoint.archive import write_archive
    from manager.workspace import identity
    from manager.workspace.journal import Journal
    from protocol import move

    tmp = layout.control / f".move-{attempt}.{secrets.token_hex(4)}.tar"
    try:
        digest, size = await anyio.to_thread.run_sync(write_archive, attempt_dir, tmp)
        blob = await anyio.to_thread.run_sync(tmp.read_bytes)
    finally:
        tmp.unlink(missing_ok=True)
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
    await carry.put(js, space, attempt, blob, meta=meta)
    return attempt, digest, size


def _forget_here(layout: Any, attempt: str) -> None:
    """The destination runs the seats now: what this root kept of them goes, so nothing here can
    start them again or stand in the way of their coming back. Their session files (only under
    this root's `.cotal/sessions`) and pointers, then the sealed attempt and its journal."""
    import shutil

    from manager.cli import checkpoints
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
    from manager.cli import restore

    back = argparse.Namespace(
        root=str(root),
        json=True,
        restore=str(attempt_dir),
        space=space,
        # The broker the mesh runs on, never a new embedded one: the seats' inboxes and
        # custody are there.
        server=None if record.embedded_broker is not None else record.server,
        creds=None if record.embedded_broker is not None or creds is None else str(creds),
        replicas=None,
        monitor=None,
        map=[],
        trust_signer=[],
        accept_stale_checkpoint=False,
        detach=True,
    )
    await restore._restore(back, root)
