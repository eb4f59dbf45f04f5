"""The one way a coordinator speaks to a manager: its status, and a typed op.

The CLI's `ControlSession` (the authenticated control socket) is one; the daemon's in-process
port (`manager/daemon/mover.py`) is the other, calling its own control handlers directly when it
runs the restore coordinator for a move's destination. The same op records cross either, so a
coordinator cannot tell, and need not: admission, the custody claim, the journal and every
crash-only rerun are the coordinator's, whoever called it.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from protocol import control

A = TypeVar("A")
R = TypeVar("R")


class ManagerPort(Protocol):
    async def status(self) -> control.StatusReply | None:
        """The manager's status, or None when none answers here."""
        ...

    async def request(self, op: control.Op[A, R], args: A, *, timeout: float = 60.0) -> R: ...
