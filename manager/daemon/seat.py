"""A seat in the Manager's table, and the narrow view of the table the cut and the resume get.

A `Seat` carries its lifecycle (`protocol.lifecycle`) and its current `Incarnation` (the
process one launch started); only the Manager and its incarnations move the lifecycle.
`SeatOwner` is everything Preservation and Resumption may ask of the Manager: they read the
table, and they ask the owner to adopt, launch, stop and remove seats, so the table has one
writer (gunicorn's arbiter) and neither of them imports the Manager.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import anyio
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from connectors.base import Connector, ContinuityClass, Driver, LaunchSpec
from manager import registry
from manager.broker.fence import WriterFence
from manager.daemon.delivery import DeliveryBridge, DeliveryGate
from manager.daemon.events import Events
from manager.daemon.metrics import Metrics
from manager.daemon.process import SeatHandle
from manager.daemon.usage import UsageLedger
from manager.registry import FileConfig, PriceConfig
from manager.workspace.identity import InstanceIdentity
from manager.workspace.layout import Layout
from protocol import control, names
from protocol.errors import DecodeError, Refusal
from protocol.lifecycle import SeatEvent, SeatLifecycle, SeatState
from protocol.maintenance import Maintenance
from protocol.refusals import Code
from protocol.session import SessionPointer, decode_pointer


@dataclass(eq=False)
class Incarnation:
    """One process of a seat: what one launch started. The next launch replaces it whole, so
    a handle, a driver or a bridge is always its own process's, never a predecessor's. What
    outlives a process (the session, the restart budget, the last exit) stays on the `Seat`."""

    spec: LaunchSpec
    handle: SeatHandle
    # What the connector says about this launch for people (`ps --wide`); it reads no secret.
    described: dict[str, str] = field(default_factory=dict)
    driver: Driver | None = None
    bridge: DeliveryBridge | None = None
    # Set once its run task has finished its cleanup.
    run_done: anyio.Event = field(default_factory=anyio.Event)


@dataclass(eq=False)
class RecordSlot:
    """Which of the seat's records is on disk (manager/daemon/seatfile.py): `taken` counts the
    records asked for, `landed` is the number of the newest one written, or of the last one
    asked for before a delete."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    taken: int = 0
    landed: int = 0


@dataclass(eq=False)
class Seat:
    name: str
    agent: str
    uid: str
    cwd: Path
    connector: Connector
    continuity: ContinuityClass
    model: str | None
    started_at: str
    pointer_path: Path
    custody_revision: int | None = None
    generation_at_broker: int = 0
    lifecycle: SeatLifecycle = field(default_factory=SeatLifecycle)
    # The current incarnation: replaced by each launch, so an exit report names its own. None
    # until this manager launches the seat (a seat entered from its record has none).
    current: Incarnation | None = None
    session_id: str | None = None
    fence: WriterFence | None = None
    # Why the seat is not running, when the Manager refused to relaunch it.
    reason: str | None = None
    # False for a seat whose durable and custody record belong to someone else now (custody
    # moved, or a cut holds it): removing it from the table then deprovisions nothing.
    footprint_owned: bool = True
    crashes: list[float] = field(default_factory=list)
    restarts: int = 0
    # How the last process of this seat ended (`exit_text`), kept across relaunches.
    last_exit: str | None = None
    # One stopper at a time: a second waits for the first's proof instead of racing it.
    stop_lock: anyio.Lock = field(default_factory=anyio.Lock)
    record_slot: RecordSlot = field(default_factory=RecordSlot)
    # The seats this one may send to (`--allow-send`; `*` for every other seat), fixed at spawn
    # and kept by its seat record and its resume entry, never read from `cotal.toml` again.
    allow_send: tuple[str, ...] = ()
    # The channels it gets posts of as turns (`--subscribe`) and may post to (`--allow-post`),
    # fixed at spawn and kept as `allow_send` is.
    subscribe: tuple[str, ...] = ()
    allow_post: tuple[str, ...] = ()
    # The launch profile revision it was spawned or adopted under; every launch re-derives it
    # from `cotal.toml` and refuses `profile-drift` when it changed (`Incarnations.opts`).
    profile: str | None = None
    # Told each state the seat moves into (the Manager's lifecycle events, `cotal events`).
    observer: Callable[[Seat, SeatState], None] | None = None
    # What its turns used (manager/daemon/usage.py): read from its session store when this
    # manager first serves it, kept across its relaunches.
    usage: UsageLedger | None = None
    # When its turns here ended (the last hour's), and the budget limits an operator lifted
    # (manager/daemon/budget.py); this manager's alone.
    turn_ends: list[datetime] = field(default_factory=list)
    budget_lifts: set[str] = field(default_factory=set)

    @property
    def state(self) -> SeatState:
        return self.lifecycle.state

    @property
    def handle(self) -> SeatHandle | None:
        return self.current.handle if self.current is not None else None

    @property
    def spec(self) -> LaunchSpec | None:
        return self.current.spec if self.current is not None else None

    @property
    def bridge(self) -> DeliveryBridge | None:
        return self.current.bridge if self.current is not None else None

    @property
    def driver(self) -> Driver | None:
        return self.current.driver if self.current is not None else None

    def apply(self, event: SeatEvent) -> SeatState:
        """The Manager's only way to move a seat; an illegal event raises `IllegalTransition`."""
        before = self.lifecycle.state
        after = self.lifecycle.apply(event)
        if after != before and self.observer is not None:
            self.observer(self, after)
        return after

    @property
    def recovery_armed(self) -> bool:
        """A launch proved the connector's pointer: from then on the pointer, not the recorded
        launch value, names the seat's live session."""
        return (
            self.session_id is not None
            and self.spec is not None
            and self.spec.session_pointer_path is not None
        )

    def row(
        self,
        instance_id: str,
        prices: Mapping[str, PriceConfig] | None = None,
        budget: str | None = None,
    ) -> control.SeatRow:
        turn = self.bridge.turn if self.bridge is not None and self.state == "running" else None
        used = self.usage.totals(prices or {}) if self.usage is not None else None
        return control.SeatRow(
            name=self.name,
            agent=self.agent,
            state=self.state,
            pid=self.handle.pid if self.handle and self.state == "running" else None,
            cwd=str(self.cwd),
            lifecycle_uid=self.uid,
            instance_id=instance_id,
            session_id=self.session_id,
            continuity=self.continuity,
            restarts=self.restarts,
            started_at=self.started_at,
            durable=names.dm_durable(names.SEAT_OWNER, self.name, self.uid),
            busy=turn is not None,
            turn_started_at=turn.started_at if turn is not None else None,
            reason=self.reason,
            last_exit=self.last_exit,
            permission_mode=(
                self.current.described.get("permissionMode") if self.current is not None else None
            ),
            isolation=self.handle.isolation if self.handle is not None else None,
            allow_send=list(self.allow_send),
            subscribe=list(self.subscribe),
            allow_post=list(self.allow_post),
            tokens_in=used.tokens_in if used is not None else None,
            tokens_out=used.tokens_out if used is not None else None,
            cost_usd=used.cost_usd if used is not None else None,
            budget=budget,
        )


def read_pointer(path: Path) -> SessionPointer:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        data = os.read(fd, 16 * 1024)
    finally:
        os.close(fd)
    return decode_pointer(data, where=f"connector session state {path}")


def session_to_reopen(seat: Seat) -> tuple[str | None, str | None]:
    """(continue_session, fork_from) for a relaunch under the seat's uid: the pointer names the
    live session, as for a crash restart. A seat whose class promises a session and whose pointer
    cannot name it is refused rather than silently started fresh."""
    if seat.continuity not in ("exact", "fork"):
        return None, None
    try:
        pointer = read_pointer(seat.pointer_path)
    except (FileNotFoundError, DecodeError) as exc:
        raise Refusal(
            Code.SESSION_UNKNOWN,
            f"{seat.name}'s session pointer {seat.pointer_path} cannot be read ({exc})",
            f"`cotal rm {seat.name}`; its session cannot be reopened",
        ) from None
    if pointer.status != "running":
        raise Refusal(
            Code.DELIBERATE_QUIT,
            f"{seat.name}'s harness quit its session deliberately; there is no session to reopen",
            f"`cotal rm {seat.name}`, then spawn it again",
        )
    if seat.continuity == "exact":
        return pointer.session_id, None
    return None, pointer.session_id


class SeatOwner(Protocol):
    """What the cut and the resume may ask of the Manager. Reads are views; every change to
    the seat table or a seat's lifecycle is one of the owner's methods."""

    @property
    def space(self) -> str: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def identity(self) -> InstanceIdentity: ...

    @property
    def config(self) -> FileConfig:
        """The root's `cotal.toml` as the manager read it at start."""
        ...

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def maintenance(self) -> Maintenance: ...

    @property
    def seats(self) -> Mapping[str, Seat]: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def delivery_gate(self) -> DeliveryGate: ...

    @property
    def metrics(self) -> Metrics:
        """The manager's registry: the cut counts itself and marks the seats it stopped."""
        ...

    @property
    def events(self) -> Events:
        """The manager's lifecycle events: the cut's outcome, one event per seat it cut."""
        ...

    def custody_bucket(self) -> KeyValue: ...

    def presence_bucket(self) -> KeyValue: ...

    async def drain(self) -> None: ...

    async def drain_seats(self, seats: frozenset[str]) -> None:
        """Until no lifecycle work admitted on these seats is left."""
        ...

    def lifecycle(self, what: str, seat: str | None = None) -> AbstractAsyncContextManager[None]:
        """Admit one piece of lifecycle work past the fence and count it until it ends."""
        ...

    def adopt(self, seat: Seat) -> None:
        """Reserve the seat's slot in the table (refusing a duplicate name) before any await."""
        ...

    async def launch(
        self, seat: Seat, *, continue_session: str | None = None, resume: str | None = None
    ) -> None:
        """Fence the seat's writes, start its process and prove it ready."""
        ...

    async def stop_and_prove(self, seat: Seat, *, graceful: bool) -> None:
        """Stop the seat and prove the exit, or raise `Refusal("stop-unproven")`."""
        ...

    def remove(self, seat: Seat) -> None:
        """Drop the seat from the table, deprovisioning nothing."""
        ...

    async def forget_presence(self, seat: Seat) -> None:
        """Delete the seat's presence now (a stopped seat a cut carries is live nowhere)."""
        ...

    def hand_over(self, seat: Seat) -> None:
        """The seat is stopped and a cut carries it from here: forget its record on disk, so a
        later manager of this root does not relaunch it behind the checkpoint's back."""
        ...


def profiled_settings(seat: Seat, config: FileConfig) -> tuple[dict[str, Any], str | None]:
    """This root's settings for the seat's agent in `config` (read from `cotal.toml` when it
    is asked: a launch or a cut's plan), and the model they resolve, once they prove to be the
    launch profile the seat was spawned or adopted under. A relaunch (after a crash, a stop,
    or this manager's own restart) never runs a seat under an edited profile, which would be a
    different seat wearing a recovered transcript; and a cut never records a profile the seat
    did not run under. A seat not yet launched takes the revision these settings make."""
    settings = dict(registry.agent_settings(config, seat.agent))
    model = seat.model or settings.get("model")
    now = registry.profile_digest(
        seat.agent, model, settings, seat.allow_send, seat.subscribe, seat.allow_post
    )
    if seat.profile is None:
        seat.profile = now
    elif seat.profile != now:
        raise Refusal(
            Code.PROFILE_DRIFT,
            f"seat {seat.name}: this root's launch profile for {seat.agent} is now revision "
            f"{now}, not the {seat.profile} the seat was started under (cotal.toml changed)",
            f"put cotal.toml's [agents.{seat.agent}] back as it was (its model, permission "
            f"and sandbox settings), then `cotal start {seat.name}` (after `cotal stop "
            f"{seat.name}` if it shows failed), or `cotal rm {seat.name}` and spawn it again "
            "under the new profile; its inbox and session are kept",
        )
    return settings, model
