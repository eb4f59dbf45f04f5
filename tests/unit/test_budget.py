"""Budgets (manager/daemon/budget.py): which limit a seat has reached, per seat and for the
root's seats together, in which window, until when, and what a lift waives."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

from manager.daemon.budget import Budgets, SeatBudget
from manager.daemon.usage import UsageLedger, UsageRecord
from manager.registry import load_config
from protocol.errors import Refusal
from protocol.instant import format_instant

NOW = datetime(2026, 12, 7, 10, 30, tzinfo=UTC)


@dataclass
class FakeSeat:
    name: str
    uid: str = "u"
    usage: UsageLedger | None = None
    turn_ends: list[datetime] = field(default_factory=list)
    budget_lifts: set[str] = field(default_factory=set)


def spent(name: str, *tokens: tuple[datetime, int]) -> FakeSeat:
    records = [UsageRecord(at=format_instant(at), input_tokens=n) for at, n in tokens]
    return FakeSeat(name, usage=UsageLedger(None, records, None))


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


def budgets(root: Path, toml: str, seats: list[FakeSeat], clock: Clock) -> Budgets:
    (root / "cotal.toml").write_text(toml)
    return Budgets(root, lambda: seats, clock)


def test_a_seats_own_tokens_per_day_counts_today_only_and_resets_at_midnight(
    tmp_path: Path,
) -> None:
    clock = Clock()
    a = spent("a", (NOW - timedelta(days=1), 900), (NOW - timedelta(hours=2), 150))
    b = budgets(tmp_path, "[budget.seats.a]\ntokens_per_day = 200\n", [a], clock)
    assert b.reached(a) is None
    a.usage.add(UsageRecord(at=format_instant(NOW), input_tokens=50))  # type: ignore[union-attr]
    hit = b.reached(a)
    assert hit is not None
    assert (hit.scope, hit.limit, hit.used, hit.allowed) == ("seat", "tokens_per_day", 200, 200)
    assert hit.resets_at == datetime(2026, 12, 8, tzinfo=UTC)
    assert hit.text() == (
        "at budget: its tokens_per_day = 200, 200 used; resumes at 2026-12-08T00:00:00.000Z or "
        "`cotal budget lift`"
    )
    clock.now = datetime(2026, 12, 8, 0, 0, 1, tzinfo=UTC)
    assert b.reached(a) is None


def test_the_roots_limit_counts_every_seat_and_turns_per_hour_the_clock_hour(
    tmp_path: Path,
) -> None:
    clock = Clock()
    a, c = FakeSeat("a"), FakeSeat("c")
    b = budgets(tmp_path, "[budget]\nturns_per_hour = 3\n", [a, c], clock)
    one, two = SeatBudget(b, a, None), SeatBudget(b, c, None)
    one.turn_ended()
    two.turn_ended()
    assert b.reached(a) is None
    one.turn_ended()
    hit = b.reached(c)
    assert hit is not None and (hit.scope, hit.limit, hit.used) == ("root", "turns_per_hour", 3)
    assert hit.resets_at == datetime(2026, 12, 7, 11, tzinfo=UTC)
    clock.now = datetime(2026, 12, 7, 11, 0, 0, tzinfo=UTC)
    assert b.reached(c) is None


def test_a_lift_waives_the_reached_limits_for_their_window_and_a_raised_limit_resumes(
    tmp_path: Path,
) -> None:
    clock = Clock()
    a = spent("a", (NOW, 500))
    toml = "[budget]\ntokens_per_day = 400\n[budget.seats.a]\ntokens_per_day = 100\n"
    b = budgets(tmp_path, toml, [a], clock)
    lifted = b.lift(a)
    assert [h.key for h in lifted] == [
        "seat.tokens_per_day@2026-12-07T00:00:00.000Z",
        "root.tokens_per_day@2026-12-07T00:00:00.000Z",
    ]
    assert b.reached(a) is None
    assert b.lift(a) == []
    # The next day the lift is spent: a day that reaches the limit again stops it again.
    clock.now = NOW + timedelta(days=1)
    a.usage.add(UsageRecord(at=format_instant(clock.now), input_tokens=100))  # type: ignore[union-attr]
    assert b.reached(a) is not None
    b.lift(a)
    assert all(k.endswith("2026-12-08T00:00:00.000Z") for k in a.budget_lifts)
    # Raised in cotal.toml: read again at the next look.
    c = spent("c", (clock.now, 150))
    b2 = budgets(tmp_path, "[budget.seats.c]\ntokens_per_day = 100\n", [c], clock)
    assert b2.reached(c) is not None
    (tmp_path / "cotal.toml").write_text("[budget.seats.c]\ntokens_per_day = 1000\n\n")
    assert b2.reached(c) is None
    # A file that no longer reads keeps the last limits it read.
    (tmp_path / "cotal.toml").write_text("[budget]\ntokens_per_dya = 1\n")
    assert b2.reached(c) is None


@pytest.mark.anyio
async def test_a_seat_waits_at_its_budget_until_lifted(tmp_path: Path) -> None:
    clock = Clock()
    a = spent("a", (NOW, 500))
    b = budgets(tmp_path, "[budget.seats.a]\ntokens_per_day = 100\n", [a], clock)
    seat = SeatBudget(b, a, None)
    done = anyio.Event()

    async def deliver() -> None:
        await seat.wait_within()
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(deliver)
        await anyio.sleep(0.2)
        assert not done.is_set()
        b.lift(a)
        with anyio.fail_after(2):
            await done.wait()


def test_budget_config_is_strict(tmp_path: Path) -> None:
    for body, said in [
        ("[budget]\ntokens_per_dya = 1\n", "unknown field `tokens_per_dya`"),
        ("[budget]\nturns_per_hour = 0\n", "Expected `int` >= 1"),
        ("[budget.seats.a]\ntokens_per_day = -5\n", "Expected `int` >= 1"),
        ("[budget.seats.bad-name]\ntokens_per_day = 5\n", "[budget.seats.bad-name]"),
    ]:
        (tmp_path / "cotal.toml").write_text(body)
        with pytest.raises(Refusal) as caught:
            load_config(tmp_path)
        assert caught.value.code == "bad-config" and said in caught.value.message


def test_a_dollar_limit_counts_todays_priced_turns_and_skips_an_unpriced_model(
    tmp_path: Path,
) -> None:
    """$1,000 a million in: 150 tokens of today's priced model are $0.15. Yesterday's turn and a
    turn of a model with no price count nothing; a limit of $0.10 is reached, $0.20 is not."""
    clock = Clock()
    a = FakeSeat(
        "a",
        usage=UsageLedger(
            None,
            [
                UsageRecord(
                    at=format_instant(NOW - timedelta(days=1)), input_tokens=900, model="m"
                ),
                UsageRecord(
                    at=format_instant(NOW - timedelta(hours=1)), input_tokens=150, model="m"
                ),
                UsageRecord(at=format_instant(NOW), input_tokens=5000, model="free"),
            ],
            None,
        ),
    )
    prices = '[prices."m"]\ninput = 1000.0\noutput = 1000.0\n'
    b = budgets(tmp_path, prices + "[budget.seats.a]\nusd_per_day = 0.1\n", [a], clock)
    hit = b.reached(a)
    assert hit is not None
    assert (hit.scope, hit.limit, hit.used, hit.allowed) == ("seat", "usd_per_day", 0.15, 0.1)
    assert hit.text().startswith("at budget: its usd_per_day = 0.1, 0.15 used; resumes at ")
    b = budgets(tmp_path, prices + "[budget.seats.a]\nusd_per_day = 0.2\n", [a], clock)
    assert b.reached(a) is None
