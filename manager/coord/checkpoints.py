"""`cotal checkpoint pack|list|discard`, and the packed file a resume accepts.

Packing is a hand-off, not a copy: the source's broker records `handoff.<attempt>` beside the
custody records before the packed file exists under its name, and this root refuses to resume
those seats from that attempt until the operator takes them back. The custody records are left
exactly as the cut wrote them, because a destination that shares this broker claims them by
compare-and-set against the revisions the checkpoint recorded.

A packed file is one ustar archive of the attempt directory (its format, both ways, is
`manager.checkpoint.archive`), sealed to one destination root's box key with `--to KEY`
(`manager.checkpoint.sealed`: only that root opens it). The destination unpacks it into
`.cotal/maintenance/v1/incoming/<attempt>/`, then resumes from that directory exactly as from a
carried one: the integrity gate is the same.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from connectors.privatefs import ensure_private_dir, fsync_dir, read_stable, write_private_atomic
from manager.broker import custody, embedded
from manager.broker.connection import LazyConnection
from manager.broker.space import read_broker_identity
from manager.checkpoint import admit, chain
from manager.checkpoint.archive import unpack, write_archive
from manager.checkpoint.reader import read_manifest
from manager.coord import mesh
from manager.coord.admission import admit_integrity, trusted_keys
from manager.coord.records import (
    CheckpointEntry,
    CheckpointList,
    Discarded,
    HandedOff,
    PackResult,
)
from manager.coord.report import say as _say
from manager.coord.requests import PackRequest, RestoreRequest
from manager.procs import alive
from manager.workspace import boxkey, identity
from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from manager.workspace.lock import MaintenanceLock
from protocol.checkpoint import MANIFEST_FILE
from protocol.custody import HandedOffSeat, HandOffRecord, decode_handoff, encode_handoff
from protocol.errors import DecodeError, Refusal
from protocol.instant import format_instant, now_iso
from protocol.maintenance import (
    NEEDS_CHECKPOINT,
    READY,
    RESUME_UNDER_WAY,
    UNDER_WAY,
    JournalRecord,
    rerun,
)
from protocol.names import ATTEMPT_ID
from protocol.refusals import Code

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

UNSEALED_AT_PACK = (
    "not sealed: any host that trusts this root's signer can resume it (seal it to one root "
    "with --to KEY, the box key its `cotal status` prints)"
)
SEALED_AT_PACK = (
    "sealed to box key {key}: only the root whose `cotal status` prints it can resume it"
)
NO_FENCE_AT_PACK = (
    "cotal: warning: no fence spans brokers that cannot see each other: resume this packed "
    "checkpoint in one place only; two destinations that do not share a broker could both start "
    "these seats"
)
TAKE_BACK_RISK = (
    "only if the packed copy was destroyed or never resumed elsewhere; otherwise two hosts will "
    "run the same seat"
)


def checkpoints_dir(layout: Layout) -> Path:
    # Kept for bench/goals.py, which imports it; the path itself is the layout's.
    return layout.checkpoints


def _attempt_of(name: str) -> str:
    """`<attempt>` of a directory name, including one a failed cut moved aside as evidence."""
    return name.split(".partial-", 1)[0]


# -- the local hand-off marker ------------------------------------------------------------------


def read_local_handoff(layout: Layout, attempt_id: str) -> HandOffRecord | None:
    """This root's own note of a hand-off: what `cotal status` and `list` read without a broker.
    The broker's record is the authority; this copy only reports it."""
    path = layout.handoffs / f"{attempt_id}.json"
    try:
        data = read_stable(path, cap=64 * 1024, what="hand-off note").data
    except Refusal as exc:
        if exc.code == Code.MISSING:
            return None
        raise
    try:
        return decode_handoff(data)
    except DecodeError as exc:
        raise Refusal(
            Code.HANDOFF_MALFORMED,
            exc.message,
            f"inspect {path}; the broker's record handoff.{attempt_id} is the authority",
        ) from None


def _write_local_handoff(layout: Layout, record: HandOffRecord) -> None:
    ensure_private_dir(layout.handoffs)
    write_private_atomic(layout.handoffs / f"{record.attempt_id}.json", encode_handoff(record))


def standing_handoffs(layout: Layout) -> list[HandOffRecord]:
    """Hand-offs this root recorded and did not take back, for `cotal status`."""
    directory = layout.handoffs
    if not directory.is_dir():
        return []
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            record = read_local_handoff(layout, path.stem)
        except Refusal:
            continue
        if record is not None and record.taken_back_at is None:
            out.append(record)
    return out


# -- the broker a pack records the hand-off in ---------------------------------------------------


@dataclass
class _Broker:
    server: str
    creds: Path | None
    started: embedded.BrokerInfo | None


async def _source_broker(req: PackRequest, layout: Layout) -> _Broker:
    """`--server`, else the broker this root's mesh record names; an embedded one stopped by the
    cut is started from this root's store for as long as the pack needs it."""
    if req.server:
        return _Broker(req.server, Path(req.creds).resolve() if req.creds else None, None)
    record = mesh.read_mesh(layout)
    if record is not None and record.embedded_broker is None:
        return _Broker(record.server, Path(record.creds) if record.creds else None, None)
    if record is not None and record.embedded_broker is not None:
        ref = record.embedded_broker
        if record.broker_store == str(layout.nats_store) and alive(ref):
            return _Broker(record.server, layout.broker_creds, None)
    if not layout.nats_store.is_dir() or not layout.broker_creds.exists():
        raise Refusal(
            Code.BROKER_UNAVAILABLE,
            f"no broker is recorded for {layout.root} and its embedded broker store "
            f"{layout.nats_store} (or its credential) is not there",
            "pass --server URL --creds FILE for the broker that holds these seats' custody; "
            "nothing was packed",
        )
    _say("starting this root's embedded broker to record the hand-off")
    info = await mesh.start_root_broker(layout)
    return _Broker(info.url, layout.broker_creds, info)


async def _stop(broker: _Broker) -> None:
    if broker.started is not None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(embedded.stop_embedded, broker.started.identity)


# -- pack ---------------------------------------------------------------------------------------


def _own_instance(layout: Layout, space: str) -> str | None:
    path = layout.instance_identity(space)
    if not path.exists():
        return None
    return identity._load(path, space).instance_id


async def pack(req: PackRequest, root: Path) -> PackResult:
    layout = Layout.at(root)
    to = boxkey.recipient_key(req.to) if req.to else None
    src = Path(req.dir).resolve()
    out = Path(req.output).resolve()
    _check_output(out)
    adm = await admit_integrity(src, trusted_keys(layout, req.space, ()), chain.search_dirs(layout))
    attempt = adm.manifest.attempt_id
    _check_packable(layout, adm)
    with MaintenanceLock(layout, attempt):
        _check_journal_ready(layout, attempt)
        broker = await _source_broker(req, layout)
        try:
            async with LazyConnection(broker.server, broker.creds, name="cotal-pack") as conn:
                try:
                    js = await conn.jetstream()
                except Refusal as exc:
                    raise Refusal(
                        Code.BROKER_UNAVAILABLE,
                        f"the hand-off must be recorded at the source's broker: {exc.message}",
                        "start that broker, or pass --server URL --creds FILE for it; nothing "
                        "was packed",
                    ) from None
                await _check_custody_unmoved(js, adm)
                digest, size, standing = await _write_and_hand_off(layout, js, adm, src, out, to)
        finally:
            await _stop(broker)
    if to is None:
        # Sealed to one root, the file has one possible destination; unsealed, it has as many
        # as there are roots trusting this signer, and no broker sees them all.
        _say(NO_FENCE_AT_PACK)
    return PackResult(
        attempt_id=attempt,
        file=str(out),
        sha256=digest,
        bytes=size,
        seats=sorted(adm.records),
        hand_off=standing,
        broker=broker.server,
        sealed_to=None if to is None else boxkey.printable(to),
    )


def _check_output(out: Path) -> None:
    if out.exists() or out.is_symlink():
        raise Refusal(
            Code.OUTPUT_EXISTS,
            f"{out} already exists; a packed checkpoint is never overwritten",
            "name a new file with -o, or move the old one away first",
        )
    if not out.parent.is_dir():
        raise Refusal(
            Code.OUTPUT_DIR_MISSING,
            f"{out.parent} is not a directory",
            "create it first, or name a file in an existing directory",
        )


def _check_packable(layout: Layout, adm: admit.Admission) -> None:
    """A packed file is resumed on its own, and only the root that cut it can hand it off."""
    attempt, space = adm.manifest.attempt_id, adm.manifest.space
    incremental = sorted(name for name, links in adm.chains.items() if links)
    if incremental:
        # The predecessors its bundles build on are not in it, so the hand-off would carry a
        # checkpoint no destination can restore by itself.
        since = adm.records[incremental[0]].repository.since
        base = (
            f"attempt {since.attempt_id}" if since is not None else "the history a move pre-copied"
        )
        raise Refusal(
            Code.INCREMENTAL_PACK,
            f"attempt {attempt} is incremental: the bundles of {', '.join(incremental)} carry "
            f"only what is new since {base}, which a packed file does not hold",
            "copy the attempt directory and its predecessors side by side to the destination "
            "instead (`cotal up --restore DIR` finds them there), or cut again without --since "
            "and pack that",
        )
    sealed_by = adm.manifest.signer
    assert sealed_by is not None
    mine = _own_instance(layout, space)
    if mine != sealed_by.instance_id:
        raise Refusal(
            Code.NOT_THE_SOURCE,
            f"attempt {attempt} was sealed by instance {sealed_by.instance_id}, not by this "
            f"root's ({mine or 'none in space ' + space})",
            "pack on the root that cut the checkpoint: only its broker can record the hand-off",
        )


async def _write_and_hand_off(
    layout: Layout,
    js: Any,
    adm: admit.Admission,
    src: Path,
    out: Path,
    to: X25519PublicKey | None,
) -> tuple[str, int, HandOffRecord]:
    """The archive written beside `out`, the hand-off recorded at the broker and here, and only
    then the archive renamed into place: a file at `out` is always a handed-off one."""
    sealed_by = adm.manifest.signer
    assert sealed_by is not None
    tmp = out.with_name(f".{out.name}.{secrets.token_hex(4)}.tmp")
    try:
        digest, size = await anyio.to_thread.run_sync(
            functools.partial(write_archive, src, tmp, to=to)
        )
        record = HandOffRecord(
            attempt_id=adm.manifest.attempt_id,
            source_instance=sealed_by.instance_id,
            source_root=str(layout.root),
            packed_at=now_iso(),
            sha256=digest,
            seats=[
                HandedOffSeat(name=name, lifecycle_uid=r.lifecycle_uid, generation=r.generation)
                for name, r in adm.records.items()
            ],
        )
        kv = await custody.custody_kv(js, adm.manifest.space)
        standing = await custody.record_handoff(kv, record)
        _write_local_handoff(layout, standing)
        os.rename(tmp, out)
        fsync_dir(out.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return digest, size, standing


def _check_journal_ready(layout: Layout, attempt: str) -> None:
    """The seats must be stopped at exactly this checkpoint: a sealed cut not restored here."""
    record = Journal(layout).load()
    if record is None or record.attempt_id != attempt or record.state != READY:
        state = (
            "no journal"
            if record is None
            else f"the journal is at {record.state} for attempt {record.attempt_id}"
        )
        raise Refusal(
            Code.NOT_PACKABLE,
            f"attempt {attempt} is not a sealed cut waiting in this root ({state}); its seats may "
            "run here or elsewhere",
            "pack the attempt `cotal status` shows waiting, right after `cotal down "
            "--preserve-state`",
        )


async def _check_custody_unmoved(js: Any, adm: admit.Admission) -> None:
    space = adm.manifest.space
    carried = {r.space_state.broker_id for r in adm.records.values() if r.space_state}
    here = await read_broker_identity(js, space)
    if carried and carried != {here}:
        raise Refusal(
            Code.WRONG_BROKER,
            f"attempt {adm.manifest.attempt_id} was cut at broker {sorted(carried)}, this is "
            f"broker {here}",
            "pass --server URL --creds FILE for the broker the cut used",
        )
    kv = await custody.custody_kv(js, space)
    for name, r in adm.records.items():
        held = await custody.read(kv, name, r.lifecycle_uid)
        if held is None or held.revision != r.custody_revision:
            who = (
                f"instance {held.record.holder} at generation {held.record.generation}"
                if held
                else "nobody"
            )
            raise Refusal(
                Code.CUSTODY_LOST,
                f"seat {name}: custody moved since attempt {adm.manifest.attempt_id} was cut; it "
                f"is held by {who}",
                "the seat was resumed from this checkpoint already; do not carry it again",
            )


# -- resume from a packed file (the destination) ------------------------------------------------


@contextlib.asynccontextmanager
async def packed_source(source: str, root: Path) -> AsyncIterator[str]:
    """`--restore FILE`: the resume runs from the unpacked staging directory. A refusal before
    the resume journaled anything removes what this unpacking wrote (all of `.cotal` when the
    root had none); a resume that got further keeps it, as the evidence its rerun needs. The
    unpacking and the clean-up run beside the event loop: in a daemon that restores a move's
    checkpoint, its other seats' deliveries must not wait on a tar of the whole attempt."""
    src = Path(source)
    if not src.is_file():
        yield source
        return
    layout = Layout.at(root)
    fresh = not layout.control.exists()
    try:
        staged = await anyio.to_thread.run_sync(unpack, src.resolve(), layout)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_clean, layout, None, fresh)
        raise
    _say(f"unpacked {src} into {staged}")
    try:
        yield str(staged)
    except BaseException:
        with anyio.CancelScope(shield=True):
            if not _resume_under_way(layout, staged.name):
                await anyio.to_thread.run_sync(_clean, layout, staged, fresh)
        raise
    await anyio.to_thread.run_sync(functools.partial(shutil.rmtree, staged, ignore_errors=True))


def _resume_under_way(layout: Layout, attempt: str) -> bool:
    """The unpacked copy is a rerun's evidence only while a resume of it is under way; a
    refusal at a root whose journal holds that attempt retired (a second restore of a file
    already resumed here) must not leave a copy behind."""
    try:
        record = Journal(layout).load()
    except Refusal:
        return False
    return record is not None and record.attempt_id == attempt and record.state in RESUME_UNDER_WAY


def _clean(layout: Layout, staged: Path | None, fresh: bool) -> None:
    if fresh and not layout.journal.exists():
        shutil.rmtree(layout.control, ignore_errors=True)
        return
    if staged is not None:
        shutil.rmtree(staged, ignore_errors=True)


# -- the source root's check at resume ----------------------------------------------------------


async def check_handed_off(
    req: RestoreRequest, layout: Layout, adm: admit.Admission, conn: LazyConnection
) -> None:
    """Refuse `handed-off` when this root packed this attempt to carry it away, unless the
    operator takes it back (`--take-back`). Only the source root is refused: a destination that
    shares this broker is another instance and resumes the packed copy as usual."""
    attempt = adm.manifest.attempt_id
    mine = _own_instance(layout, adm.manifest.space)
    local = read_local_handoff(layout, attempt)
    if mine is None and local is None:
        return
    js = await conn.jetstream()
    kv = await custody.custody_kv(js, adm.manifest.space)
    found = await custody.read_handoff(kv, attempt)
    at_broker = found[0] if found is not None and found[0].source_instance == mine else None
    standing = [r for r in (at_broker, local) if r is not None and r.taken_back_at is None]
    if not standing:
        if req.take_back:
            _say(f"cotal: note: attempt {attempt} was not handed off; nothing to take back")
        return
    record = standing[0]
    if not req.take_back:
        raise Refusal(
            Code.HANDED_OFF,
            f"attempt {attempt} was packed and handed off at {record.packed_at} (sha256 "
            f"{record.sha256}); its seats belong to whichever host resumes the packed copy",
            "do not resume them here; if the packed copy was destroyed or never resumed "
            f"elsewhere, take them back: cotal up --restore {req.restore} --take-back",
        )
    when = now_iso()
    _say(
        f"cotal: warning: taking back attempt {attempt} handed off at {record.packed_at}: "
        + TAKE_BACK_RISK
    )
    if at_broker is not None:
        await custody.take_back(kv, attempt, at=when)
    if local is not None:
        _write_local_handoff(layout, msgspec.structs.replace(local, taken_back_at=when))


# -- list and discard ---------------------------------------------------------------------------


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(Path(dirpath) / name).st_size
    return total


def _load_journal(layout: Layout) -> tuple[JournalRecord | None, str | None]:
    try:
        return Journal(layout).load(), None
    except Refusal as exc:
        return None, exc.text


def _entry(layout: Layout, path: Path, journal: JournalRecord | None) -> CheckpointEntry:
    attempt = _attempt_of(path.name)
    aside = path.name != attempt
    seats: list[str]
    created: str
    detail = None
    try:
        manifest = None if aside else read_manifest(path)
    except (Refusal, DecodeError) as exc:
        manifest = None
        detail = str(exc)
    if manifest is not None:
        state = "sealed"
        seats = sorted(s.name for s in manifest.seats)
        created = manifest.created_at
    else:
        seats = sorted(p.name for p in path.iterdir() if p.is_dir()) if path.is_dir() else []
        created = format_instant(datetime.fromtimestamp(path.stat().st_mtime, UTC))
        under_way = (
            not aside
            and journal is not None
            and journal.attempt_id == attempt
            and journal.state in UNDER_WAY
        )
        if under_way:
            state = "partial"
        else:
            state = "failed"
            if detail is None:
                detail = (
                    "moved aside as the evidence of a cut that failed"
                    if aside
                    else f"no {MANIFEST_FILE}: a cut that never sealed"
                )
    journal_state = (
        journal.state
        if journal is not None and journal.attempt_id == attempt and not aside
        else None
    )
    handoff = read_local_handoff(layout, attempt) if not aside else None
    return CheckpointEntry(
        name=path.name,
        attempt_id=attempt,
        path=str(path),
        state=state,
        detail=detail,
        seats=seats,
        bytes=_size(path),
        created_at=created,
        handed_off=None
        if handoff is None
        else HandedOff(
            packed_at=handoff.packed_at,
            sha256=handoff.sha256,
            taken_back_at=handoff.taken_back_at,
        ),
        journal_state=journal_state,
        journal_needs_it=journal_state in NEEDS_CHECKPOINT,
    )


def gather(root: Path) -> CheckpointList:
    layout = Layout.at(root)
    journal, error = _load_journal(layout)
    directory = layout.checkpoints
    paths = (
        sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
        if directory.is_dir()
        else []
    )
    return CheckpointList(
        root=str(layout.root),
        journal_error=error,
        checkpoints=[_entry(layout, p, journal) for p in paths],
    )


def discard(root: Path, name: str) -> Discarded:
    layout = Layout.at(root)
    attempt = _attempt_of(name)
    if not ATTEMPT_ID.matches(attempt) or "/" in name or name.startswith("."):
        raise Refusal(
            Code.NO_SUCH_CHECKPOINT,
            f"{name!r} is not an attempt name",
            "name one that `cotal checkpoint list` shows",
        )
    path = layout.checkpoints / name
    with MaintenanceLock(layout, attempt):
        journal = Journal(layout).load()
        mine = journal is not None and journal.attempt_id == attempt and name == attempt
        if not path.is_dir() and not mine:
            raise Refusal(
                Code.NO_SUCH_CHECKPOINT,
                f"no checkpoint {name} under {layout.checkpoints}, and the journal does not "
                "name it",
                "name one that `cotal checkpoint list` shows",
            )
        state = journal.state if mine and journal is not None else None
        action = rerun(state, "discard")
        if state is not None and action.kind == "refuse":
            raise action.refusal(attempt=attempt, state=state)
        removed = None
        if path.is_dir():
            # Renamed first, so a crash part-way leaves a name `list` reports as failed evidence
            # rather than a half-deleted attempt that looks sealed.
            doomed = path.with_name(f".discarding-{name}-{secrets.token_hex(4)}")
            os.rename(path, doomed)
            fsync_dir(path.parent)
            shutil.rmtree(doomed)
            removed = str(path)
        journal_discarded = None
        if mine and journal is not None and action.drops:
            # A sealed cut not restored, a retired resume or a degraded attempt: with its
            # checkpoint gone the journal would only point at nothing.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(layout.journal)
            fsync_dir(layout.maintenance)
            journal_discarded = journal.state
    return Discarded(attempt_id=attempt, removed=removed, journal_discarded=journal_discarded)
