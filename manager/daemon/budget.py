"""Budgets: a seat at its budget gets no delivery (docs/operations.md, "What each seat costs").

`[budget]` in cotal.toml limits the root's seats together, `[budget.seats.NAME]` one seat: the
tokens its turns used in the current UTC day and what they cost at `[prices]` (from the seats'
usage ledgers, which travel with their sessions), the turns it ran in the current clock hour
(counted by this manager: a restart or a move starts that count again). A seat that reached a
limit is not handed its next message: its bridge waits before pulling
(`SeatBudget.wait_within`), so the mail stays queued in its inbox at the broker, and `ps` says
`at budget`. It resumes when the window turns (the next day,
the next hour), when the limit is raised in cotal.toml (read again while it waits), or when an
operator lifts it (`cotal budget lift SEAT`: the limits the seat has reached are waived for the
rest of their windows). The check is made before each message is pulled, and again with a
pulled message in hand (held in progress, not run, while the seat is at its budget): a turn
already under way runs to its end, and a root's limit reached by another seat's turn stops this
one from its next message on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal, Protocol

import anyio
import structlog

from manager import registry
from manager.daemon.events import Events
from manager.daemon.usage import UsageLedger, cost_of
from manager.registry import BudgetConfig, BudgetLimits, PriceConfig
from protocol.errors import Refusal
from protocol.events import EventDetail
from protocol.instant import format_instant

log = structlog.get_logger("cotal.budget")

Limit = Literal["tokens_per_day", "usd_per_day", "turns_per_hour"]
Scope = Literal["seat", "root"]
# How often a seat at its budget looks again (a window turning, cotal.toml changed); a lift
# wakes it at once.
BUDGET_POLL_S = 1.0
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


class Metered(Protocol):
    """What a budget reads of a seat (manager/daemon/seat.py's `Seat`)."""

    name: str
    uid: str
    usage: UsageLedger | None
    # When each of its turns here ended, the last hour's.
    turn_ends: list[datetime]
    # The reached limits an operator waived, by `Reached.key` (its window included).
    budget_lifts: set[str]


@dataclass(frozen=True)
class Reached:
    """A limit a seat has reached: whose (`seat`, or `root` for all its seats together), which,
    how much was used of how much, and the window it counts in."""

    scope: Scope
    limit: Limit
    used: float
    allowed: float
    window: datetime
    resets_at: datetime

    @property
    def key(self) -> str:
        return f"{self.scope}.{self.limit}@{format_instant(self.window)}"

    @property
    def name(self) -> str:
        return f"{self.scope}.{self.limit}"

    def text(self) -> str:
        whose = "the root's" if self.scope == "root" else "its"
        return (
            f"at budget: {whose} {self.limit} = {self.allowed:g}, {self.used:g} used; resumes at "
            f"{format_instant(self.resets_at)} or `cotal budget lift`"
        )


def windows(now: datetime) -> dict[Limit, tuple[datetime, datetime]]:
    """Each limit's current window: the UTC day, the clock hour."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    hour = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return {
        "tokens_per_day": (day, day + DAY),
        "usd_per_day": (day, day + DAY),
        "turns_per_hour": (hour, hour + HOUR),
    }


def used(seat: Metered, limit: Limit, since: datetime, prices: Mapping[str, PriceConfig]) -> float:
    if limit == "tokens_per_day":
        return seat.usage.since(since)[1] if seat.usage is not None else 0
    if limit == "usd_per_day":
        return spent(seat, since, prices)
    return sum(1 for t in seat.turn_ends if t >= since)


def spent(seat: Metered, since: datetime, prices: Mapping[str, PriceConfig]) -> float:
    """Estimated US dollars the seat's turns since `since` cost at `prices`. A turn whose model
    has no price counts nothing, and says so once per model in the log: a dollar budget can
    only hold what it can price (docs/operations.md)."""
    if seat.usage is None:
        return 0.0
    total = 0.0
    for record in seat.usage.records_since(since):
        cost = cost_of([record], prices)
        if cost is None:
            if record.model not in _unpriced:
                _unpriced.add(record.model)
                log.warning("budget.unpriced", seat=seat.name, model=record.model)
            continue
        total += cost
    return round(total, 6)


# The models a dollar budget met without a price, said once each.
_unpriced: set[str | None] = set()


def now_utc() -> datetime:
    return datetime.now(UTC)


class Budgets:
    """The manager's budgets: the configuration (read again when cotal.toml changes) and which
    limit each seat has reached."""

    def __init__(
        self,
        root: Path,
        table: Callable[[], Iterable[Metered]],
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        self._root = root
        self._table = table
        self._clock = clock
        self._stamp: tuple[int, int, int] | None = None
        self._config = BudgetConfig()
        self._prices: dict[str, PriceConfig] = {}
        self._changed = anyio.Event()

    def config(self) -> BudgetConfig:
        """`[budget]` as cotal.toml says now; a file that no longer reads leaves the last."""
        path = self._root / registry.CONFIG_NAME
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = (0, 0, 0)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                loaded = registry.load_config(self._root)
                self._config, self._prices = loaded.budget, loaded.prices
            except Refusal as exc:
                log.error("budget.config_unreadable", error=exc.text)
        return self._config

    def reached(self, seat: Metered) -> Reached | None:
        """The first limit the seat has reached and no operator lifted, the seat's own first."""
        config = self.config()
        prices = self._prices
        now = self._clock()
        scopes: list[tuple[Scope, BudgetLimits | None, Callable[[], list[Metered]]]] = [
            ("seat", config.seats.get(seat.name), lambda: [seat]),
            ("root", config, lambda: list(self._table())),
        ]
        for scope, limits, seats in scopes:
            if limits is None:
                continue
            for limit, (start, end) in windows(now).items():
                allowed: float | None = getattr(limits, limit)
                if allowed is None:
                    continue
                total = sum(used(s, limit, start, prices) for s in seats())
                hit = Reached(scope, limit, total, allowed, start, end)
                if total >= allowed and hit.key not in seat.budget_lifts:
                    return hit
        return None

    def lift(self, seat: Metered) -> list[Reached]:
        """Waive every limit the seat has reached, for the rest of its window; wakes it."""
        lifted: list[Reached] = []
        while (hit := self.reached(seat)) is not None:
            seat.budget_lifts.add(hit.key)
            lifted.append(hit)
        # A lift of a window gone by waives nothing any more: only the current ones are kept.
        current = {format_instant(start) for start, _ in windows(self._clock()).values()}
        for key in list(seat.budget_lifts):
            if key.rpartition("@")[2] not in current:
                seat.budget_lifts.discard(key)
        self.changed()
        return lifted

    def changed(self) -> None:
        """Wake every seat waiting at its budget to look again."""
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def wait_changed(self, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await self._changed.wait()


class SeatBudget:
    """One seat's side of the budgets, for its delivery bridge: each turn's end counted, and the
    wait before its next message while it is at its budget (said once in the log and events
    when it stops, and when it resumes)."""

    def __init__(self, budgets: Budgets, seat: Metered, events: Events | None) -> None:
        self.budgets = budgets
        self.seat = seat
        self.events = events

    def turn_ended(self) -> None:
        now = self.budgets._clock()
        self.seat.turn_ends = [t for t in self.seat.turn_ends if t > now - HOUR] + [now]

    def within(self) -> bool:
        return self.budgets.reached(self.seat) is None

    async def wait_within(self, given_up: Callable[[], bool] = lambda: False) -> None:
        """Returns once the seat is within its budget, or once `given_up` says the wait no
        longer matters (a cut's fence, a stop)."""
        stopped: Reached | None = None
        while (hit := self.budgets.reached(self.seat)) is not None and not given_up():
            if stopped is None or hit.key != stopped.key:
                stopped = hit
                log.warning("budget.reached", seat=self.seat.name, why=hit.text())
                self._emit("seat.budget_reached", hit)
            await self.budgets.wait_changed(BUDGET_POLL_S)
        if stopped is not None and hit is None:
            log.info("budget.resumed", seat=self.seat.name, limit=stopped.name)
            self._emit("seat.budget_resumed", stopped)

    def _emit(
        self, kind: Literal["seat.budget_reached", "seat.budget_resumed"], hit: Reached
    ) -> None:
        if self.events is not None:
            tokens = int(hit.used) if hit.limit == "tokens_per_day" else None
            detail = EventDetail(limit=hit.name, tokens=tokens)
            self.events.emit(kind, self.seat.name, self.seat.uid, detail)
