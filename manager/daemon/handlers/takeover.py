"""The `takeover` op: a lost host's seats, each from its standing checkpoint
(manager/daemon/takeover.py). Asked by `cotal takeover`; the reply comes once each seat runs
here, or the first refusal, with the seats before it taken over."""

from __future__ import annotations

from typing import Protocol

from manager.daemon.handlers.table import Table
from manager.daemon.takeover import Takeover
from protocol import control


class TakeoverOpsOwner(Protocol):
    @property
    def takeover(self) -> Takeover: ...


class TakeoverHandlers:
    def __init__(self, mgr: TakeoverOpsOwner) -> None:
        self.mgr = mgr

    def register(self, table: Table) -> None:
        table.add(control.TAKEOVER, self.takeover)

    async def takeover(self, args: control.TakeoverArgs) -> control.TakeoverReply:
        return await self.mgr.takeover.take(args)
