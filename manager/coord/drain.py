"""`cotal drain [--to INSTANCE | --fleet] [--max-parallel N] [--deadline S]`: empty this host.

Every seat of this root's manager is moved (`manager.coord.move`, the same probe, pre-copy, cut
and offer as `cotal move`) to the named manager, or with `--fleet` to the live manager of the
same broker with the most free seats (`protocol.names.MAX_SEATS` less what it holds, as `ps
--fleet` reads it), in waves of at most N seats. A manager holds one cut at a time, so a wave is
one move of its seats: each at a turn boundary, and a wave's move answers only once each of its
seats runs at the destination (the health check: its adoption there proved the process up in
its own session) before the next wave begins.

A wave the destination refuses at its probe left every seat running here, untouched; its seats
are then tried one at a time, so the seat that cannot move is named with why and the rest go
on. A move that fails past its fence is the move's own to finish (`cotal move` reruns it), and
ends the drain with that said. At the deadline the seats still here are moved mid-turn: their
cut's drain waits `AFTER_DEADLINE_S`, and the result says so.

While it runs the drain keeps a marker, `.cotal/drain.json` (its pid, when it began, whether it
was cancelled): the manager refuses new spawns while a live process holds it, and `cotal drain
--cancel` marks it cancelled, which the drain reads before each wave. A marker whose process is
gone is stale: a new drain replaces it, and `--cancel` removes it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from manager.coord import move
from manager.coord.report import say as progress
from manager.coord.requests import MoveRequest
from manager.procs import pid_identity
from manager.workspace.drainmark import DrainMarker, marker_path, read_marker
from manager.workspace.layout import Layout
from manager.workspace.private import write_private_atomic
from protocol.codec import encode_json
from protocol.errors import Refusal
from protocol.instant import now_iso
from protocol.names import MAX_SEATS
from protocol.refusals import Code

# A seat still here at the deadline: its cut waits this long for its turn, then stops it.
AFTER_DEADLINE_S = 1.0


class DrainRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    to: str | None
    fleet: bool
    max_parallel: int = 4
    deadline_s: float | None = None
    drain_timeout: float = 120.0


class DrainedSeat(msgspec.Struct, rename="camel", frozen=True):
    name: str
    to: str
    downtime_ms: int
    # Moved after the deadline: its cut did not wait for its turn to end.
    mid_turn: bool


class NotMoved(msgspec.Struct, rename="camel", frozen=True):
    name: str
    code: str
    message: str
    cure: str


class DrainResult(msgspec.Struct, rename="camel", frozen=True):
    moved: list[DrainedSeat]
    refused: list[NotMoved]
    left: list[str]
    cancelled: bool
    waves: int


async def drain(req: DrainRequest, root: Path) -> DrainResult:
    layout = Layout.at(root)
    if (req.to is None) == (not req.fleet):
        raise Refusal(
            Code.BAD_ARGS,
            "a drain needs exactly one destination: --to INSTANCE or --fleet",
            "name the manager to move every seat to (`cotal ps --fleet` lists them), or pass "
            "--fleet to spread them over the live managers of this broker",
        )
    if not 1 <= req.max_parallel <= MAX_SEATS:
        raise Refusal(
            Code.BAD_ARGS,
            f"--max-parallel {req.max_parallel} is not from 1 to {MAX_SEATS}",
            "pass how many seats each wave moves at once",
        )
    running = read_marker(layout)
    if running is not None:
        raise Refusal(
            Code.BAD_ARGS,
            f"a drain of {root} already runs (pid {running.process.pid}, since "
            f"{running.started_at})",
            "wait for it, or stop it with `cotal drain --cancel`",
        )
    write_private_atomic(
        marker_path(layout),
        encode_json(DrainMarker(process=pid_identity(os.getpid()), started_at=now_iso())),
    )
    try:
        return await _waves(req, root, layout)
    finally:
        marker_path(layout).unlink(missing_ok=True)


async def _waves(req: DrainRequest, root: Path, layout: Layout) -> DrainResult:
    t0 = time.monotonic()
    queue: list[list[str]] = []
    names = [row.name for row in await move.seats_here(layout)]
    for i in range(0, len(names), req.max_parallel):
        queue.append(names[i : i + req.max_parallel])
    moved: list[DrainedSeat] = []
    refused: list[NotMoved] = []
    waves = 0
    progress(f"draining {len(names)} seat(s), {req.max_parallel} at a time")
    while queue:
        marker = read_marker(layout)
        if marker is not None and marker.cancelled:
            left = [n for wave in queue for n in wave]
            progress(f"drain cancelled; {len(left)} seat(s) stay here: {', '.join(left)}")
            return DrainResult(moved, refused, left, True, waves)
        wave = queue.pop(0)
        late = req.deadline_s is not None and time.monotonic() - t0 >= req.deadline_s
        to = req.to or await _emptiest(layout)
        waves += 1
        progress(
            f"wave {waves}: {', '.join(wave)} -> {to}"
            + (" (past the deadline: moved mid-turn)" if late else "")
        )
        timeout = AFTER_DEADLINE_S if late else req.drain_timeout
        try:
            asked = MoveRequest(names=tuple(wave), to=to, drain_timeout=timeout)
            result = await move.move(asked, root)
        except Refusal as exc:
            if not await _untouched(layout, wave):
                raise
            if len(wave) > 1:
                # One of them cannot go: each alone, so the refusal names it.
                queue[:0] = [[name] for name in wave]
                continue
            progress(f"{wave[0]} stays here: {exc.code}: {exc.message}")
            refused.append(NotMoved(wave[0], str(exc.code), exc.message, exc.cure))
            continue
        moved.extend(
            DrainedSeat(seat.name, result.to, seat.downtime_ms, late) for seat in result.seats
        )
    return DrainResult(moved, refused, [], False, waves)


async def _untouched(layout: Layout, wave: list[str]) -> bool:
    """Whether a refused move left these seats as they were: each still runs here and no cut
    of them is journaled (the probe refuses before anything is fenced)."""
    if layout.journal.exists():
        return False
    rows = {row.name: row for row in await move.seats_here(layout)}
    return all(name in rows and rows[name].state == "running" for name in wave)


async def _emptiest(layout: Layout) -> str:
    """The live manager of this broker, other than this root's, with the most free seats."""
    held = await move.fleet_load(layout)
    if not held:
        raise Refusal(
            Code.BAD_ARGS,
            "no other live manager on this broker to drain to",
            "start a manager on another host with `cotal up --server ...`, or pass --to",
        )
    free = {instance: MAX_SEATS - count for instance, count in held.items()}
    best = max(sorted(free), key=lambda instance: free[instance])
    if free[best] <= 0:
        raise Refusal(
            Code.CAPACITY,
            f"every other manager on this broker holds {MAX_SEATS} seats",
            "start another manager, or free seats on one, then drain again",
        )
    return best
