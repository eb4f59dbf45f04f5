"""A command's session with its root's manager, and one request on it.

Apart from `manager.coord.mesh` (which starts and stops brokers and managers) because the
commands that only ask the running manager (`ps`, `send`, `spawn`, `stop`, `inbox`, ...) are
the ones an operator and a script run most, and should not import what starts a mesh.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from manager.control.client import ControlSession
from manager.workspace.layout import Layout
from manager.workspace.private import read_stable
from protocol import control as ops
from protocol.errors import Refusal
from protocol.refusals import Code

A = TypeVar("A")
R = TypeVar("R")


def read_token(layout: Layout) -> str:
    try:
        return (
            read_stable(layout.control_token, cap=1024, what="control token", require_private=True)
            .data.decode()
            .strip()
        )
    except Refusal as exc:
        if exc.code == Code.MISSING:
            raise Refusal(
                Code.NOT_UP,
                f"no manager has been started in {layout.root}",
                "run `cotal up --detach` there",
            ) from None
        raise


def control(layout: Layout) -> ControlSession:
    """The control session a command holds for its whole run."""
    return ControlSession(layout.socket, lambda: read_token(layout))


async def request(root: Path, op: ops.Op[A, R], args: A, timeout: float = 60.0) -> R:
    """One op on a session of its own: for commands that make a single request."""
    async with control(Layout.at(root)) as session:
        return await session.request(op, args, timeout=timeout)


def run_request(root: Path, op: ops.Op[A, R], args: A, timeout: float = 60.0) -> R:
    """`request` from a command's synchronous handler: no event loop, a blocking socket
    (`manager/control/blocking.py`), since the command does nothing else meanwhile."""
    from manager.control import blocking

    layout = Layout.at(root)
    return blocking.request(layout.socket, read_token(layout), op, args, timeout)
