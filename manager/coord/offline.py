"""The cut's recovery when its manager died mid-commit: capture offline, from the journaled plan.

The seats died with the manager (parent-death signal) and are proven gone first, so nothing
moves any more: each seat's custody and inbox are read from the broker over one connection,
and its repository and session files are captured and sealed by this process, into a fresh
attempt directory. A cut through a live manager never comes here; this module (and the broker
client, git capture and signing it imports) loads only on this path.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import msgspec

from connectors.base import continuity_class
from manager import registry
from manager.broker import custody, frontier, space
from manager.broker.connection import LazyConnection
from manager.broker.retry import phase
from manager.checkpoint import cut
from manager.checkpoint.reader import read_manifest
from manager.coord import mesh
from manager.coord.cutplan import CutOptions, OfflineCut, OfflineSeat, prove_no_seat_processes
from manager.coord.report import say as progress
from manager.workspace.identity import load_or_create_identity
from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from protocol.checkpoint import SpaceExport
from protocol.errors import Refusal
from protocol.instant import file_stamp
from protocol.inventory import Inventory, encode_inventory
from protocol.refusals import Code


class PartialOfflineCut(OfflineCut, frozen=True):
    """An offline finish of a cut of some seats, which says so as the manager's reply would
    (`partial`, beside `offline`)."""

    partial: bool = True


def _as_cut(result: OfflineCut, partial: bool) -> OfflineCut:
    return PartialOfflineCut(**msgspec.structs.asdict(result)) if partial else result


def _others_recorded(layout: Layout, inventory: Inventory) -> bool:
    """Whether the dead manager's seat table (its records on disk, what the next manager
    re-adopts) holds seats the plan does not: the cut named only some of its seats."""
    planned = {layout.seat_record(a.name, a.identity.lifecycle_uid) for a in inventory.agents}
    try:
        recorded = {p for p in layout.seats.iterdir() if p.suffix == ".json"}
    except FileNotFoundError:
        return False
    return bool(recorded - planned)


async def finish(layout: Layout, journal: Journal, attempt: str, opts: CutOptions) -> OfflineCut:
    """Finish cut `attempt` without its manager: an attempt already sealed is read back, any
    other is captured afresh; a failure keeps what it wrote aside as evidence."""
    inventory = journal.resume_document()
    await anyio.to_thread.run_sync(prove_no_seat_processes, inventory)
    # A cut of some seats: named by this rerun, or evident from the seats the manager kept
    # beside the plan (a rerun may leave `--seat` out).
    partial = bool(opts.seats) or await anyio.to_thread.run_sync(
        _others_recorded, layout, inventory
    )
    sealed = cut.attempt_dir(layout, attempt) / "manifest.json"
    if sealed.exists():
        manifest = await anyio.to_thread.run_sync(read_manifest, sealed.parent)
        read_back = OfflineCut(
            attempt_id=attempt,
            state="preserved",
            checkpoint_dir=str(sealed.parent),
            sealed=True,
            seats=[OfflineSeat(name=s.name) for s in manifest.seats],
            failures=[],
        )
        return _as_cut(read_back, partial)
    try:
        return _as_cut(await _capture(layout, attempt, inventory, opts), partial)
    except (OSError, ValueError, ExceptionGroup) as exc:
        # Nothing sealed: what the try wrote is kept aside and the rerun captures afresh.
        while isinstance(exc, ExceptionGroup):
            exc = exc.exceptions[0]
        if isinstance(exc, Refusal):
            raise exc from None
        path = cut.attempt_dir(layout, attempt)
        evidence = cut.keep_as_evidence(path, "failed") if path.is_dir() else path
        refusal = (
            cut.storage_refusal(exc, "capturing offline")
            if isinstance(exc, OSError)
            else Refusal(Code.CAPTURE_FAILED, f"the offline capture failed: {exc}", "fix the cause")
        )
        raise Refusal(
            refusal.code,
            f"cut {attempt} is incomplete: {refusal.message}",
            f"{refusal.cure}; evidence kept at {evidence}",
        ) from None


async def _broker_reads(layout: Layout, inventory: Inventory) -> dict[str, SpaceExport]:
    """What the offline capture records from the broker, over its one connection: each seat's
    custody and its inbox (the seats are proven gone, so no ack floor moves); an unreachable
    broker refuses."""
    record = mesh.read_mesh(layout)
    if record is None:
        raise Refusal(
            Code.NO_BROKER,
            "the mesh record is gone, so the broker holding custody is unknown",
            "restore .cotal/mesh.json or rerun with the broker reachable",
        )
    creds = Path(record.creds) if record.creds else None
    async with LazyConnection(record.server, creds, name="cotal-cut-offline") as broker:
        js = await broker.jetstream()
        with phase("offline capture (custody)"):
            held = await custody.held_for(js, inventory)
            broker_id = await space.broker_identity(await custody.custody_kv(js, inventory.space))
        with phase("offline capture (inboxes)"):
            return {
                agent.name: await frontier.export_seat_space(
                    js, inventory.space, agent, held[agent.name], broker_id
                )
                for agent in inventory.agents
            }


async def _capture(
    layout: Layout, attempt: str, inventory: Inventory, opts: CutOptions
) -> OfflineCut:
    """The daemon died mid-cut: its seats died with it (parent-death signal) and are proven
    gone, so capture from the recorded plan, after death, into a fresh attempt directory."""
    path = cut.attempt_dir(layout, attempt)
    if path.exists():
        aside = path.with_name(f"{attempt}.partial-{file_stamp()}")
        os.rename(path, aside)
        progress(f"  moved the unsealed attempt directory aside as evidence: {aside}")
    carried = await _broker_reads(layout, inventory)
    attempt_path = cut.prepare_attempt_dir(layout, attempt)
    identity = load_or_create_identity(layout, inventory.space)
    horizon_ms = registry.load_config(layout.root).recency.horizon_s * 1000
    summaries = []
    for agent in inventory.agents:
        connector = registry.load_connector(agent.launch.connector)
        progress(f"  capturing {agent.name} offline")
        summaries.append(
            await cut.capture_seat(
                layout,
                attempt_path,
                agent,
                pointer_path=layout.session_pointer(
                    connector.name, agent.name, agent.identity.lifecycle_uid
                ),
                extra_stores=[Path(s) for s in opts.stores],
                include=opts.include,
                declared=continuity_class(connector.capabilities),
                supports_fresh_start=connector.capabilities.supports_fresh_start,
                identity=identity,
                space=inventory.space,
                horizon_ms=horizon_ms,
                custody_revision=carried[agent.name].custody.revision,
                space_export=carried[agent.name],
                since=opts.since,
            )
        )
    await anyio.to_thread.run_sync(
        cut.seal_attempt,
        attempt_path,
        attempt,
        inventory.space,
        summaries,
        encode_inventory(inventory),
        identity,
    )
    return _sealed_offline(attempt, attempt_path, summaries)


def _sealed_offline(
    attempt: str, attempt_path: Path, summaries: list[cut.SeatSummary]
) -> OfflineCut:
    return OfflineCut(
        attempt_id=attempt,
        state="preserved",
        checkpoint_dir=str(attempt_path),
        sealed=True,
        seats=[
            OfflineSeat(
                name=s.name,
                since=s.since,
                bundle_bytes=s.bundle_bytes,
                continuity=s.continuity,
                session_id=s.session_id,
                lifecycle_uid=s.lifecycle_uid,
                bytes=s.bytes,
                timings_ms=s.timings_ms,
            )
            for s in summaries
        ],
        failures=[],
        timings_ms={},
        offline=True,
    )
