"""The per-seat inbox bridge: the seat's `dm_` durable -> the connector's driver.

Acknowledgement discipline (record 4.2): a message is acked only after the harness reports a
clean terminal turn boundary for it. An error or abort is negatively acknowledged so it comes
back; an unknown end (the harness died mid-turn) is released only after the process is reaped,
so a possibly-live provider call cannot race its own redelivery.

The cut's fence closes the `DeliveryGate`: from then on no bridge starts a turn or a pull. A
message fetched but not yet handed to the harness is released at once (it comes back after the
resume, or after an abort reopens the gate), and the turn already in flight runs to its boundary,
which commit waits for before it stops the seat. A reply's id is derived from the message it
answers, so a turn redelivered after its reply was published (the ack was lost with a dead
manager) is answered once: the broker drops the second reply as a duplicate.

See docs/design.md (decision 4) and docs/architecture.md (the seat lifecycle).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc
import anyio.lowlevel
import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from connectors.base import Driver, TurnOutcome
from manager.broker.dm import publish_dm
from manager.broker.fence import FencedOut, WriterFence
from manager.broker.retry import TRANSIENT, riding_elections
from manager.daemon.process import SeatHandle
from protocol import names
from protocol.errors import DecodeError, Refusal
from protocol.instant import now_iso
from protocol.messages import DirectMessage, decode_dm

log = structlog.get_logger("cotal.delivery")

IN_PROGRESS_EVERY_S = 20.0
RETRY_DELAY_S = 1.0
# A pull request's life at the broker: an idle seat's long poll, and the first poll after the
# seat starts or finishes a turn, doubling up to the long one. A request is never cut short (see
# `_pull`), so whoever stops the seat waits out what is left of it; a cut or a stop that comes
# right after a turn or a start, as they usually do, then waits a tenth of a second, while a
# seat idle for longer costs the broker and the manager one request a second.
FETCH_WAIT_S = 1.0
FETCH_WAIT_FIRST_S = 0.1
ACK_S = 5.0


@dataclass
class Waiter:
    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: TurnOutcome | None = None
    attempts: int = 0


def reply_id(message_id: str) -> str:
    return hashlib.sha256(b"cotal-reply\0" + message_id.encode()).hexdigest()[:32]


class DeliveryGate:
    """Whether any seat may start a turn. One per manager; the cut closes it at the fence."""

    def __init__(self) -> None:
        self._open = True
        self._reopened = anyio.Event()
        self._reopened.set()

    @property
    def is_open(self) -> bool:
        return self._open

    def close(self) -> None:
        if self._open:
            self._open = False
            self._reopened = anyio.Event()

    def open(self) -> None:
        if not self._open:
            self._open = True
            self._reopened.set()

    async def wait_open(self) -> None:
        while not self._open:
            await self._reopened.wait()


@dataclass(frozen=True)
class Turn:
    """A message handed to the harness and not yet settled at the broker."""

    message_id: str
    started_at: str


class DeliveryBridge:
    def __init__(
        self,
        js: JetStreamContext,
        space: str,
        seat: str,
        uid: str,
        driver: Driver,
        handle: SeatHandle,
        waiters: dict[str, Waiter],
        *,
        fence: WriterFence,
        on_fenced: Callable[[], None],
        gate: DeliveryGate,
    ) -> None:
        self.js = js
        self.space = space
        self.seat = seat
        self.uid = uid
        self.driver = driver
        self.handle = handle
        self.waiters = waiters
        self.principal = names.principal(names.SEAT_OWNER, seat)
        self.delivered = 0
        self.fence = fence
        self.on_fenced = on_fenced
        self.gate = gate
        self.turn: Turn | None = None
        self._settled = anyio.Event()
        self._settled.set()

    async def wait_settled(self) -> None:
        """Return once no turn is in flight: the last one was acked, or released."""
        while self.turn is not None:
            await self._settled.wait()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        psub = await riding_elections(
            f"inbox of {self.seat}",
            lambda: self.js.pull_subscribe_bind(
                durable=names.dm_durable(names.SEAT_OWNER, self.seat, self.uid),
                stream=names.dm_stream(self.space),
            ),
        )
        task_status.started()
        try:
            # Once the harness is gone, a further pull would hand a redelivered message to a
            # subscription nobody reads, stranding it until ack_wait expires.
            wait = FETCH_WAIT_FIRST_S
            while not self.handle.reaped:
                await self.gate.wait_open()
                try:
                    msgs = await self._pull(psub, wait)
                except TRANSIENT as exc:
                    # The inbox has no leader for a moment (a cluster node died): the seat is
                    # fine and its mail is safe at the broker; wait for the election.
                    log.warning(
                        "delivery.broker_unavailable", seat=self.seat, error=type(exc).__name__
                    )
                    await anyio.sleep(FETCH_WAIT_S)
                    continue
                wait = FETCH_WAIT_FIRST_S if msgs else min(2 * wait, FETCH_WAIT_S)
                for msg in msgs:
                    await self._deliver(msg)
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                await psub.unsubscribe()

    async def _pull(self, psub: JetStreamContext.PullSubscription, wait: float) -> list[Msg]:
        """One pull request, seen through to its end at the broker even when this bridge is
        cancelled (the harness exited, the manager stops).

        The durable hands out one unacknowledged message at a time, so a message the broker
        sends to a request whose subscription is already gone strands the whole inbox until
        ack_wait. Waiting the request out here, bounded by its expiry, is what lets the cut's
        fence answer at once instead of waiting out every seat's pull: a message it brings
        after the fence is released, never run.
        """
        with anyio.CancelScope(shield=True):
            try:
                msgs = await psub.fetch(1, timeout=wait)
            except nats.errors.TimeoutError:
                return []
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                for msg in msgs:
                    log.info("delivery.released", seat=self.seat, reason="bridge stopping")
                    with contextlib.suppress(*TRANSIENT):
                        await msg.nak()
            raise
        return msgs

    async def _deliver(self, msg: Msg) -> None:
        try:
            dm = decode_dm(msg.data)
        except DecodeError as exc:
            # A poison message would block this seat's inbox forever; terminate it, loudly.
            log.error("delivery.malformed", seat=self.seat, error=exc.message)
            with contextlib.suppress(*TRANSIENT):
                await msg.term()
            return
        # Checked with no await before the turn is recorded, so a fence set meanwhile is seen.
        if not self.gate.is_open:
            log.info("delivery.released", seat=self.seat, id=dm.id, reason="fenced for a cut")
            with contextlib.suppress(*TRANSIENT):
                await msg.nak()
            return
        waiter = self.waiters.get(dm.id)
        if waiter is not None:
            waiter.attempts += 1
        outcome: TurnOutcome | None = None
        self.turn, self._settled = Turn(dm.id, now_iso()), anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._keep_in_progress, msg)
                outcome = await self.driver.prompt(dm.text, message_id=dm.id)
                tg.cancel_scope.cancel()
        finally:
            # The seat may be stopping while the turn ends: settle in every case, shielded,
            # or a finished turn is neither acked nor released and waits out ack_wait.
            with anyio.CancelScope(shield=True):
                if outcome is None or outcome.status == "unknown":
                    if outcome is not None:
                        log.warning(
                            "delivery.unknown_end", seat=self.seat, id=dm.id, detail=outcome.detail
                        )
                    await self._release_after_exit(msg, dm.id)
                elif await self._settle(msg, dm, outcome) and waiter is not None:
                    waiter.outcome = outcome
                    waiter.done.set()
                self.turn = None
                self._settled.set()

    async def _keep_in_progress(self, msg: Msg) -> None:
        while True:
            await anyio.sleep(IN_PROGRESS_EVERY_S)
            await msg.in_progress()

    async def _release_after_exit(self, msg: Msg, dm_id: str) -> None:
        with anyio.move_on_after(15.0):
            await self.handle.exited()
            try:
                await msg.nak()
            except Exception as exc:  # the broker redelivers after ack_wait anyway
                log.warning("delivery.nak_failed", seat=self.seat, id=dm_id, error=str(exc))
            log.info("delivery.released", seat=self.seat, id=dm_id, reason="seat stopped mid-turn")

    async def _settle(self, msg: Msg, dm: DirectMessage, outcome: TurnOutcome) -> bool:
        """Ack a clean turn whose reply the broker accepted (True); otherwise release it."""
        if outcome.status == "ok":
            reply = DirectMessage(
                id=reply_id(dm.id),
                sender=self.principal,
                recipient=dm.sender,
                text=outcome.reply,
                sent_at=now_iso(),
                in_reply_to=dm.id,
            )
            try:
                await publish_dm(self.js, self.space, reply, publish=self.fence.publish)
            except FencedOut:
                # Custody moved: this turn's reply belongs to nobody here. Release the message
                # for the new holder and get the seat stopped.
                log.error("delivery.fenced", seat=self.seat, id=dm.id)
                self.on_fenced()
                with contextlib.suppress(*TRANSIENT):
                    await msg.nak()
                return False
            except Exception as exc:
                log.warning(
                    "delivery.reply_publish_failed", seat=self.seat, id=dm.id, error=str(exc)
                )
            try:
                await riding_elections(
                    f"ack for {self.seat}", lambda: msg.ack_sync(timeout=ACK_S), attempt_s=ACK_S + 1
                )
            except Refusal as exc:
                # Unacknowledged, the message comes back after ack_wait: at-least-once, never lost.
                log.warning("delivery.ack_failed", seat=self.seat, id=dm.id, error=exc.message)
                return True
            self.delivered += 1
            log.info("delivery.acked", seat=self.seat, id=dm.id, seq=msg.metadata.sequence.stream)
            return True
        log.warning(
            "delivery.retained",
            seat=self.seat,
            id=dm.id,
            status=outcome.status,
            detail=outcome.detail,
        )
        try:
            await msg.nak(delay=RETRY_DELAY_S)
        except TRANSIENT as exc:
            log.warning("delivery.nak_failed", seat=self.seat, id=dm.id, error=type(exc).__name__)
        return False
