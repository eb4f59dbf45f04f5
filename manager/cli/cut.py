"""`cotal down --preserve-state`: the coordinator of the cut.

lock -> prepare -> journal `cut-intent` -> commit -> journal `cut-committed` -> stop the daemon and
the embedded broker -> prove quiescence -> journal `ready`. Re-running after a failure continues
from what the journal says: through the daemon when it still answers, or offline when it died,
once no process carrying any seat's lifecycle uid is alive. `ready` is never written unless every
seat was proven stopped and sealed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from manager import registry
from manager.broker import embedded
from manager.checkpoint import cut
from manager.checkpoint.reader import read_manifest
from manager.cli import mesh
from manager.procs import alive, processes_with_env, prove_gone
from manager.workspace.identity import load_or_create_identity
from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from manager.workspace.lock import MaintenanceLock
from protocol import names
from protocol.codec import convert
from protocol.errors import Refusal
from protocol.inventory import Inventory, encode_inventory
from protocol.maintenance import ResumeDescriptor

COMMIT_TIMEOUT_S = 600.0


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except OSError:
        return b""


_SHOWN = {"capture.progress", "cut.stopped", "cut.sealed", "cut.capture_failed"}


class _ProgressTail:
    """Shows the daemon's capture progress while the commit call is in flight."""

    def __init__(self, log_path: Path) -> None:
        self.path = log_path
        self.offset = log_path.stat().st_size if log_path.exists() else 0

    def drain(self) -> None:
        chunk = _read_from(self.path, self.offset)
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") in _SHOWN:
                facts = " ".join(
                    f"{k}={v}"
                    for k, v in sorted(event.items())
                    if k not in ("event", "level", "timestamp")
                )
                _say(f"  {event['event']}: {facts}")

    async def follow(self) -> None:
        while True:
            self.drain()
            await anyio.sleep(0.25)


async def _commit_with_progress(layout: Layout, attempt: str, stores: list[str]) -> dict[str, Any]:
    tail = _ProgressTail(layout.manager_log)
    async with anyio.create_task_group() as tg:
        tg.start_soon(tail.follow)
        result: dict[str, Any] = await mesh.call(
            layout.root,
            "commit-preservation",
            {"attemptId": attempt, "sessionStores": stores},
            COMMIT_TIMEOUT_S,
        )
        tg.cancel_scope.cancel()
    # What the daemon logged after the last poll is shown too.
    tail.drain()
    return result


def _call(layout: Layout, op: str, args: dict[str, Any], timeout: float = 60.0) -> Any:
    return anyio.run(mesh.call, layout.root, op, args, timeout, backend="asyncio")


def _prove_no_seat_processes(inventory: Inventory) -> None:
    for agent in inventory.agents:
        survivors = processes_with_env("COTAL_LIFECYCLE_UID", agent.identity.lifecycle_uid)
        if survivors:
            raise Refusal(
                "stop-unproven",
                f"seat {agent.name} (uid {agent.identity.lifecycle_uid}) still has live processes {survivors}",
                f"kill {' '.join(map(str, survivors))}, then rerun `cotal down --preserve-state`",
            )


async def _custody_revisions(layout: Layout, inventory: Inventory) -> dict[str, int]:
    """The custody revisions the offline capture records; an unreachable broker refuses."""
    from manager.broker import custody
    from manager.broker.connection import connect
    from manager.broker.footprint import ensure_kv

    record = mesh.read_mesh(layout)
    if record is None:
        raise Refusal(
            "no-broker",
            "the mesh record is gone, so the broker holding custody is unknown",
            "restore .cotal/mesh.json or rerun with the broker reachable",
        )
    nc = await connect(
        record.server, Path(record.creds) if record.creds else None, name="cotal-cut-offline"
    )
    try:
        kv = await ensure_kv(nc.jetstream(), names.custody_bucket(inventory.space), ttl=None)
        out: dict[str, int] = {}
        for agent in inventory.agents:
            held = await custody.read(kv, agent.name, agent.identity.lifecycle_uid)
            if held is None or held.record.generation != agent.generation:
                raise Refusal(
                    "custody-lost",
                    f"seat {agent.name}: custody at the broker no longer matches the plan",
                    "another root may hold this seat now; do not capture it here",
                )
            out[agent.name] = held.revision
        return out
    finally:
        await nc.close()


async def _capture_offline(
    layout: Layout, attempt: str, inventory: Inventory, stores: list[str]
) -> dict[str, Any]:
    """The daemon died mid-cut: its seats died with it (parent-death signal) and are proven
    gone, so capture from the recorded plan, after death, into a fresh attempt directory."""
    path = cut.attempt_dir(layout, attempt)
    if path.exists():
        aside = path.with_name(
            f"{attempt}.partial-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        )
        os.rename(path, aside)
        _say(f"  moved the unsealed attempt directory aside as evidence: {aside}")
    revisions = await _custody_revisions(layout, inventory)
    attempt_path = cut.prepare_attempt_dir(layout, attempt)
    identity = load_or_create_identity(layout, inventory.space)
    summaries = []
    for agent in inventory.agents:
        connector = registry.load_connector(agent.launch.connector)
        from connectors.base import continuity_class

        _say(f"  capturing {agent.name} offline")
        summaries.append(
            await cut.capture_seat(
                layout,
                attempt_path,
                agent,
                pointer_path=layout.session_pointer(
                    connector.name, agent.name, agent.identity.lifecycle_uid
                ),
                extra_stores=[Path(s) for s in stores],
                declared=continuity_class(connector.capabilities),
                supports_fresh_start=connector.capabilities.supports_fresh_start,
                identity=identity,
                space=inventory.space,
                custody_revision=revisions[agent.name],
            )
        )
    cut.seal_attempt(
        attempt_path, attempt, inventory.space, summaries, encode_inventory(inventory), identity
    )
    return {
        "attemptId": attempt,
        "state": "preserved",
        "checkpointDir": str(attempt_path),
        "sealed": True,
        "seats": [s.as_dict() for s in summaries],
        "failures": [],
        "timingsMs": {},
        "offline": True,
    }


def _finish(
    layout: Layout,
    journal: Journal,
    attempt: str,
    result: dict[str, Any],
    descriptor: ResumeDescriptor,
    t0: float,
) -> dict[str, Any]:
    if result["failures"] or not result["sealed"]:
        failed = (
            "; ".join(f"{f['name']}: {f['error']}" for f in result["failures"])
            or "the attempt was not sealed"
        )
        raise Refusal(
            "cut-incomplete",
            f"cut {attempt} is incomplete: {failed}. Evidence: {result['checkpointDir']}",
            "the seats are stopped and their durables kept; fix the cause and rerun `cotal down --preserve-state` "
            "to continue this attempt",
        )
    read_manifest(Path(result["checkpointDir"]))
    journal.advance(
        attempt, "cut-committed", resume=descriptor, checkpoint_dir=result["checkpointDir"]
    )
    record = mesh.read_mesh(layout)
    status = mesh.daemon_status(layout)
    if status is not None:
        _say("stopping the manager (footprint kept)")
        _call(layout, "shutdown", {}, 60.0)
    if (
        record is not None
        and record.manager is not None
        and not prove_gone(record.manager, timeout=30.0)
    ):
        raise Refusal(
            "daemon-stuck",
            f"manager pid {record.manager.pid} did not exit",
            f"kill -9 {record.manager.pid}, then rerun `cotal down --preserve-state`",
        )
    if record is not None and record.embedded_broker is not None:
        _say("stopping the embedded broker")
        embedded.stop_embedded(record.embedded_broker)
    inventory = journal.resume_document()
    _prove_no_seat_processes(inventory)
    journal.advance(attempt, "ready", resume=descriptor, checkpoint_dir=result["checkpointDir"])
    layout.mesh.unlink(missing_ok=True)
    result = dict(result)
    result["wallMs"] = int((time.monotonic() - t0) * 1000)
    result["journal"] = "ready"
    return result


def run_cut(args: argparse.Namespace, root: Path) -> int:
    t0 = time.monotonic()
    layout = Layout.at(root)
    journal = Journal(layout)
    record = journal.load() if (layout.maintenance / "journal.json").exists() else None
    stores = [str(Path(s).resolve()) for s in args.session_store]
    if record is not None and record.kind == "cut" and record.state == "ready":
        result = {
            "attemptId": record.attempt_id,
            "journal": "ready",
            "checkpointDir": record.checkpoint_dir,
            "alreadyComplete": True,
        }
        _print(args, result, already=True)
        return 0
    if record is not None and record.state in ("cut-intent", "cut-committed"):
        attempt, continuing = record.attempt_id, True
    elif record is not None and record.state not in ("retired", "degraded"):
        raise Refusal(
            "journal-busy",
            f"the maintenance journal is at {record.state} for attempt {record.attempt_id}",
            "finish that resume (cotal up --restore) first",
        )
    else:
        attempt, continuing = names.mint_attempt_id(), False
    with MaintenanceLock(layout, attempt):
        if record is not None and not continuing:
            journal.discard(record.attempt_id)
        status = mesh.daemon_status(layout)
        if not continuing:
            if status is None:
                raise Refusal(
                    "not-up",
                    f"no manager answers in {layout.root}",
                    "start it with `cotal up --detach`",
                )
            _say(f"cut {attempt}: fencing, draining and planning {status['seats']} seat(s)")
            plan = _call(layout, "prepare-preservation", {"attemptId": attempt}, 120.0)
            descriptor = convert(plan["resume"], ResumeDescriptor, what="prepare result")
            journal.advance(attempt, "cut-intent", resume=descriptor)
            _say("stopping every seat, proving each exit, capturing and sealing")
            result = anyio.run(_commit_with_progress, layout, attempt, stores, backend="asyncio")
        else:
            assert record is not None and record.resume is not None
            descriptor = record.resume
            _say(f"continuing cut {attempt} from journal state {record.state}")
            if status is not None and status["state"] in ("preserving", "preserved"):
                if status["state"] == "preserving":
                    _call(layout, "prepare-preservation", {"attemptId": attempt}, 120.0)
                result = anyio.run(
                    _commit_with_progress, layout, attempt, stores, backend="asyncio"
                )
            elif status is not None:
                raise Refusal(
                    "cut-interrupted",
                    f"cut {attempt} was interrupted and the manager now runs {status['state']} without it",
                    "the plan is in .cotal/maintenance/v1/resume.json; stop this manager (`cotal down` would "
                    "deprovision: kill it instead) and rerun `cotal down --preserve-state` to capture offline",
                )
            else:
                mesh_record = mesh.read_mesh(layout)
                if (
                    mesh_record is not None
                    and mesh_record.manager is not None
                    and alive(mesh_record.manager)
                ):
                    raise Refusal(
                        "daemon-unresponsive",
                        f"manager pid {mesh_record.manager.pid} is alive but does not answer",
                        f"kill {mesh_record.manager.pid} (its seats die with it), then rerun",
                    )
                inventory = journal.resume_document()
                _prove_no_seat_processes(inventory)
                sealed = cut.attempt_dir(layout, attempt) / "manifest.json"
                if sealed.exists():
                    manifest = read_manifest(sealed.parent)
                    result = {
                        "attemptId": attempt,
                        "state": "preserved",
                        "checkpointDir": str(sealed.parent),
                        "sealed": True,
                        "seats": [{"name": s.name} for s in manifest.seats],
                        "failures": [],
                    }
                else:
                    result = anyio.run(
                        _capture_offline, layout, attempt, inventory, stores, backend="asyncio"
                    )
        result = _finish(layout, journal, attempt, result, descriptor, t0)
    _print(args, result)
    return 0


def _print(args: argparse.Namespace, result: dict[str, Any], *, already: bool = False) -> None:
    if args.json:
        sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
        return
    out = sys.stdout.write
    if already:
        out(f"cut {result['attemptId']} is already sealed and ready at {result['checkpointDir']}\n")
        return
    out(f"cut {result['attemptId']} sealed; journal ready\n")
    out(f"checkpoint  {result['checkpointDir']}\n")
    for seat in result["seats"]:
        t = seat.get("timingsMs") or {}
        out(
            f"  {seat['name']:<16} {seat.get('continuity', '?'):<10} {seat.get('bytes', 0):>10} bytes  "
            f"repo {t.get('repository', '-')}ms  session {t.get('session', '-')}ms  seal {t.get('seal', '-')}ms\n"
        )
    tm = result.get("timingsMs") or {}
    out(
        f"phases: stop {tm.get('stop', '-')}ms, capture {tm.get('capture', '-')}ms; wall {result.get('wallMs')}ms\n"
    )
    out(f"next: copy {result['checkpointDir']} to the destination, then `cotal up --restore DIR`\n")
