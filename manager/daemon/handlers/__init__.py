"""The control handlers, registered from `protocol.control.OPS`.

Each op's handler is added under the op's own record (`Table.add`), so its argument and its
reply are the op's types; the table is checked against OPS before the daemon serves
(`serving`), so an op without a handler is refused at start-up rather than at its first call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from manager.daemon.handlers import fleet, mail, metrics, preservation, seats, takeover
from manager.daemon.handlers.table import Handler, Table
from protocol import control
from protocol.errors import Refusal
from protocol.refusals import Code

Dispatch = Callable[[str, Any], Awaitable[Any]]


class HandlerOwner(
    seats.SeatOpsOwner,
    mail.MailOwner,
    preservation.PreservationOpsOwner,
    metrics.MetricsOpsOwner,
    fleet.FleetOpsOwner,
    takeover.TakeoverOpsOwner,
    Protocol,
):
    """Everything the control ops ask of the Manager: the handler groups' views."""


def build(mgr: HandlerOwner) -> dict[str, Handler]:
    table = Table()
    seats.SeatHandlers(mgr).register(table)
    mail.MailHandlers(mgr).register(table)
    preservation.PreservationHandlers(mgr).register(table)
    metrics.MetricsHandlers(mgr).register(table)
    fleet.FleetHandlers(mgr).register(table)
    takeover.TakeoverHandlers(mgr).register(table)
    return table.handlers


OnRefusal = Callable[[str, Any, Refusal], None]


def serving(handlers: Mapping[str, Handler], on_refusal: OnRefusal | None = None) -> Dispatch:
    """The control server's dispatch over `handlers`, once they answer exactly the ops in OPS;
    refused otherwise, so a daemon missing a handler never starts serving. `on_refusal` is told
    each op a handler refused (the manager's `refusal` event), before the refusal goes back."""
    control.check_handlers(handlers)
    table = dict(handlers)

    async def dispatch(op: str, args: Any) -> Any:
        handler = table.get(op)
        if handler is None:
            # decode_args refuses a name OPS does not know first; this is a table built
            # around that check.
            raise Refusal(
                Code.UNSUPPORTED_OP, f"op {op!r} is not implemented by this daemon", "upgrade cotal"
            )
        try:
            return await handler(args)
        except Refusal as exc:
            if on_refusal is not None:
                on_refusal(op, args, exc)
            raise

    return dispatch
