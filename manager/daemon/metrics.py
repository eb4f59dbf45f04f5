"""The manager's Prometheus metrics: one registry of its own, `cotal metrics` and `GET /metrics`.

The registry is this Manager's alone (never prometheus_client's global one), and what it holds
is of two kinds. Counters and histograms are updated where things happen: a seat's bridge counts
its deliveries, turns, redeliveries and dead letters (`delivery.py`), the cut counts itself and
marks the seats it stopped (`preserve.py`), a seat running again after a cut of some seats
observes its downtime (`incarnation.py`), a move's destination counts the offers it answered
(`mover.py`), and the loop lag is measured by a task of the Manager's own group. What is a state
rather than an event (the seats by state, each seat's custody generation and dead letters, the
manager's memory) is read from the seat table when the metrics are collected, so it is exactly
what `cotal ps` says at that moment.

`[metrics] listen` (cotal.toml; `registry.parse_listen` admits loopback addresses alone) serves
the same text over HTTP inside the manager's event loop: `GET /metrics` only, one request per
connection, its head capped, a few clients at once. See docs/operations.md, "Monitoring".
"""

from __future__ import annotations

import os
import time
import typing
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Protocol

import anyio
import anyio.abc
import structlog
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from manager.daemon.usage import UsageLedger
from manager.registry import PriceConfig
from protocol.lifecycle import SeatState

log = structlog.get_logger("cotal.metrics")

# Every state a seat can be in, each reported (at 0 when no seat is in it).
STATES: tuple[str, ...] = typing.get_args(SeatState)
# A turn runs from a tenth of a second (scribe) to an hour (a long agent turn).
TURN_BUCKETS = (
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
# A cut's stop-to-seal and a seat's downtime: seconds to an hour.
DOWNTIME_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# How often the loop lag is measured: a sleep of this long, and how late it wakes.
LAG_EVERY_S = 1.0
# Seats a cut stopped and this manager may see running again, kept for their downtime; the
# oldest is forgotten past this many (a seat moved elsewhere never comes back here).
DOWNTIME_MARKS = 1024
# The HTTP endpoint: a request's head, the time a client has to send it, clients at once.
REQUEST_CAP = 8 * 1024
REQUEST_TIMEOUT_S = 5.0
MAX_CLIENTS = 8

TurnEnd = typing.Literal["ok", "failed", "unserved", "cut-off"]
CutScope = typing.Literal["whole", "seats"]
MoveOutcome = typing.Literal["adopted", "already", "refused"]
MOVE_OUTCOMES: tuple[MoveOutcome, ...] = typing.get_args(MoveOutcome)


class SeatView(Protocol):
    """What the collector reads of a seat."""

    @property
    def name(self) -> str: ...

    @property
    def uid(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def generation_at_broker(self) -> int: ...

    @property
    def usage(self) -> UsageLedger | None: ...


class ConfigView(Protocol):
    @property
    def prices(self) -> Mapping[str, PriceConfig]: ...


class MetricsOwner(Protocol):
    """What the metrics read of the Manager when they are collected: its seat table, its
    dead letters per lifecycle uid, and the prices its configuration started with."""

    @property
    def seats(self) -> Mapping[str, SeatView]: ...

    @property
    def dead_counts(self) -> Mapping[str, int]: ...

    @property
    def config(self) -> ConfigView: ...


def resident_bytes() -> int:
    """This process's resident set, from /proc/self/statm (its second field, in pages)."""
    with open("/proc/self/statm", "rb") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


class _TableCollector:
    """The gauges read at collection: the seat table as `cotal ps` shows it, and the process."""

    def __init__(self, owner: MetricsOwner, started: float) -> None:
        self.owner = owner
        self.started = started

    def collect(self) -> Iterator[Metric]:
        seats = list(self.owner.seats.values())
        dead = self.owner.dead_counts
        by_state = GaugeMetricFamily(
            "cotal_seats", "Seats in this manager's table, by lifecycle state.", labels=["state"]
        )
        counts = dict.fromkeys(STATES, 0)
        for seat in seats:
            counts[seat.state] = counts.get(seat.state, 0) + 1
        for state, n in counts.items():
            by_state.add_metric([state], n)
        yield by_state
        generation = GaugeMetricFamily(
            "cotal_seat_custody_generation",
            "The custody (writer) generation each seat runs under.",
            labels=["seat"],
        )
        held = GaugeMetricFamily(
            "cotal_seat_dead_letters",
            "Dead letters each seat's inbox keeps aside now (as `cotal ps` shows them).",
            labels=["seat"],
        )
        for seat in sorted(seats, key=lambda s: s.name):
            generation.add_metric([seat.name], seat.generation_at_broker)
            held.add_metric([seat.name], dead.get(seat.uid, 0))
        yield generation
        yield held
        yield from _usage(seats, self.owner.config.prices)
        yield GaugeMetricFamily(
            "cotal_manager_resident_memory_bytes",
            "The manager process's resident memory (/proc/self/statm).",
            value=resident_bytes(),
        )
        yield GaugeMetricFamily(
            "cotal_manager_start_time_seconds",
            "When this manager started, in seconds since the Unix epoch.",
            value=self.started,
        )


def _usage(seats: list[SeatView], prices: Mapping[str, PriceConfig]) -> Iterator[Metric]:
    """What each seat's harness reported it used, over the seat's usage ledger (which cuts and
    moves carry, so these count from the seat's spawn, wherever it ran), and its estimated
    cost at the root's `[prices]`. A seat with no turn on its ledger, or whose model has no
    price, has no sample: "unknown" is not 0."""
    tokens = CounterMetricFamily(
        "cotal_seat_tokens",
        "Tokens a seat's harness reported over the seat's life, by kind (input includes "
        "cache reads and writes).",
        labels=["seat", "kind"],
    )
    cost = CounterMetricFamily(
        "cotal_seat_cost_usd",
        "A seat's estimated cost over its life at the root's [prices], in US dollars.",
        labels=["seat"],
    )
    for seat in sorted(seats, key=lambda s: s.name):
        used = seat.usage.totals(prices) if seat.usage is not None else None
        if used is None:
            continue
        tokens.add_metric([seat.name, "input"], used.tokens_in)
        tokens.add_metric([seat.name, "output"], used.tokens_out)
        if used.cost_usd is not None:
            cost.add_metric([seat.name], used.cost_usd)
    yield tokens
    yield cost


class Metrics:
    """The registry and its instruments; each update is one call from where it happens."""

    def __init__(self, owner: MetricsOwner) -> None:
        # No `_created` series beside each counter and histogram: a scraper reads a counter
        # reset from the start time, and the series would double the text.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        self._seat_instruments(self.registry)
        self._attempt_instruments(self.registry)
        self.registry.register(_TableCollector(owner, time.time()))
        # Every series without a seat exists from the start, at 0: a rate over a counter's
        # first event needs the zero before it.
        for scope in typing.get_args(CutScope):
            self.cut_seconds.labels(scope)
            for outcome in ("sealed", "failed"):
                self.cuts.labels(scope, outcome)
        self.downtime.labels("cut")
        for outcome in MOVE_OUTCOMES:
            self.moves_in.labels(outcome)
        # Lifecycle uid -> when a cut of some seats began stopping it (anyio's clock).
        self._stopped: OrderedDict[str, float] = OrderedDict()

    def _seat_instruments(self, r: CollectorRegistry) -> None:
        """What a seat's deliveries and turns update."""
        self.turns = Counter(
            "cotal_turns",
            "Turns a seat's harness ran on a delivered message, by how each ended.",
            ["seat", "outcome"],
            registry=r,
        )
        self.turn_seconds = Histogram(
            "cotal_turn_duration_seconds",
            "How long a turn ran, from the message handed to the harness to the turn's end.",
            ["seat"],
            buckets=TURN_BUCKETS,
            registry=r,
        )
        self.deliveries = Counter(
            "cotal_deliveries",
            "Messages the broker delivered to a seat's bridge (its inbox and its channels), "
            "whether or not each ran as a turn.",
            ["seat"],
            registry=r,
        )
        self.redeliveries = Counter(
            "cotal_redeliveries",
            "Deliveries of a message delivered before (the harness is told its delivery count).",
            ["seat"],
            registry=r,
        )
        self.dead_letters = Counter(
            "cotal_dead_letters",
            "Messages this manager moved to a seat's dead letters.",
            ["seat"],
            registry=r,
        )

    def _attempt_instruments(self, r: CollectorRegistry) -> None:
        """What cuts, moves and the manager's own loop update."""
        self.cuts = Counter(
            "cotal_cuts",
            "Cut commits that ended here, by scope (whole mesh, or some seats) and outcome.",
            ["scope", "outcome"],
            registry=r,
        )
        self.cut_seconds = Histogram(
            "cotal_cut_duration_seconds",
            "A sealed cut's window from its first seat stop to its seal: every seat it cut "
            "was stopped at least this long.",
            ["scope"],
            buckets=DOWNTIME_BUCKETS,
            registry=r,
        )
        self.downtime = Histogram(
            "cotal_seat_downtime_seconds",
            "A seat's downtime seen by this manager alone: from a cut of some seats stopping "
            "it to the seat running here again (a resume in place).",
            ["cause"],
            buckets=DOWNTIME_BUCKETS,
            registry=r,
        )
        self.moves_in = Counter(
            "cotal_moves_in",
            "Move offers this manager answered as a destination, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.move_seconds = Histogram(
            "cotal_move_adoption_seconds",
            "A move's share of downtime at its destination: from the offer's arrival to the "
            "moved seats adopted and running here.",
            buckets=DOWNTIME_BUCKETS,
            registry=r,
        )
        self.loop_lag = Histogram(
            "cotal_manager_event_loop_lag_seconds",
            f"How late a {LAG_EVERY_S:g} s sleep of the manager's event loop woke.",
            buckets=LAG_BUCKETS,
            registry=r,
        )

    def text(self) -> bytes:
        """The Prometheus text exposition format (0.0.4) of everything above."""
        return generate_latest(self.registry)

    # -- updates, one call from where each happens ----------------------------------------------

    def _seat_series(self) -> list[tuple[Counter | Histogram, tuple[str, ...]]]:
        return [
            *((self.turns, (outcome,)) for outcome in typing.get_args(TurnEnd)),
            (self.turn_seconds, ()),
            (self.deliveries, ()),
            (self.redeliveries, ()),
            (self.dead_letters, ()),
        ]

    def seat_seen(self, seat: str) -> None:
        """A seat's series, at 0 until their first event (a seat ready here)."""
        for metric, rest in self._seat_series():
            metric.labels(seat, *rest)

    def forget_seat(self, seat: str) -> None:
        """A removed seat's series (`cotal rm`): a seat spawned again under the name starts
        its counters at 0, which a scraper reads as a reset."""
        for metric, rest in self._seat_series():
            try:
                metric.remove(seat, *rest)
            except KeyError:
                pass

    def delivered(self, seat: str, *, again: bool) -> None:
        self.deliveries.labels(seat).inc()
        if again:
            self.redeliveries.labels(seat).inc()

    def turn_ended(self, seat: str, outcome: TurnEnd, seconds: float) -> None:
        self.turns.labels(seat, outcome).inc()
        self.turn_seconds.labels(seat).observe(seconds)

    def dead_lettered(self, seat: str) -> None:
        self.dead_letters.labels(seat).inc()

    def cut_sealed(self, scope: CutScope, seconds: float, stopped: Mapping[str, float]) -> None:
        """A sealed cut: `stopped` is each cut seat's uid and when its stop began, kept for a
        cut of some seats, whose seats may run here again."""
        self.cuts.labels(scope, "sealed").inc()
        self.cut_seconds.labels(scope).observe(seconds)
        if scope != "seats":
            return
        for uid, at in stopped.items():
            self._stopped[uid] = at
            self._stopped.move_to_end(uid)
        while len(self._stopped) > DOWNTIME_MARKS:
            self._stopped.popitem(last=False)

    def cut_failed(self, scope: CutScope) -> None:
        self.cuts.labels(scope, "failed").inc()

    def seat_running(self, name: str, uid: str) -> None:
        """A seat became ready: its series exist from now, and a downtime ends when a cut of
        some seats here had stopped it."""
        self.seat_seen(name)
        at = self._stopped.pop(uid, None)
        if at is not None:
            self.downtime.labels("cut").observe(max(0.0, anyio.current_time() - at))

    def move_answered(self, outcome: MoveOutcome, seconds: float | None = None) -> None:
        self.moves_in.labels(outcome).inc()
        if seconds is not None:
            self.move_seconds.observe(seconds)

    # -- tasks of the Manager's group ------------------------------------------------------------

    async def watch_loop_lag(self, every: float = LAG_EVERY_S) -> None:
        """How late a periodic sleep wakes: the time the event loop was kept from its tasks."""
        while True:
            before = anyio.current_time()
            await anyio.sleep(every)
            self.loop_lag.observe(max(0.0, anyio.current_time() - before - every))

    async def serve_http(
        self,
        host: str,
        port: int,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """`GET /metrics` on `host:port` (loopback: `registry.parse_listen`) until cancelled. An
        address that cannot be bound is logged, and the manager serves on without it: the
        metrics watch the seats, and are never a reason to stop supervising them."""
        try:
            listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
        except OSError as exc:
            log.error(
                "metrics.listen_failed",
                host=host,
                port=port,
                error=str(exc),
                cure="free the port or pick another in cotal.toml [metrics] listen, then restart "
                "the manager; `cotal metrics` works meanwhile",
            )
            task_status.started()
            return
        clients = anyio.CapacityLimiter(MAX_CLIENTS)
        async with listener:
            log.info("metrics.listening", host=host, port=port)
            task_status.started()
            await listener.serve(lambda stream: self._answer(stream, clients))

    async def _answer(self, stream: anyio.abc.ByteStream, clients: anyio.CapacityLimiter) -> None:
        async with stream:
            if clients.available_tokens < 1:
                # Over the bound: closed at once rather than queued.
                return
            try:
                async with clients:
                    with anyio.move_on_after(REQUEST_TIMEOUT_S):
                        head = await _read_head(stream)
                        await stream.send(self._response(head))
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return
            except Exception as exc:
                # One client's request is never the manager's failure.
                log.warning("metrics.request_failed", error=repr(exc))

    def _response(self, head: bytes | None) -> bytes:
        if head is None:
            return _reply(431, "Request Header Fields Too Large", b"request head too large\n")
        line = head.split(b"\r\n", 1)[0]
        parts = line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return _reply(400, "Bad Request", b"bad request\n")
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if target != b"/metrics":
            return _reply(404, "Not Found", b"only /metrics is served here\n")
        if method != b"GET":
            return _reply(405, "Method Not Allowed", b"only GET\n", extra=b"Allow: GET\r\n")
        return _reply(200, "OK", self.text(), content_type=CONTENT_TYPE_PLAIN_0_0_4)


async def _read_head(stream: anyio.abc.ByteStream) -> bytes | None:
    """The request's head up to its blank line; None past `REQUEST_CAP` bytes."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > REQUEST_CAP:
            return None
        data += await stream.receive(4096)
    head = data.split(b"\r\n\r\n", 1)[0]
    return head if len(head) <= REQUEST_CAP else None


def _reply(
    status: int,
    reason: str,
    body: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    extra: bytes = b"",
) -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )
