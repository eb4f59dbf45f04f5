"""Op name to handler, each added under the op whose records type it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from protocol import control
from protocol.errors import Refusal
from protocol.refusals import Code

A = TypeVar("A")
R = TypeVar("R")

Handler = Callable[[Any], Awaitable[Any]]


class Table:
    """Op name to handler, each added with the op that types it: mypy holds the handler to the
    op's argument record and reply record."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}

    def add(self, op: control.Op[A, R], handler: Callable[[A], Awaitable[R]]) -> None:
        if op.name in self.handlers:
            raise Refusal(
                Code.UNSUPPORTED_OP,
                f"op {op.name!r} has two handlers",
                "register each op once (manager/daemon/handlers)",
            )
        self.handlers[op.name] = handler
