"""The `fleet` op: the roster of this manager's space, read over the broker connection the
manager already holds. `cotal ps --fleet` asks it so that a command neither imports nats-py nor
opens a connection of its own: that was most of what it cost (bench/fleet.py). And the
`inbox-depths` op: each of this manager's seats' inbox as the broker counts it, for the
console's INBOX column, over the same connection."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import anyio
import msgspec
import nats.errors
from nats.js import JetStreamContext

from manager.broker import fleet
from manager.broker.retry import phase
from manager.daemon.handlers.table import Table
from manager.daemon.seat import Seat
from protocol import control, names
from protocol.codec import encode_json


class FleetOpsOwner(Protocol):
    @property
    def js(self) -> JetStreamContext: ...

    @property
    def space(self) -> str: ...

    @property
    def seats(self) -> Mapping[str, Seat]: ...


# One seat's consumer info at most this long: a broker that does not answer leaves the seat's
# depth out rather than holding the reply.
DEPTH_TIMEOUT_S = 5.0


class FleetHandlers:
    def __init__(self, mgr: FleetOpsOwner) -> None:
        self.mgr = mgr

    def register(self, table: Table) -> None:
        table.add(control.FLEET, self.fleet)
        table.add(control.INBOX_DEPTHS, self.inbox_depths)

    async def fleet(self, _args: control.NoArgs) -> control.FleetReply:
        with phase("fleet roster"):
            rows = await fleet.roster(self.mgr.js, self.mgr.space)
        return control.FleetReply(rows=msgspec.Raw(encode_json(rows)))

    async def inbox_depths(self, _args: control.NoArgs) -> list[control.InboxDepth]:
        """Each seat's inbox durable's counts, asked of the broker for every seat at once; a
        seat whose durable is not there (removed, or its custody moved) or that the broker did
        not answer for in time is left out."""
        seats = sorted(self.mgr.seats.values(), key=lambda s: s.name)
        found: list[control.InboxDepth | None] = [None] * len(seats)
        stream = names.dm_stream(self.mgr.space)

        async def one(i: int, seat: Seat) -> None:
            durable = names.dm_durable(names.SEAT_OWNER, seat.name, seat.uid)
            try:
                with anyio.fail_after(DEPTH_TIMEOUT_S):
                    info = await self.mgr.js.consumer_info(stream, durable)
            except (TimeoutError, nats.errors.Error):
                return
            found[i] = control.InboxDepth(
                name=seat.name,
                lifecycle_uid=seat.uid,
                pending=info.num_pending or 0,
                in_flight=info.num_ack_pending or 0,
            )

        async with anyio.create_task_group() as tg:
            for i, seat in enumerate(seats):
                tg.start_soon(one, i, seat)
        return [depth for depth in found if depth is not None]
