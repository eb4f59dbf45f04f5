"""What the attempt commands print for people: the cut, its abort, the restore, the
verification, the pack, the checkpoint list, a discard and a move.

The coordinators (`manager/coord`) return their results and print nothing; each function here
takes one result and writes it to stdout, or, with `--json`, writes the one JSON document a
machine reads. Progress went to stderr while the coordinator ran.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from connectors.driverkit import INITIAL_PROMPT_ID, LAUNCH_PROMPT_LOST
from manager.coord.admission import LANDING_SHOWN, signer_line
from manager.coord.checkpoints import SEALED_AT_PACK, UNSEALED_AT_PACK
from manager.coord.cut import AlreadySealed, Sealed, given
from manager.coord.records import (
    Aborted,
    CheckpointList,
    Discarded,
    MoveResult,
    PackResult,
    RestoreResult,
    VerifyResult,
)
from protocol import control


def _emit(doc: object) -> None:
    sys.stdout.write(json.dumps(msgspec.to_builtins(doc), sort_keys=True) + "\n")


def cut_sealed(as_json: bool, sealed: Sealed) -> None:
    if as_json:
        _emit(sealed.document())
        return
    out = sys.stdout.write
    result = sealed.result
    out(f"cut {result.attempt_id} sealed; journal ready\n")
    out(f"checkpoint  {result.checkpoint_dir}\n")
    for seat in result.seats:
        t = given(seat.timings_ms, {})
        out(
            f"  {seat.name:<16} {given(seat.continuity, '?'):<10} "
            f"{given(seat.bytes, 0):>10} bytes  repo {t.get('repository', '-')}ms  "
            f"session {t.get('session', '-')}ms  seal {t.get('seal', '-')}ms\n"
        )
        _left_behind(out, seat)
        since = given(seat.since, None)
        if since:
            out(
                f"    incremental since {since}: bundle {given(seat.bundle_bytes, 0)} "
                "bytes (the destination needs that attempt beside this one)\n"
            )
    mid_turn = result.mid_turn if isinstance(result, control.CommitReply) else []
    for mid in mid_turn:
        if mid.message_id == INITIAL_PROMPT_ID:
            out(f"  {mid.name} was cut mid-turn {LAUNCH_PROMPT_LOST}\n")
            continue
        out(
            f"  {mid.name} was cut mid-turn (message {mid.message_id}): "
            "it is redelivered after the resume\n"
        )
    tm = given(result.timings_ms, {})
    out(
        f"phases: stop {tm.get('stop', '-')}ms, capture {tm.get('capture', '-')}ms; "
        f"wall {sealed.wall_ms}ms\n"
    )
    out(f"next: copy {result.checkpoint_dir} to the destination, then `cotal up --restore DIR`\n")


def _left_behind(out: Callable[[str], object], seat: object) -> None:
    """The seat's ignored files the cut does not carry: counted, the largest named, and how to
    carry them (an offline cut surveys nothing)."""
    survey = seat.ignored if isinstance(seat, control.CutSeat) else msgspec.UNSET
    if isinstance(survey, msgspec.UnsetType) or survey.files == 0:
        return
    at_least = "" if survey.complete else "at least "
    largest = ", ".join(
        f"{p.path} {_size(p.bytes)}" + (f" in {p.files} files" if p.files > 1 else "")
        for p in survey.largest
    )
    out(
        f"    not carried: {at_least}{survey.files} ignored file(s), {_size(survey.bytes)} "
        f"(largest: {largest}); `--include PATH` carries them, or accept their absence\n"
    )


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def cut_already(as_json: bool, done: AlreadySealed) -> None:
    if as_json:
        _emit(done.document())
        return
    record = done.record
    sys.stdout.write(
        f"cut {record.attempt_id} is already sealed and ready at {record.checkpoint_dir}\n"
    )


def cut_aborted(as_json: bool, result: Aborted) -> None:
    if as_json:
        _emit(result)
        return
    if not result.aborted:
        sys.stdout.write("no cut to abort: the manager is not fenced and no cut is journaled\n")
        return
    done = []
    if result.fence_lifted:
        done.append("the manager's fence is lifted")
    if result.journal_discarded:
        done.append("its cut-intent journal is discarded")
    sys.stdout.write(
        f"cut {result.attempt_id} aborted: {' and '.join(done)}; every seat keeps running\n"
    )


def restored(as_json: bool, out: RestoreResult) -> None:
    if as_json:
        _emit(out)
        return
    w = sys.stdout.write
    w(
        f"resumed attempt {out.attempt_id}: manager {out.state}, "
        f"journal {out.journal} ({out.wall_ms} ms)\n"
    )
    if out.clock:
        w(f"  clock    {out.clock.detail} ({out.clock.source}; journaled)\n")
    for s in out.seats:
        w(f"  {s.name:<16} {s.continuity:<10} {s.observation}\n")
        w(
            f"    session  {s.session_before} -> {s.session_after}  "
            f"({'same' if s.same_session else 'different'})\n"
        )
        w(
            f"    uid      {s.uid_before} -> {s.uid_after}  "
            f"({'same' if s.same_uid else 'DIFFERENT'})\n"
        )
    # What stood in a tree before the restore is moved, never deleted: say where, once per tree.
    for aside in sorted({r.superseded for r in out.restored if r.superseded}):
        w(f"  kept the tree that stood there before at {aside} (remove it once not needed)\n")
    w("next: cotal send NAME 'what was the phrase?' --wait\n")


def verified(as_json: bool, out: VerifyResult) -> None:
    if as_json:
        # The directory is the operator's own argument; the document says what was found there.
        doc = msgspec.to_builtins(out)
        doc.pop("src")
        _emit(doc)
        return
    w = sys.stdout.write
    w(f"checkpoint {out.src}: admitted (attempt {out.attempt_id}, space {out.space})\n")
    for gate, verdict in msgspec.structs.asdict(out.gates).items():
        w(f"  {gate:<10} {verdict}\n")
    w(f"  signer     {signer_line(out.signer)}\n")
    if out.clock:
        w(f"  clock      {out.clock.detail} ({out.clock.source})\n")
    for s in out.seats:
        w(
            f"  seat {s.name:<16} {s.continuity:<10} uid {s.lifecycle_uid} "
            f"captured {s.captured_at}\n"
        )
        if s.chain:
            w(
                "    incremental on "
                + " <- ".join(link.attempt_id for link in reversed(s.chain))
                + f" (found at {s.chain[-1].dir})\n"
            )
        if s.relocated:
            w(f"    relocated {s.relocated.cwd_before} -> {s.relocated.cwd_after}\n")
        if s.relocation_note:
            w(f"    {s.relocation_note}\n")
        if s.map_landing:
            w(f"    mapped tree: {LANDING_SHOWN[s.map_landing]}\n")


def packed(as_json: bool, out: PackResult) -> None:
    if as_json:
        _emit(out)
        return
    w = sys.stdout.write
    w(f"{out.sha256}  {out.file}\n")
    w(f"packed attempt {out.attempt_id}: {out.bytes} bytes, seats {', '.join(out.seats)}\n")
    sealed_to = out.sealed_to
    w((UNSEALED_AT_PACK if sealed_to is None else SEALED_AT_PACK.format(key=sealed_to)) + "\n")
    w(
        f"handed off at {out.hand_off.packed_at} (recorded at {out.broker}); this root "
        "will not resume these seats from it\n"
    )
    w(f"next, on the destination: cotal up --restore {Path(out.file).name}\n")


def listed(as_json: bool, doc: CheckpointList) -> None:
    if as_json:
        _emit(doc)
        return
    w = sys.stdout.write
    if doc.journal_error:
        w(f"journal unreadable: {doc.journal_error}\n")
    if not doc.checkpoints:
        w(f"no checkpoints in {doc.root}\n")
        return
    for c in doc.checkpoints:
        flags = []
        if c.journal_state:
            flags.append(f"journal {c.journal_state}")
        if c.handed_off and not c.handed_off.taken_back_at:
            flags.append(f"handed off {c.handed_off.packed_at}")
        elif c.handed_off:
            flags.append(f"taken back {c.handed_off.taken_back_at}")
        w(
            f"{c.name:<44} {c.state:<8} {c.bytes:>12} B  {c.created_at}  "
            f"seats {','.join(c.seats) or '-'}"
            + (f"  ({'; '.join(flags)})" if flags else "")
            + "\n"
        )


def discarded(as_json: bool, out: Discarded) -> None:
    if as_json:
        _emit(out)
        return
    if out.removed:
        sys.stdout.write(f"removed {out.removed}\n")
    if out.journal_discarded:
        sys.stdout.write(
            f"discarded the maintenance journal (it was {out.journal_discarded} for attempt "
            f"{out.attempt_id}); its seats will not be resumed here\n"
        )


def moved(as_json: bool, out: MoveResult) -> None:
    if as_json:
        _emit(out)
        return
    for seat in out.seats:
        sys.stdout.write(
            f"moved {seat.name} to {out.to}: uid {seat.lifecycle_uid}, session "
            f"{seat.session}, generation {seat.generation}\n"
        )
    if out.destination_clock:
        clock = out.destination_clock
        sys.stdout.write(f"destination clock: {clock.detail} ({clock.source})\n")
    sys.stdout.write(f"downtime {out.downtime_ms} ms, total {out.total_ms} ms\n")
