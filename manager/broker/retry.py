"""Riding out a broker that is briefly without a leader.

On a cluster every stream, bucket and consumer has its own leader; when one dies there is none
for several seconds (4-9 s measured on our 3-node test cluster), and calls either time out or
answer 503 at once. Those failures are transient: the call is retried with backoff until a
deadline longer than an election. Anything else, and a broker that stays away past the
deadline, is a refusal that says so; it is never mistaken for an answer.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import anyio
import nats.errors
import nats.js.errors
import structlog

from protocol.errors import Refusal
from protocol.refusals import Code

log = structlog.get_logger("cotal.broker")

T = TypeVar("T")

ELECTION_S = 25.0
ATTEMPT_S = 5.0
# How long a broker call rides out a broker that does not answer, for an operator who knows
# better than the election budget: a lone embedded broker that died will not come back by
# waiting, so failing in seconds loses nothing; on a cluster keep it above an election.
PATIENCE_ENV = "COTAL_BROKER_PATIENCE_S"
PATIENCE_RANGE = (1.0, 600.0)
STORE_REFUSED = 10077

TRANSIENT: tuple[type[BaseException], ...] = (
    TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServerError,
)

# What a coordinator's broker phase turns into `broker-unavailable`: the transient failures that
# outlasted their retries, and any other failure the client library reports.
BROKER_FAILURES: tuple[type[BaseException], ...] = (*TRANSIENT, nats.errors.Error)


def patience() -> float:
    """The ride-out budget: `COTAL_BROKER_PATIENCE_S`, else the election budget."""
    raw = os.environ.get(PATIENCE_ENV)
    if raw is None or raw == "":
        return ELECTION_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    low, high = PATIENCE_RANGE
    if not low <= value <= high:  # also false for nan
        raise Refusal(
            Code.BAD_PATIENCE,
            f"{PATIENCE_ENV}={raw!r} is not a number of seconds from {low:g} to {high:g}",
            f"unset {PATIENCE_ENV} (the default is {ELECTION_S:g}s) or give it seconds in range",
        )
    return value


def unavailable(what: str, deadline: float, exc: BaseException) -> Refusal:
    return Refusal(
        Code.BROKER_UNAVAILABLE,
        f"{what}: the broker did not answer for {deadline:.0f}s ({type(exc).__name__})",
        "the broker or cluster may have lost quorum; nothing was changed by this call; retry once "
        "it is back",
    )


async def riding_elections(
    what: str,
    call: Callable[[], Awaitable[T]],
    *,
    deadline: float | None = None,
    attempt_s: float = ATTEMPT_S,
) -> T:
    if deadline is None:
        deadline = patience()
    attempt_s = min(attempt_s, deadline)
    start = anyio.current_time()
    delay = 0.2
    while True:
        try:
            with anyio.fail_after(attempt_s):
                return await call()
        except TRANSIENT as exc:
            # A store that refused the write (err_code 10077: a full stream) answers 503 as a
            # leaderless one does, but no election changes its answer: the caller's to handle.
            if getattr(exc, "err_code", None) == STORE_REFUSED:
                raise
            if anyio.current_time() - start + delay > deadline:
                raise unavailable(what, deadline, exc) from None
            log.warning("broker.retry", what=what, error=type(exc).__name__)
            await anyio.sleep(delay)
            delay = min(delay * 2, 2.0)


@contextmanager
def phase(what: str) -> Iterator[None]:
    """One broker-facing phase of a coordinator: a broker failure that escaped the retries
    becomes a refusal that names the phase; a refusal passes through as it is."""
    try:
        yield
    except Refusal:
        raise
    except BROKER_FAILURES as exc:
        raise unavailable(what, patience(), exc) from None
