"""How many seats the cut, the restore and the adoptions work on at once, and the one ordered map.

Results come back in input order, so running seats together changes no outcome
(docs/design.md, "The core modules, in detail"; docs/operations.md, "Concurrency").
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import anyio

from protocol.errors import Refusal
from protocol.refusals import Code

ENV: Final = "COTAL_JOBS"
MIN_DEFAULT: Final = 2
MAX_DEFAULT: Final = 16
# Beyond this an override is a typo, not a plan: each job may hold a git process and its pipes.
MAX_JOBS: Final = 256

_DIGITS = re.compile(r"[1-9][0-9]{0,5}")

T = TypeVar("T")
R = TypeVar("R")


def usable_cores() -> int:
    try:
        # The cores this process may run on (a cgroup or taskset narrows them), not the host's.
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_jobs() -> int:
    return min(MAX_DEFAULT, max(MIN_DEFAULT, 2 * usable_cores()))


def parse_jobs(text: str, *, what: str = ENV) -> int:
    """A positive integer up to MAX_JOBS, spelled in ASCII digits; anything else is refused."""
    if _DIGITS.fullmatch(text) is None or int(text) > MAX_JOBS:
        raise Refusal(
            Code.BAD_JOBS,
            f"{what}={text!r} is not a whole number of jobs from 1 to {MAX_JOBS}",
            f"give {what} a positive integer such as 4, or leave it unset for the default "
            f"({default_jobs()} here: twice the usable cores, bounded to "
            f"{MIN_DEFAULT}..{MAX_DEFAULT})",
        )
    return int(text)


def jobs() -> int:
    value = os.environ.get(ENV)
    return default_jobs() if value is None else parse_jobs(value)


def limiter() -> anyio.CapacityLimiter:
    return anyio.CapacityLimiter(jobs())


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """One item's result, or the exception its step raised instead."""

    value: R | None = None
    error: Exception | None = None

    def unwrap(self) -> R:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


async def ordered_map(
    fn: Callable[[T], Awaitable[R]],
    items: Sequence[T],
    limiter: anyio.CapacityLimiter,
) -> list[Outcome[R]]:
    """`fn` over every item, at most `limiter`'s tokens at once; the outcomes in input order.

    One item's exception is its own outcome and never cancels the others, so a caller that
    refuses on the first failure in input order names the same item a sequential loop would.
    Cancellation (a BaseException) is not an outcome: it ends the whole map.
    """
    out: list[Outcome[R] | None] = [None] * len(items)

    async def one(index: int, item: T) -> None:
        async with limiter:
            try:
                out[index] = Outcome(value=await fn(item))
            except Exception as exc:
                out[index] = Outcome(error=exc)

    async with anyio.create_task_group() as tg:
        for index, item in enumerate(items):
            tg.start_soon(one, index, item)
    return [o for o in out if o is not None]


def first_error(outcomes: Sequence[Outcome[Any]]) -> Exception | None:
    return next((o.error for o in outcomes if o.error is not None), None)


class JobsAction(argparse.Action):
    """`--jobs N`: checked strictly, then handed on as COTAL_JOBS, so this process and the
    manager it starts (which inherits the environment) use the same limit."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        try:
            n = parse_jobs(str(values), what=option_string or "--jobs")
        except Refusal as exc:
            raise argparse.ArgumentError(self, f"{exc.message} ({exc.cure})") from None
        os.environ[ENV] = str(n)
        setattr(namespace, self.dest, n)
