"""The `fleet` op: the roster of this manager's space, read over the broker connection the
manager already holds. `cotal ps --fleet` asks it so that a command neither imports nats-py nor
opens a connection of its own: that was most of what it cost (bench/fleet.py)."""

from __future__ import annotations

from typing import Protocol

import msgspec
from nats.js import JetStreamContext

from manager.broker import fleet
from manager.broker.retry import phase
from manager.daemon.handlers.table import Table
from protocol import control
from protocol.codec import encode_json


class FleetOpsOwner(Protocol):
    @property
    def js(self) -> JetStreamContext: ...

    @property
    def space(self) -> str: ...


class FleetHandlers:
    def __init__(self, mgr: FleetOpsOwner) -> None:
        self.mgr = mgr

    def register(self, table: Table) -> None:
        table.add(control.FLEET, self.fleet)

    async def fleet(self, _args: control.NoArgs) -> control.FleetReply:
        with phase("fleet roster"):
            rows = await fleet.roster(self.mgr.js, self.mgr.space)
        return control.FleetReply(rows=msgspec.Raw(encode_json(rows)))
