"""`cotal ps --fleet`: where every seat of this root's space is, across every manager that
shares its broker.

The broker is the one this root's mesh record names: its embedded broker, or the `--server`
broker or cluster it was brought up against. Only the latter is shared with other managers;
on an embedded broker the roster is this root's own seats. The roster is read-only
(`manager/broker/fleet.py`). The root's running manager is asked first (the `fleet` op: it
reads over the connection it holds, so the command imports no nats-py); when none answers, the
roster is read from the broker directly, which only needs the broker running.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from manager import eventloop
from manager.cli.args import root_of
from manager.cli.output import age, emit_json, format_table, say
from manager.workspace.layout import Layout
from protocol import control
from protocol.errors import Refusal
from protocol.fleet import LOST, FleetRow
from protocol.mesh import MeshRecord
from protocol.refusals import Code

FLEET_COLUMNS = [
    ("NAME", "name"),
    ("INSTANCE", "instance"),
    ("HOST", "host"),
    ("STATE", "state"),
    ("GEN", "generation"),
    # Where a seat in transit goes (`cotal move`'s destination); `-` for every other row.
    ("TO", "to"),
]


def _broker_of(layout: Layout) -> MeshRecord:
    from manager.procs import alive
    from manager.workspace.meshfile import read_mesh

    record = read_mesh(layout)
    if record is None:
        raise Refusal(
            Code.NOT_UP,
            f"no mesh is up in {layout.root} (no .cotal/mesh.json), so there is no broker to ask",
            "run this at a root whose mesh is up, or `cotal up --server URL --creds FILE` here "
            "to join the shared broker",
        )
    if record.embedded_broker is not None and not alive(record.embedded_broker):
        raise Refusal(
            Code.BROKER_UNAVAILABLE,
            f"the embedded broker of {layout.root} (pid {record.embedded_broker.pid}) is not "
            "running",
            "`cotal up` starts it again; then retry",
        )
    return record


async def _roster(record: MeshRecord) -> list[FleetRow]:
    from manager.broker import fleet
    from manager.broker.connection import LazyConnection
    from manager.broker.retry import phase

    creds = Path(record.creds) if record.creds else None
    async with LazyConnection(record.server, creds, name="cotal-fleet") as conn:
        js = await conn.jetstream()
        with phase("fleet roster"):
            return await fleet.roster(js, record.space)


def _asked(layout: Layout) -> list[FleetRow] | None:
    """The roster from this root's running manager, over its control socket; None when no
    manager answers there (then the broker is read directly)."""
    from manager.control.oneshot import run_request

    try:
        reply = run_request(layout.root, control.FLEET, control.NoArgs(), 30.0)
    except Refusal as exc:
        # No manager here, or one older than the op: the broker is read directly.
        if exc.code in (Code.NOT_UP, Code.DAEMON_UNREACHABLE, Code.UNKNOWN_OP):
            return None
        raise
    return msgspec.json.decode(reply.rows, type=list[FleetRow])


def _ago(since: str | None, now: datetime) -> str:
    """How long since an instant (`output.age`); `?` when it is unknown."""
    return age(since, now) or "?"


def _cells(row: FleetRow, now: datetime) -> dict[str, Any]:
    cells: dict[str, Any] = msgspec.to_builtins(row)
    if row.state == LOST:
        # How long the holder has not been seen alive, at a glance; the instant is below.
        cells["state"] = f"{LOST} {_ago(row.since, now)}"
    return cells


def run_fleet(args: argparse.Namespace) -> int:
    layout = Layout.at(root_of(args))
    # A root with no mesh, or whose embedded broker is down, has nothing to ask: refused first.
    record = _broker_of(layout)
    found = _asked(layout)
    if found is None:
        found = eventloop.run(_roster, record)
    if args.json:
        emit_json(found)
        return 0
    if not found:
        say("no seats at this broker")
        return 0
    now = datetime.now(UTC)
    say(format_table([_cells(row, now) for row in found], FLEET_COLUMNS))
    for row in found:
        for error in row.errors:
            say(f"{row.name} ({row.lifecycle_uid}): {error}")
        if row.state == LOST:
            say(
                f"{row.name} ({row.lifecycle_uid}): lost: {row.instance} has no lease, last seen"
                f" alive {row.since or 'at an unknown time'}; {row.takeover}"
            )
    return 0
