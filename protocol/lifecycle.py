"""A seat's lifecycle, as a table.

Two rules, borrowed from h11. Everything that decides whether a seat may move from one state to
another lives in this module; the Manager performs the effects around a transition (launching,
signalling, reaping, deprovisioning) and is the only caller of `SeatLifecycle.apply`. And
nothing here performs I/O, so the table is driven directly by tests without a daemon.

Theory of operation
-------------------

    starting --ready--> running --exit--> exited --restart--> restarting --ready--> running
                                             |                    |
                                             +--retire--> retired +--exit--> exited
                                             +--fail----> failed  +--fail--> failed

    (any live state) --stop--> stopping --proven--> stopped
                                   |
                                   +--unproven--> unproven --reaped--> stopped

    (any live state) --evict--> evicting --proven | unproven--> evicted

`exit` is the Manager's reading of an exit nobody asked for (a crash, a launch that never became
ready); only an `exited` seat may be restarted, which is what keeps a crash restart from racing
a deliberate stop or a cut. A stop is deliberate: from `stopping` on, the exit belongs to the
stopper, and neither a restart nor a deprovision may follow from it. `unproven` is a stop whose
reaped exit did not arrive by its deadline; the Manager still holds the process, and the later
reap (`reaped`) is what finally proves it. `evicting` is a stop the custody watcher demanded:
its end is `evicted` whether or not the exit was proven in time, because the seat belongs to
another holder now and is never relaunched here.

A second stopper of the same seat joins the first: `stop` and `proven` are self-loops once the
stop has begun, so a shutdown racing an eviction or a cut does not turn into an illegal event.

`retired` (a crash loop) and `evicted` are terminal. A seat leaves the Manager's table without a
state of its own: removal is the table's business, not the lifecycle's.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from protocol.maintenance import IllegalTransition

SeatState = Literal[
    "starting",
    "running",
    "exited",
    "restarting",
    "failed",
    "retired",
    "stopping",
    "stopped",
    "unproven",
    "evicting",
    "evicted",
]
SeatEvent = Literal[
    "ready", "exit", "restart", "retire", "fail", "stop", "proven", "unproven", "reaped", "evict"
]

SEAT_STATES: Final[tuple[SeatState, ...]] = get_args(SeatState)
SEAT_EVENTS: Final[tuple[SeatEvent, ...]] = get_args(SeatEvent)

SEAT_TRANSITIONS: Final[dict[SeatState, dict[SeatEvent, SeatState]]] = {
    "starting": {"ready": "running", "exit": "exited", "stop": "stopping", "evict": "evicting"},
    "running": {"exit": "exited", "stop": "stopping", "evict": "evicting"},
    "exited": {
        "restart": "restarting",
        "retire": "retired",
        "fail": "failed",
        "stop": "stopping",
        "evict": "evicting",
    },
    "restarting": {
        "ready": "running",
        # The relaunch ended without a live process (a refused launch, a broker away): the seat
        # waits in `exited` for the Manager's next decision.
        "exit": "exited",
        "fail": "failed",
        "stop": "stopping",
        "evict": "evicting",
    },
    # Kept with its footprint so an operator can stop it; never relaunched by itself.
    "failed": {"stop": "stopping", "evict": "evicting"},
    "retired": {},
    "stopping": {
        "stop": "stopping",
        "proven": "stopped",
        "unproven": "unproven",
        "evict": "evicting",
    },
    "stopped": {"stop": "stopped", "proven": "stopped", "evict": "evicting"},
    "unproven": {"stop": "stopping", "reaped": "stopped", "evict": "evicting"},
    "evicting": {"stop": "evicting", "proven": "evicted", "unproven": "evicted"},
    "evicted": {"stop": "evicted", "proven": "evicted", "unproven": "evicted"},
}

# A deliberate stop owns the exit: no restart and no deprovision may follow from it.
DELIBERATE_STATES: Final[frozenset[SeatState]] = frozenset(
    {"stopping", "stopped", "unproven", "evicting", "evicted"}
)


class SeatLifecycle:
    """Applies `SEAT_TRANSITIONS`; an event the state does not allow is an `IllegalTransition`."""

    def __init__(self, state: SeatState = "starting") -> None:
        self.state: SeatState = state

    def allows(self, event: SeatEvent) -> bool:
        return event in SEAT_TRANSITIONS[self.state]

    def apply(self, event: SeatEvent) -> SeatState:
        target = SEAT_TRANSITIONS[self.state].get(event)
        if target is None:
            raise IllegalTransition("seat", self.state, event)
        self.state = target
        return target

    @property
    def deliberate(self) -> bool:
        return self.state in DELIBERATE_STATES
