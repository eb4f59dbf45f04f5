"""What the console draws, from what the CLI reads: pure, so every rule is a unit test.

Three sources, joined by seat lifecycle (name and lifecycle uid):

- the fleet roster (`cotal ps --fleet`, the `fleet` op): every seat of the space at the broker,
  whichever manager holds it, with its holder, host and broker-side state (`running`, `held`,
  `lost`, `in transit`, ...);
- this root's seats (`cotal ps`, the `ps` op): for the seats this manager holds, the precise
  state (`stopped`, `failed`, ...), the turn in flight and since when, dead letters, tokens,
  cost and a budget reached;
- the lifecycle events of every manager (`cotal events --fleet`): for a seat another manager
  holds, the only word the console has of its turns, dead letters and budget, since its own
  manager is asked nothing by this one. Counts made from events start where the console's
  replay starts, and are shown as such (`+N`).

`Board` accumulates them; `Board.view(now)` is the picture at an instant: one `SeatLine` a seat,
and the "needs you" rail (`Need`): a dead letter, a seat at its budget, a lost host, a refused
move or op, a seat that failed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from protocol.control import InboxDepth, SeatRow
from protocol.events import Event
from protocol.fleet import LOST, FleetRow
from protocol.instant import parse_instant

# Refusals the rail keeps: the newest are what an operator acts on; older ones are in
# `cotal events`.
REFUSALS_KEPT = 8
# Local states that need the operator: the seat will not come back by itself.
STUCK = frozenset({"failed", "unproven", "retired"})
# Events after which a seat has no turn in flight.
TURN_OVER = frozenset(
    {
        "turn.ended",
        "seat.stopped",
        "seat.exited",
        "seat.failed",
        "seat.removed",
        "seat.evicted",
        "seat.self_fenced",
        "cut.sealed",
    }
)

Key = tuple[str, str]


def age(since: str | None, now: datetime) -> str:
    """`3d4h`, `2h05m`, `4m12s`, `9s` from an instant to now (as `cotal ps` spells an
    uptime); `?` when it does not parse."""
    if not since:
        return "?"
    try:
        seconds = max(0, int((now - parse_instant(since)).total_seconds()))
    except ValueError:
        return "?"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


@dataclass(frozen=True)
class SeatLine:
    """One row of the seat table, every cell already a string (`-` when unknown)."""

    name: str
    uid: str
    host: str
    instance: str
    # Held by this root's manager: the seat verbs, its log and its transcript are reachable.
    here: bool
    state: str
    turn: str
    inbox: str
    dead: str
    tokens: str
    cost: str

    @property
    def key(self) -> Key:
        return (self.name, self.uid)


@dataclass(frozen=True)
class Need:
    """One entry of the "needs you" rail: what kind, which seat (None for a host), what to do."""

    kind: str
    seat: str | None
    text: str


@dataclass(frozen=True)
class View:
    seats: tuple[SeatLine, ...]
    needs: tuple[Need, ...]
    # One line on the manager and the event stream: what is live, what is down and retried.
    status: str


@dataclass
class _Heard:
    """What the events said of one seat lifecycle."""

    turn_since: str | None = None
    dead: int = 0
    tokens: int = 0
    budget: str | None = None


@dataclass
class Board:
    """The console's state: the last roster and table read, and what the events said since."""

    fleet: list[FleetRow] = field(default_factory=list)
    local: list[SeatRow] = field(default_factory=list)
    # Why the manager did not answer the last read (None: it did); the rows above are then the
    # last ones it gave, shown as such.
    manager_down: str | None = None
    # Why the event stream is not followed now (None: it is).
    events_down: str | None = "not started"
    heard: dict[Key, _Heard] = field(default_factory=dict)
    # This root's seats' inboxes as the broker counted them at the last ask.
    inboxes: dict[Key, InboxDepth] = field(default_factory=dict)
    refusals: deque[Need] = field(default_factory=lambda: deque(maxlen=REFUSALS_KEPT))
    # What the console's own verbs were refused (a move, a drain's seat), newest last.
    refused_here: deque[Need] = field(default_factory=lambda: deque(maxlen=REFUSALS_KEPT))
    # The last read's instant, for the status line.
    read_at: str | None = None

    @property
    def instance(self) -> str | None:
        """This root's manager's instance id, as its own seats name it."""
        return self.local[0].instance_id if self.local else None

    def roster(
        self,
        fleet: Sequence[FleetRow],
        local: Sequence[SeatRow],
        at: str,
        depths: Sequence[InboxDepth] = (),
    ) -> None:
        self.fleet = list(fleet)
        self.local = list(local)
        self.inboxes = {(d.name, d.lifecycle_uid): d for d in depths}
        self.manager_down = None
        self.read_at = at

    def unreachable(self, why: str) -> None:
        self.manager_down = why

    def apply(self, event: Event) -> None:
        if event.type == "refusal":
            op = event.detail.op or "?"
            code = event.detail.code or "?"
            who = f"{event.seat}: " if event.seat else ""
            self.refusals.append(
                Need("refused", event.seat, f"{who}{op} refused ({code}) at {event.at}")
            )
            return
        if event.seat is None or event.uid is None:
            return
        heard = self.heard.setdefault((event.seat, event.uid), _Heard())
        if event.type == "turn.started":
            heard.turn_since = event.at
        elif event.type in TURN_OVER:
            heard.turn_since = None
            if event.type == "turn.ended" and event.detail.tokens:
                heard.tokens += event.detail.tokens
        if event.type == "deadletter.added":
            heard.dead += 1
        elif event.type == "seat.budget_reached":
            heard.budget = event.detail.limit or "a limit"
        elif event.type == "seat.budget_resumed":
            heard.budget = None
        elif event.type == "seat.removed":
            self.heard.pop((event.seat, event.uid), None)

    def refused(self, seat: str | None, text: str) -> None:
        """A verb the console ran was refused for this seat (a move's probe, a drain's seat)."""
        self.refused_here.append(Need("refused move", seat, text))

    def view(self, now: datetime) -> View:
        local = {(r.name, r.lifecycle_uid): r for r in self.local}
        ours = self.instance
        host_here = next((f.host for f in self.fleet if f.instance == ours and f.host), None)
        lines: dict[Key, SeatLine] = {}
        for row in self.fleet:
            key = (row.name, row.lifecycle_uid)
            mine = local.get(key)
            if mine is not None:
                lines[key] = _local_line(mine, row.host or host_here, now, self.inboxes.get(key))
            else:
                lines[key] = _fleet_line(row, self.heard.get(key), now)
        for key, mine in local.items():
            # The roster lags a spawn by a moment, and a broker read can fail while the
            # manager answers: a seat of this root is shown all the same.
            lines.setdefault(key, _local_line(mine, host_here, now, self.inboxes.get(key)))
        seats = tuple(sorted(lines.values(), key=lambda s: (s.name, s.host, s.uid)))
        return View(seats, tuple(self._needs(seats, now)), self._status())

    def _needs(self, seats: Iterable[SeatLine], now: datetime) -> Iterable[Need]:
        by_key = {(r.name, r.lifecycle_uid): r for r in self.local}
        for seat in seats:
            row = by_key.get(seat.key)
            heard = self.heard.get(seat.key)
            if seat.dead not in ("-", "0", "+0"):
                yield Need(
                    "dead letter",
                    seat.name,
                    f"{seat.name}: {seat.dead} dead letter(s): `cotal inbox {seat.name}` at its "
                    "root reads, redelivers or drops them",
                )
            if row is not None and row.budget is not None:
                yield Need("at budget", seat.name, f"{seat.name}: {row.budget}")
            elif row is None and heard is not None and heard.budget is not None:
                yield Need(
                    "at budget",
                    seat.name,
                    f"{seat.name}: at budget ({heard.budget}); `cotal budget lift "
                    f"{seat.name}` at its root",
                )
            if row is not None and row.state in STUCK:
                why = f": {row.reason}" if row.reason else ""
                yield Need("stuck", seat.name, f"{seat.name}: {row.state}{why}")
        yield from self._lost_hosts(now)
        yield from self.refused_here
        yield from self.refusals

    def _lost_hosts(self, now: datetime) -> Iterable[Need]:
        lost: dict[str, list[FleetRow]] = {}
        for row in self.fleet:
            if row.state == LOST and row.instance is not None:
                lost.setdefault(row.instance, []).append(row)
        for instance, rows in sorted(lost.items()):
            names = ", ".join(sorted(r.name for r in rows))
            since = rows[0].since
            what = rows[0].takeover or "`cotal takeover NAME --from INSTANCE`"
            yield Need(
                "lost host",
                None,
                f"{instance} lost {age(since, now)} ago (last seen {since or 'unknown'}): "
                f"{names}; {what}",
            )

    def _status(self) -> str:
        manager = (
            f"manager: DOWN ({self.manager_down}), retrying; rows as last read"
            if self.manager_down is not None
            else f"manager: {self.instance or 'up, no seats'}"
        )
        events = "events: live" if self.events_down is None else f"events: off ({self.events_down})"
        read = f"read {self.read_at}" if self.read_at else "not read yet"
        return f"{manager}  |  {events}  |  {read}"


def _tokens(tokens_in: int | None, tokens_out: int | None) -> str:
    if tokens_in is None or tokens_out is None:
        return "-"
    return f"{tokens_in}/{tokens_out}"


def _local_line(
    row: SeatRow, host: str | None, now: datetime, inbox: InboxDepth | None
) -> SeatLine:
    if row.busy:
        turn = f"busy {age(row.turn_started_at, now)}"
    elif row.budget is not None:
        turn = "at budget"
    else:
        turn = "idle" if row.state == "running" else "-"
    return SeatLine(
        name=row.name,
        uid=row.lifecycle_uid,
        host=host or "-",
        instance=row.instance_id,
        here=True,
        state=row.state,
        turn=turn,
        # Every message not yet acknowledged: queued, and the one a turn works on. Unknown (`-`)
        # until asked, or from a manager without the op: an unknown is not a zero.
        inbox=str(inbox.pending + inbox.in_flight) if inbox is not None else "-",
        dead=str(row.dead_letters),
        tokens=_tokens(row.tokens_in, row.tokens_out),
        cost=f"${row.cost_usd:.4f}" if row.cost_usd is not None else "-",
    )


def _fleet_line(row: FleetRow, heard: _Heard | None, now: datetime) -> SeatLine:
    state: str = row.state
    if row.state == LOST:
        state = f"{LOST} {age(row.since, now)}"
    turn = "-"
    if heard is not None and heard.turn_since is not None:
        turn = f"busy {age(heard.turn_since, now)}"
    elif heard is not None and heard.budget is not None:
        turn = "at budget"
    return SeatLine(
        name=row.name,
        uid=row.lifecycle_uid,
        host=row.host or "-",
        instance=row.instance or "-",
        here=False,
        state=state,
        turn=turn,
        # Its manager is not asked: a seat of another root has no inbox depth here.
        inbox="-",
        # Counted from the events this console has read, not the seat's whole inbox.
        dead=f"+{heard.dead}" if heard is not None and heard.dead else "-",
        tokens=f"+{heard.tokens}" if heard is not None and heard.tokens else "-",
        cost="-",
    )
