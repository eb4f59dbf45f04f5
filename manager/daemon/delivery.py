"""The per-seat inbox bridge: the seat's `dm_` durable -> the connector's driver.

Acknowledgement discipline (record 4.2): a message is acked only after the harness reports a
clean terminal turn boundary for it. Any other end (an error, an abort, an unknown reason, no
output, the harness dying) is ambiguous: a provider call may still be live. The record's recovery
is a restart, which ends that call: the manager relaunches the harness into its own session
(the crash restart, within its restart budget), and the message is released only once the old
process is reaped, so the call cannot race its own redelivery. A harness the manager will not
restart (budget spent, or a session it cannot reopen) gets `UNRESTARTED_RETRY_S` instead.

A turn whose model provider did not serve it (the driver's `provider-unavailable` end: down,
unreachable, rate limited) failed through no fault of its own and ended no live call, so it is
neither held against its message nor a reason to restart the harness: the bridge keeps the
message and hands it to the same harness again after a backoff (`Backoff`, `[delivery]` in
`cotal.toml`), for as long as the outage lasts. The inbox waits behind it, in order, as it would
for a long turn.

Each message is run at most `max_deliveries` times (`[delivery]` in `cotal.toml`): one whose
delivery at the cap ends badly, or that comes back past it, or that does not decode, moves to the
seat's dead letters (`manager/broker/deadletter.py`) and is terminated in the inbox, so the
inbox moves on; it is kept, never lost. A message delivered again is handed to the harness with
its delivery count, so the agent is told an earlier delivery may have acted already.

The cut's fence closes the `DeliveryGate`: from then on no bridge starts a turn or a pull, and
nothing moves to dead letters (the cut reads the dead letters it carries beside the inbox once
the seat is stopped, and a turn the cut ends is not held against its message). A message
fetched but not yet handed to the harness is released at once (it comes back after the resume,
or after an abort reopens the gate), and the turn already in flight runs to its boundary, which
commit waits for before it stops the seat. A reply's id is derived from the message it answers,
so a turn redelivered after its reply was published (the ack was lost with a dead manager) is
answered once: the broker drops the second reply as a duplicate.

A message another seat sent (a manager's publish of that seat's call, which alone carries the
`Cotal-Sender` header naming it: `protocol.meshcall.seat_sender`) is handed to the harness
framed by a first line naming the sender (`protocol.meshcall.framed`), and its turn's reply is
published to the operator, not to the sender: a reply to a seat would be a send around the
replier's `--allow-send`, and two seats answering each other's answers would never stop. A seat
answers another seat by sending (docs/mesh.md). Any other sender is answered as `cotal send`
is, to itself.

A seat subscribed to channels (`--subscribe`) reads each through its own `chathist_` durable
beside its inbox, one message at a time from each, in turn, under the same discipline: a post
is handed framed by a first line naming the channel and the posting seat
(`protocol.meshcall.framed_post`), its turn's reply goes to the operator, and it is acked at
the clean terminal boundary of that turn. Each subscriber's turn for a post is keyed by its own
uid and the post's id (`protocol.meshcall.post_turn_id`), so two subscribers' replies are two
messages, not one dropped as the other's duplicate. A seat's own posts are not its turns. A post
that cannot run (malformed, or past the delivery cap) is given up in that frontier only: the
channel keeps it in its history, and a channel has no dead letters.

See docs/design.md (decision 4), docs/architecture.md (the seat lifecycle) and
docs/operations.md (Dead letters).
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc
import anyio.lowlevel
import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from connectors.base import PROVIDER_UNAVAILABLE, Driver, TurnOutcome
from manager import failpoint
from manager.broker import channels as chan
from manager.broker import deadletter
from manager.broker.dm import publish_dm
from manager.broker.fence import FencedOut, WriterFence
from manager.broker.retry import TRANSIENT, riding_elections
from manager.daemon.budget import SeatBudget
from manager.daemon.events import Events
from manager.daemon.metrics import Metrics, TurnEnd
from manager.daemon.process import SeatHandle
from manager.daemon.usage import UsageLedger, now_record
from manager.registry import DeliveryConfig
from protocol import deadletter as dlp
from protocol import meshcall, names
from protocol.deadletter import DEFAULT_MAX_DELIVERIES, DeadLetterMeta, prior_deliveries
from protocol.errors import DecodeError, Refusal
from protocol.events import EventDetail
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
# A failed turn whose harness is not restarted: time for a provider call that may still be live
# to end before the message is handed to the same process again.
UNRESTARTED_RETRY_S = 5.0
# How long a settlement waits for a harness that is being ended to be reaped.
EXIT_WAIT_S = 15.0
# How often a backoff looks whether a cut's fence or a stop has ended it: a cut must not wait
# out a minute's backoff to find the seat idle.
BACKOFF_POLL_S = 0.1
# Past this many doublings the wait is at its maximum anyway; the bound keeps the power finite.
BACKOFF_STEPS_MAX = 64


@dataclass(frozen=True)
class Backoff:
    """Temporal's retry policy for a turn its provider did not serve: the first wait
    `initial_s`, each next one `coefficient` times the last, never above `max_s`, each drawn
    from its last `jitter` fraction, so seats that met the same outage do not return in step."""

    initial_s: float = dlp.DEFAULT_BACKOFF_INITIAL_S
    coefficient: float = dlp.DEFAULT_BACKOFF_COEFFICIENT
    max_s: float = dlp.DEFAULT_BACKOFF_MAX_S
    jitter: float = dlp.DEFAULT_BACKOFF_JITTER

    @classmethod
    def of(cls, config: DeliveryConfig) -> Backoff:
        return cls(
            config.backoff_initial_s,
            config.backoff_coefficient,
            config.backoff_max_s,
            config.backoff_jitter,
        )

    def delay(self, attempt: int, draw: Callable[[], float] = random.random) -> float:
        """The wait before try `attempt + 2` (`attempt` 0 is the wait after the first)."""
        steps = min(max(0, attempt), BACKOFF_STEPS_MAX)
        base = min(self.max_s, self.initial_s * self.coefficient**steps)
        return base * (1.0 - self.jitter * draw())


@dataclass
class Waiter:
    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: TurnOutcome | None = None
    attempts: int = 0


def reply_id(message_id: str) -> str:
    return hashlib.sha256(b"cotal-reply\0" + message_id.encode()).hexdigest()[:32]


class DeliveryGate:
    """Whether a seat may start a turn or move a message to its dead letters: the manager's one
    gate. A cut's fence closes it for every seat (a whole cut) or for the seats it cuts (a cut
    of some seats); each bridge asks it for its own seat through a `SeatGate`.

    It also counts the moves to dead letters under way, so the cut's check that no seat holds a
    dead letter (made before the fence) cannot miss one that lands between its read and the
    fence: `quiet` waits until none is under way and reports how many ever began."""

    def __init__(self) -> None:
        self._all_closed = False
        self._closed: set[str] = set()
        # Replaced at every opening, after the old one is set: a waiter holds the event of the
        # moment it began waiting, so a later close can never strand it.
        self._opened = anyio.Event()
        self._burying = 0
        self.burials_begun = 0
        self._quiet = anyio.Event()
        self._quiet.set()

    def is_open(self, seat: str) -> bool:
        return not self._all_closed and seat not in self._closed

    def close(self, seats: frozenset[str] | None = None) -> None:
        """Closed for these seats, or for every seat (None)."""
        if seats is None:
            self._all_closed = True
        else:
            self._closed |= seats

    def open(self, seats: frozenset[str] | None = None) -> None:
        """Open again for these seats, or for every seat (None): what one close shut."""
        if seats is None:
            self._all_closed = False
        else:
            self._closed -= seats
        opened, self._opened = self._opened, anyio.Event()
        opened.set()

    async def wait_open(self, seat: str) -> None:
        while not self.is_open(seat):
            await self._opened.wait()

    def begin_burial(self, seat: str) -> bool:
        """Checked and counted in one synchronous step; False once the gate is closed."""
        if not self.is_open(seat):
            return False
        self._burying += 1
        self.burials_begun += 1
        if self._burying == 1:
            self._quiet = anyio.Event()
        return True

    def end_burial(self) -> None:
        self._burying -= 1
        if self._burying == 0:
            self._quiet.set()

    @property
    def burying(self) -> bool:
        return self._burying > 0

    async def quiet(self) -> int:
        while self._burying:
            await self._quiet.wait()
        return self.burials_begun


class SeatGate:
    """One seat's view of the manager's gate: a turn starts, and a message moves to the dead
    letters, only while it is open for this seat."""

    def __init__(self, gate: DeliveryGate, seat: str) -> None:
        self.gate = gate
        self.seat = seat

    @property
    def is_open(self) -> bool:
        return self.gate.is_open(self.seat)

    async def wait_open(self) -> None:
        await self.gate.wait_open(self.seat)

    def begin_burial(self) -> bool:
        return self.gate.begin_burial(self.seat)

    def end_burial(self) -> None:
        self.gate.end_burial()


@dataclass(frozen=True)
class Turn:
    """A message handed to the harness and not yet settled at the broker."""

    message_id: str
    started_at: str


def deliveries(msg: Msg) -> tuple[int, int]:
    """(this publish's deliveries, all of the message's deliveries): the cap counts the first, the
    harness is told the second, which includes those before a dead letter was put back."""
    this = max(1, int(msg.metadata.num_delivered or 1))
    return this, prior_deliveries(msg.headers) + this


def _turn_end(outcome: TurnOutcome | None) -> TurnEnd:
    """How a turn ended, as the metrics count it: a clean boundary, a turn its provider did
    not serve, one cut off by the harness's exit or a stop, or any other end."""
    if outcome is None:
        return "cut-off"
    if outcome.status == "ok":
        return "ok"
    return "unserved" if outcome.status == PROVIDER_UNAVAILABLE else "failed"


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
        gate: SeatGate,
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
        backoff: Backoff = Backoff(),
        on_ambiguous: Callable[[str], bool] = lambda _detail: False,
        deliberate: Callable[[], bool] = lambda: False,
        dead_counts: dict[str, int] | None = None,
        channels: tuple[str, ...] = (),
        metrics: Metrics | None = None,
        events: Events | None = None,
        usage: UsageLedger | None = None,
        budget: SeatBudget | None = None,
        before_ack: Callable[[], Awaitable[None]] | None = None,
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
        self.max_deliveries = max_deliveries
        self.backoff = backoff
        # The manager's decision: end this harness and relaunch it into its session (True), or
        # not (budget spent, a session it cannot reopen, the seat not running).
        self.on_ambiguous = on_ambiguous
        # Whether the seat is being stopped on purpose (an operator's stop, a cut, an eviction):
        # a turn cut short by that is not held against its message.
        self.deliberate = deliberate
        self.dead_counts = dead_counts if dead_counts is not None else {}
        self.channels = channels
        # The manager's registry: deliveries, turns and dead letters are counted where they
        # happen (manager/daemon/metrics.py).
        self.metrics = metrics
        # The manager's lifecycle events (`cotal events`): a turn's start and end, a dead letter.
        self.events = events
        # The seat's usage ledger (manager/daemon/usage.py): each turn's tokens, as reported.
        self.usage = usage
        # Its budget (manager/daemon/budget.py): no next message while it is reached.
        self.budget = budget
        # A failover seat's standing checkpoint, taken after a clean turn's reply and before
        # its message is acknowledged (manager/daemon/standing.py): acknowledged means stored.
        self.before_ack = before_ack
        # The channel the message being delivered came from (None: the inbox).
        self._source: str | None = None
        self.turn: Turn | None = None
        # The sends the turn in flight has made: the next one's ordinal in its message ids.
        self.sends = 0
        self._settled = anyio.Event()
        self._settled.set()

    def claim_send(self) -> tuple[str, int] | None:
        """(the inbound message id of the turn in flight, this send's ordinal in it), or None
        when no turn is in flight. Claimed in the order the harness made its calls, so a turn
        that runs again makes the same claims."""
        if self.turn is None:
            return None
        ordinal, self.sends = self.sends, self.sends + 1
        return self.turn.message_id, ordinal

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
        sources: list[tuple[str | None, JetStreamContext.PullSubscription]] = [(None, psub)]
        try:
            for name in self.channels:
                sources.append((name, await self._bind_channel(name)))
            task_status.started()
            await self._count_dead_letters()
            # Once the harness is gone, a further pull would hand a redelivered message to a
            # subscription nobody reads, stranding it until ack_wait expires.
            wait = FETCH_WAIT_FIRST_S
            while not self.handle.reaped:
                got = False
                # One pull from each source in turn: an idle seat's long poll on one source
                # delays another's message by at most FETCH_WAIT_S, and no source starves.
                for channel, sub in sources:
                    if self.budget is not None:
                        # At its budget, the seat's mail stays queued at the broker.
                        await self.budget.wait_within()
                    await self.gate.wait_open()
                    if self.handle.reaped:
                        break
                    try:
                        msgs = await self._pull(sub, wait)
                    except TRANSIENT as exc:
                        # The stream has no leader for a moment (a cluster node died): the seat
                        # is fine and its mail is safe at the broker; wait for the election.
                        log.warning(
                            "delivery.broker_unavailable",
                            seat=self.seat,
                            error=type(exc).__name__,
                        )
                        await anyio.sleep(FETCH_WAIT_S)
                        continue
                    got = got or bool(msgs)
                    for msg in msgs:
                        if self.budget is not None and not self.budget.within():
                            await self._hold_at_budget(msg)
                        await self._deliver(msg, channel)
                wait = FETCH_WAIT_FIRST_S if got else min(2 * wait, FETCH_WAIT_S)
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                for _channel, sub in sources:
                    await sub.unsubscribe()

    async def _hold_at_budget(self, msg: Msg) -> None:
        """A message pulled as the seat reached its budget (another seat's turn spent the
        root's, or cotal.toml lowered it, while the pull waited) is held in progress and not
        run until the budget allows: delivered once, in order. A cut's fence, a stop or the
        harness's exit ends the hold, and `_deliver` settles the message as it settles any
        pulled then; a bridge cancelled meanwhile releases it, as `_pull` does."""
        assert self.budget is not None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._keep_in_progress, msg)
                await self.budget.wait_within(lambda: not self._may_retry())
                tg.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), contextlib.suppress(*TRANSIENT):
                log.info("delivery.released", seat=self.seat, reason="bridge stopping")
                await msg.nak()
            raise

    async def _count_dead_letters(self) -> None:
        """This incarnation's dead letters as the broker holds them now: a resume or a move may
        have carried some in (`space.import_dead_letters`) since the manager counted at its
        start. Only a count, for `ps` and `status`: a broker that does not answer leaves the
        last one, and an election is not waited out for it (its inbox waits behind it)."""
        try:
            with anyio.fail_after(ACK_S):
                self.dead_counts[self.uid] = await deadletter.count_of(
                    self.js, self.space, names.SEAT_OWNER, self.seat, self.uid
                )
        except Exception as exc:
            log.warning("delivery.dead_count_failed", seat=self.seat, error=type(exc).__name__)

    async def _bind_channel(self, channel: str) -> JetStreamContext.PullSubscription:
        """The seat's frontier in `channel`: the durable its spawn made, or, where this broker
        holds none (a resume onto another broker), one made now at the activation moment."""
        await chan.ensure_chathist_durable(
            self.js, self.space, names.SEAT_OWNER, self.seat, self.uid, channel
        )
        return await riding_elections(
            f"#{channel} of {self.seat}",
            lambda: self.js.pull_subscribe_bind(
                durable=names.chathist_durable(names.SEAT_OWNER, self.seat, self.uid, channel),
                stream=names.chan_stream(self.space),
            ),
        )

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

    def _decode(self, msg: Msg, channel: str | None) -> DirectMessage:
        """The message as a turn: a DM as it is; a post as a DM from its seat to this one,
        under this seat's own turn id for it."""
        if channel is None:
            return decode_dm(msg.data)
        post = meshcall.decode_post(msg.data)
        return DirectMessage(
            id=meshcall.post_turn_id(self.uid, post.id),
            sender=names.principal(names.SEAT_OWNER, post.sender),
            recipient=self.principal,
            text=post.text,
            sent_at=post.sent_at,
        )

    async def _deliver(self, msg: Msg, channel: str | None = None) -> None:
        self._source = channel
        this, total = deliveries(msg)
        if self.metrics is not None:
            self.metrics.delivered(self.seat, again=total > 1)
        try:
            dm: DirectMessage | None = self._decode(msg, channel)
            malformed = ""
        except DecodeError as exc:
            dm, malformed = None, exc.message
        # Checked with no await before the turn is recorded, so a fence set meanwhile is seen.
        if not self.gate.is_open:
            log.info(
                "delivery.released",
                seat=self.seat,
                id=dm.id if dm is not None else None,
                reason="fenced for a cut",
            )
            with contextlib.suppress(*TRANSIENT):
                await msg.nak()
            return
        if dm is None or not await self._runnable(msg, dm, channel, (this, total)):
            if dm is None:
                # It can never be run; kept as a dead letter, and the inbox moves on.
                log.error("delivery.malformed", seat=self.seat, error=malformed)
                malformed = f"malformed: {malformed}"
                if not await self._bury(msg, total, malformed, None, returned=this > 1):
                    await self._nak(msg, None, UNRESTARTED_RETRY_S)
            return
        waiter = self.waiters.get(dm.id)
        if waiter is not None:
            waiter.attempts += 1
        outcome: TurnOutcome | None = None
        text = self._begin_turn(msg, dm, channel, total)
        began = anyio.current_time()
        if self.events is not None:
            self.events.emit("turn.started", self.seat, self.uid)
        try:
            outcome = await self._run_turn(msg, dm.id, text, total)
        finally:
            # The seat may be stopping while the turn ends: settle in every case, shielded,
            # or a finished turn is neither acked nor released and waits out ack_wait.
            with anyio.CancelScope(shield=True):
                await self._count_turn(outcome, anyio.current_time() - began)
                if outcome is not None and outcome.status == "ok":
                    if await self._settle(msg, dm, outcome) and waiter is not None:
                        waiter.outcome = outcome
                        waiter.done.set()
                elif outcome is not None and outcome.status == PROVIDER_UNAVAILABLE:
                    await self._release_unserved(msg, dm.id)
                else:
                    await self._conclude_failed(msg, dm.id, (this, total), outcome)
                self.turn = None
                self._settled.set()

    async def _runnable(
        self, msg: Msg, dm: DirectMessage, channel: str | None, counted: tuple[int, int]
    ) -> bool:
        """Whether the message runs as a turn; one that does not is settled here: past the cap
        already (its move to dead letters was cut short), it is never run again; the seat's own
        post has nothing for it to answer."""
        this, total = counted
        if this > self.max_deliveries:
            reason = f"delivered {this} times, past the cap of {self.max_deliveries}"
            if not await self._bury(msg, total, reason, dm.id, returned=True):
                await self._nak(msg, dm.id, UNRESTARTED_RETRY_S)
            return False
        if channel is not None and meshcall.sender_of(dm.sender) == self.seat:
            with contextlib.suppress(*TRANSIENT):
                await msg.ack()
            return False
        return True

    def _begin_turn(self, msg: Msg, dm: DirectMessage, channel: str | None, total: int) -> str:
        """Record the turn in flight (its sends count from 0) and the text the harness is
        handed: a post or a seat's message framed with who sent it, the operator's as it is."""
        sender = meshcall.sender_of(dm.sender)
        from_seat = meshcall.seat_sender(msg.headers, dm.sender)
        log.info(
            "delivery.received",
            seat=self.seat,
            sender=sender,
            channel=channel,
            id=dm.id,
            delivery=total,
        )
        self.turn, self._settled = Turn(dm.id, now_iso()), anyio.Event()
        self.sends = 0
        if channel is not None:
            return meshcall.framed_post(channel, sender, dm.text)
        if from_seat is not None:
            return meshcall.framed(from_seat, dm.text)
        return dm.text

    async def _count_turn(self, outcome: TurnOutcome | None, took: float) -> None:
        """A turn's end, to the metrics, the seat's usage ledger (whatever the outcome: a
        failed turn's model calls were made too) and the event stream."""
        end = _turn_end(outcome)
        if self.metrics is not None:
            self.metrics.turn_ended(self.seat, end, took)
        if self.budget is not None:
            self.budget.turn_ended()
        used = outcome.usage if outcome is not None else None
        record = now_record(used) if used is not None else None
        if record is not None and self.usage is not None:
            await anyio.to_thread.run_sync(self.usage.add, record)
        if self.events is not None:
            detail = EventDetail(
                duration_s=round(took, 3),
                outcome=end,
                tokens=record.tokens if record is not None else None,
            )
            self.events.emit("turn.ended", self.seat, self.uid, detail)

    async def _run_turn(self, msg: Msg, dm_id: str, text: str, total: int) -> TurnOutcome | None:
        """Hand the message to the harness until a turn ends by itself. A turn its provider did
        not serve is tried again in the same harness after a backoff: `provider-unavailable` is
        returned only when a cut's fence or a stop ended the backoff first.

        Waited out here, holding the message (kept in progress), rather than released with
        `msg.nak(delay=...)`: JetStream counts every redelivery in the message's delivery count,
        which is what the cap reads and which nothing can lower again, so a nak per outage
        attempt would dead-letter a message for the provider's downtime. Held, the count is one
        however long the outage, also across a manager restart (the broker redelivers it as its
        second delivery, as for any turn a dead manager left); and the inbox stays in order,
        the next message waiting behind this one as it would behind any long turn."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._keep_in_progress, msg)
            tries = 0
            while True:
                # A try runs the turn again from its start: its sends make the same ids again.
                self.sends = 0
                outcome = await self.driver.prompt(text, message_id=dm_id, delivery=total)
                if outcome.status != PROVIDER_UNAVAILABLE:
                    break
                if not await self._back_off(dm_id, tries, outcome):
                    break
                tries += 1
            tg.cancel_scope.cancel()
        return outcome

    def _may_retry(self) -> bool:
        return self.gate.is_open and not self.deliberate() and not self.handle.reaped

    async def _back_off(self, dm_id: str, tries: int, outcome: TurnOutcome) -> bool:
        """Wait out one step of the backoff: True to try again, False when a cut's fence, a
        stop or the harness's exit came first (polled, so a cut never waits the backoff out)."""
        delay = self.backoff.delay(tries)
        log.warning(
            "delivery.provider_unavailable",
            seat=self.seat,
            id=dm_id,
            tries=tries + 1,
            retry_in_s=round(delay, 3),
            detail=outcome.detail,
        )
        deadline = anyio.current_time() + delay
        while (left := deadline - anyio.current_time()) > 0:
            if not self._may_retry():
                return False
            await anyio.sleep(min(BACKOFF_POLL_S, left))
        return self._may_retry()

    async def _release_unserved(self, msg: Msg, dm_id: str) -> None:
        """A message whose backoff a cut or a stop ended: the harness is idle and no call of it
        is live, so it is released at once, to travel with the inbox or wait in it."""
        log.info(
            "delivery.released",
            seat=self.seat,
            id=dm_id,
            reason="its provider was unavailable and the seat is being stopped or cut",
        )
        await self._nak(msg, dm_id, 0)

    async def _conclude_failed(
        self, msg: Msg, dm_id: str, counted_as: tuple[int, int], outcome: TurnOutcome | None
    ) -> None:
        """A turn that did not end clean: restart the harness if the manager grants it, move the
        message to dead letters at the cap, and release it otherwise once that is safe."""
        this, total = counted_as
        if outcome is None:
            detail = "the turn was cut off: the harness exited or is being stopped"
        else:
            detail = f"{outcome.status}: {outcome.detail}" if outcome.detail else outcome.status
            log.warning(
                "delivery.retained",
                seat=self.seat,
                id=dm_id,
                status=outcome.status,
                detail=outcome.detail,
                delivery=total,
            )
        # A cut in progress or a deliberate stop ended this turn, not its message: it travels
        # with the inbox or waits in it, and it does not cost the harness a restart.
        held_against = self.gate.is_open and not self.deliberate()
        restarting = outcome is not None and held_against and self.on_ambiguous(detail)
        kept = (
            held_against
            and this >= self.max_deliveries
            and await self._bury(msg, total, detail, dm_id)
        )
        if outcome is None or restarting or (outcome.status == "unknown" and not held_against):
            # The process is ending: release the message only once it is reaped, so a provider
            # call that may still be live cannot race its own redelivery; and hand nothing else
            # to it meanwhile.
            await self._release_after_exit(msg, dm_id, release=not kept)
        elif not kept:
            await self._nak(msg, dm_id, UNRESTARTED_RETRY_S if held_against else RETRY_DELAY_S)

    async def _bury(
        self, msg: Msg, total: int, reason: str, dm_id: str | None, *, returned: bool = False
    ) -> bool:
        """Move the message to the seat's dead letters, then terminate it in the inbox. False
        (the message left where it is) when the gate is closed or the broker refused the dead
        letter. `returned`: the message is back after reaching the cap once already, so it may
        be one whose burial landed and whose settlement did not; it is then only terminated."""
        if self._source is not None:
            return await self._give_up_post(msg, reason, dm_id)
        if not self.gate.begin_burial():
            return False
        try:
            dead_id = await self._dead_letter_of(msg, total, reason, dm_id, returned=returned)
            if dead_id is None:
                return False
            # A crash here leaves the message both a dead letter and unsettled in the inbox.
            failpoint.reached("delivery.buried-before-terminate")
            await self._terminate(msg, dm_id)
            if dead_id < 0:
                return True
            # Counted only now: the message has left the inbox (or its settlement failed and it
            # comes back past the cap, to be terminated then), so a cut that follows this count
            # never finds it both a dead letter and pending mail.
            self.dead_counts[self.uid] = self.dead_counts.get(self.uid, 0) + 1
            if self.metrics is not None:
                self.metrics.dead_lettered(self.seat)
            if self.events is not None:
                self.events.emit("deadletter.added", self.seat, self.uid)
            log.error(
                "delivery.dead_lettered",
                seat=self.seat,
                id=dm_id,
                dead_letter=dead_id,
                deliveries=total,
                reason=reason,
            )
            return True
        finally:
            self.gate.end_burial()

    async def _dead_letter_of(
        self, msg: Msg, total: int, reason: str, dm_id: str | None, *, returned: bool
    ) -> int | None:
        """The message's dead letter: a new one's id, -1 where a returned message already has
        one (nothing is added), None where the broker refused it."""
        source_seq = int(msg.metadata.sequence.stream)
        owner = names.SEAT_OWNER
        try:
            if returned:
                found = await deadletter.buried_as(
                    self.js,
                    self.space,
                    owner,
                    self.seat,
                    self.uid,
                    source_seq=source_seq,
                    data=msg.data,
                )
                if found is not None:
                    log.warning(
                        "delivery.already_dead_lettered", seat=self.seat, id=dm_id, dead=found
                    )
                    return -1
            meta = DeadLetterMeta(
                subject=msg.subject,
                source_seq=source_seq,
                deliveries=total,
                reason=reason[:512],
                dead_at=now_iso(),
            )
            return await deadletter.bury(
                self.js, self.space, owner, self.seat, self.uid, data=msg.data, meta=meta
            )
        except Exception as exc:
            # A full dead-letter stream or a broker gone: the message stays in the inbox,
            # which is wedged but loses nothing; the log says why.
            log.error(
                "delivery.dead_letter_failed",
                seat=self.seat,
                id=dm_id,
                error=str(exc) or type(exc).__name__,
            )
            return None

    async def _terminate(self, msg: Msg, dm_id: str | None) -> None:
        """Terminate a buried message, confirmed by the broker (`deadletter.terminate`)."""
        try:
            await deadletter.terminate(msg, ACK_S)
        except TRANSIENT as exc:
            # It comes back after ack_wait, past the cap: found among the dead letters by its
            # sequence and terminated then, never run and never buried twice.
            log.warning("delivery.term_failed", seat=self.seat, id=dm_id, error=repr(exc))

    async def _give_up_post(self, msg: Msg, reason: str, turn_id: str | None) -> bool:
        """A post that cannot run leaves this seat's frontier only: the channel keeps it in its
        history (a channel has no dead letters). False, as a burial, when the gate is closed."""
        if not self.gate.is_open:
            return False
        try:
            await msg.term()
        except TRANSIENT as exc:
            log.warning("delivery.term_failed", seat=self.seat, id=turn_id, error=repr(exc))
        log.error(
            "delivery.post_given_up",
            seat=self.seat,
            channel=self._source,
            id=turn_id,
            reason=reason,
        )
        return True

    async def _nak(self, msg: Msg, dm_id: str | None, delay: float) -> None:
        try:
            await msg.nak(delay=delay)
        except TRANSIENT as exc:
            log.warning("delivery.nak_failed", seat=self.seat, id=dm_id, error=type(exc).__name__)

    async def _keep_in_progress(self, msg: Msg) -> None:
        while True:
            await anyio.sleep(IN_PROGRESS_EVERY_S)
            await msg.in_progress()

    async def _release_after_exit(self, msg: Msg, dm_id: str, *, release: bool = True) -> None:
        with anyio.move_on_after(EXIT_WAIT_S):
            await self.handle.exited()
            if not release:
                return
            try:
                await msg.nak()
            except Exception as exc:  # the broker redelivers after ack_wait anyway
                log.warning("delivery.nak_failed", seat=self.seat, id=dm_id, error=str(exc))
            log.info("delivery.released", seat=self.seat, id=dm_id, reason="seat stopped mid-turn")

    async def _settle(self, msg: Msg, dm: DirectMessage, outcome: TurnOutcome) -> bool:
        """Ack a clean turn whose reply the broker accepted (True); release it if custody moved."""
        # A reply to a seat's message goes to the operator, never to that seat (see above); it
        # is still published through the fence, which is what proves custody before the ack.
        from_seat = (
            self._source is not None or meshcall.seat_sender(msg.headers, dm.sender) is not None
        )
        reply = DirectMessage(
            id=reply_id(dm.id),
            sender=self.principal,
            recipient=(
                names.principal(names.SEAT_OWNER, names.OPERATOR_ACTOR) if from_seat else dm.sender
            ),
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
            log.warning("delivery.reply_publish_failed", seat=self.seat, id=dm.id, error=str(exc))
        if self.before_ack is not None:
            await self.before_ack()
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
