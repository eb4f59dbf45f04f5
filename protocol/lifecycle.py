"""A seat's lifecycle, as a table: every rule for moving a seat between states, and no I/O.

The Manager performs the effects around a transition and is the only caller of
`SeatLifecycle.apply`; the diagram and the reasons for each edge are in docs/design.md,
"The core modules, in detail".
"""

from __future__ import annotations

import signal
from typing import Annotated, Final, Literal, get_args

import msgspec

from protocol.codec import decode_json, encode_json
from protocol.inventory import AbsPath, Instant, LifecycleUid, SeatName
from protocol.maintenance import IllegalTransition
from protocol.meshcall import AllowSend, Channels

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
    "ready",
    "exit",
    "restart",
    "retire",
    "fail",
    "stop",
    "proven",
    "unproven",
    "reaped",
    "evict",
    "start",
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
    # Kept with its footprint: the operator's `start` brings it back, `rm` deprovisions it.
    "stopped": {"stop": "stopped", "proven": "stopped", "evict": "evicting", "start": "restarting"},
    "unproven": {"stop": "stopping", "reaped": "stopped", "evict": "evicting"},
    "evicting": {"stop": "evicting", "proven": "evicted", "unproven": "evicted"},
    "evicted": {"stop": "evicted", "proven": "evicted", "unproven": "evicted"},
}

# A deliberate stop owns the exit: no crash restart and no deprovision may follow from it; only
# the operator's `start` of a `stopped` seat leads back.
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


# -- the persisted seat record -------------------------------------------------------------------

SEAT_RECORD_CAP: Final = 16 * 1024
Continuity = Literal["exact", "fork", "fresh", "drain-only"]
Label = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,128}\Z")]
Text = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
ExitText = Annotated[str, msgspec.Meta(min_length=1, max_length=32)]


class SeatRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One seat of a manager's table, as the next manager of the root needs it to re-adopt it.

    Written on every spawn, relaunch and stop, removed with the seat. `state` is the seat's
    lifecycle state when written: a record left in a deliberate state names a stop the dead
    manager had begun, which its successor does not undo by relaunching: it keeps the seat
    `stopped` until the operator starts or removes it. `last_exit` is how the last process of
    the seat ended (`lastExit` in `ps`). `allow_send` is its `--allow-send`, fixed at spawn (or
    carried by its resume entry), so a successor never reads it from `cotal.toml` again: a
    record written before the field existed names none. `subscribe` and `allow_post` are its
    `--subscribe` and `--allow-post`, kept the same way.
    """

    version: Literal[1]
    name: SeatName
    agent: Label
    lifecycle_uid: LifecycleUid
    cwd: AbsPath
    model: Text | None
    continuity: Continuity
    generation: Annotated[int, msgspec.Meta(ge=0)]
    custody_revision: Annotated[int, msgspec.Meta(ge=0)] | None
    pointer_path: AbsPath
    started_at: Instant
    session_id: Text | None
    restarts: Annotated[int, msgspec.Meta(ge=0)]
    state: SeatState
    reason: Text | None = None
    last_exit: ExitText | None = None
    allow_send: AllowSend = []
    subscribe: Channels = []
    allow_post: Channels = []
    # The launch profile revision the seat was spawned or adopted under (`registry.profile_
    # digest`): every relaunch re-derives it from `cotal.toml` and refuses one that changed. A
    # record written before the field existed names none, and takes the first relaunch's.
    profile: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")] | None = None


def exit_text(returncode: int | None) -> str | None:
    """How a reaped process ended, as `ps` shows it: its exit code (`0`, `3`) or the signal that
    killed it (`SIGTERM`)."""
    if returncode is None:
        return None
    if returncode >= 0:
        return str(returncode)
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def encode_seat_record(record: SeatRecord) -> bytes:
    return encode_json(record)


def decode_seat_record(data: bytes, *, where: str) -> SeatRecord:
    return decode_json(data, SeatRecord, what=f"seat record {where}", cap=SEAT_RECORD_CAP)
