"""The mail ops: send (and wait for the reply), and a seat's dead letters: list, put one back,
put every one back in order, drop one."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import anyio
import structlog
from nats.js import JetStreamContext

from manager.broker import deadletter
from manager.broker.dm import new_message_id, publish_dm
from manager.daemon.delivery import DeliveryGate, Waiter
from manager.daemon.handlers.table import Table
from manager.daemon.seat import Seat
from protocol import control, meshcall, names
from protocol.checkpoint import MAX_CARRIED_BYTES, MAX_CARRIED_DEAD_LETTERS
from protocol.errors import DecodeError, Refusal
from protocol.instant import now_iso
from protocol.messages import DirectMessage, decode_dm
from protocol.refusals import Code

log = structlog.get_logger("cotal.manager")

HEAD_CHARS = 80


class DeadLetterBook(Protocol):
    """The table and the dead-letter counts the Manager keeps for it, read without the broker."""

    @property
    def seats(self) -> Mapping[str, Seat]: ...

    @property
    def dead_counts(self) -> dict[str, int]: ...


class DeadLetterCheckOwner(DeadLetterBook, Protocol):
    """What the cut's dead-letter check reads: the counts at the broker, taken while the
    delivery gate shows no move to dead letters under way."""

    @property
    def space(self) -> str: ...

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def delivery_gate(self) -> DeliveryGate: ...


class MailOwner(Protocol):
    """What the mail ops ask of the Manager: a seat by name, the broker, the waiters a delivery
    answers, the dead-letter counts, and the fence each change to an inbox passes."""

    @property
    def space(self) -> str: ...

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def waiters(self) -> dict[str, Waiter]: ...

    @property
    def dead_counts(self) -> dict[str, int]: ...

    def seat(self, name: str) -> Seat: ...

    def lifecycle(
        self, what: str, seat: str | None = None
    ) -> AbstractAsyncContextManager[None]: ...


def dead_by_seat(mgr: DeadLetterBook) -> dict[str, int]:
    """Each seat's dead letters, for the seats that have any."""
    found = {s.name: mgr.dead_counts.get(s.uid, 0) for s in mgr.seats.values()}
    return {name: n for name, n in sorted(found.items()) if n}


def _dead_row(letter: deadletter.DeadLetter) -> control.DeadLetterRow:
    meta = letter.meta
    try:
        dm: DirectMessage | None = decode_dm(letter.data)
    except DecodeError:
        dm = None
    text = dm.text if dm is not None else letter.data.decode("utf-8", "replace")
    return control.DeadLetterRow(
        id=letter.id,
        subject=meta.subject,
        deliveries=meta.deliveries,
        reason=meta.reason,
        dead_at=meta.dead_at,
        bytes=len(letter.data),
        head=text[:HEAD_CHARS],
        sender=dm.sender if dm is not None else None,
        message_id=dm.id if dm is not None else None,
        sent_at=dm.sent_at if dm is not None else None,
    )


def _message_id(letter: deadletter.DeadLetter) -> str | None:
    try:
        return decode_dm(letter.data).id
    except DecodeError:
        return None


class MailHandlers:
    def __init__(self, mgr: MailOwner) -> None:
        self.mgr = mgr

    def register(self, table: Table) -> None:
        table.add(control.SEND, self.send)
        table.add(control.DEAD_LETTERS, self.dead_letters)
        table.add(control.REDELIVER_DEAD_LETTER, self.redeliver)
        table.add(control.DROP_DEAD_LETTER, self.drop)
        table.add(control.REDELIVER_ALL_DEAD_LETTERS, self.redeliver_all)

    async def send(self, args: control.SendArgs) -> control.SendReply:
        mgr = self.mgr
        seat = mgr.seat(args.name)
        if not args.text:
            raise Refusal(
                Code.EMPTY_MESSAGE, "refusing to send an empty message", "pass the text to send"
            )
        dm = DirectMessage(
            id=new_message_id(),
            sender=names.principal(names.SEAT_OWNER, names.OPERATOR_ACTOR),
            recipient=names.principal(names.SEAT_OWNER, seat.name),
            text=args.text,
            sent_at=now_iso(),
        )
        waiter = Waiter() if args.wait else None
        if waiter is not None:
            mgr.waiters[dm.id] = waiter
        try:
            seq = await publish_dm(
                mgr.js, mgr.space, dm, headers={meshcall.SENDER_HEADER: meshcall.OPERATOR}
            )
            sent = control.SendReply(id=dm.id, seq=seq, seat=seat.name)
            if waiter is None:
                return sent
            await self._reply_of(seat, waiter, args.timeout_s)
            assert waiter.outcome is not None
            return control.SendReply(
                id=dm.id,
                seq=seq,
                seat=seat.name,
                reply=waiter.outcome.reply,
                attempts=waiter.attempts,
            )
        finally:
            mgr.waiters.pop(dm.id, None)

    @staticmethod
    async def _reply_of(seat: Seat, waiter: Waiter, timeout_s: float) -> None:
        try:
            with anyio.fail_after(timeout_s):
                await waiter.done.wait()
        except TimeoutError:
            raise Refusal(
                Code.NO_REPLY,
                f"no reply from {seat.name} within {timeout_s:.0f}s",
                "the message stays queued in the seat's inbox; check `cotal ps` and the seat log",
            ) from None

    # -- dead letters ---------------------------------------------------------------------------

    async def dead_letters(self, args: control.DeadLettersArgs) -> control.DeadLetters:
        mgr = self.mgr
        seat = mgr.seat(args.name)
        owner = names.SEAT_OWNER
        count = await deadletter.count_of(mgr.js, mgr.space, owner, seat.name, seat.uid)
        letters = await deadletter.listing(mgr.js, mgr.space, owner, seat.name, seat.uid)
        mgr.dead_counts[seat.uid] = count
        return control.DeadLetters(
            name=seat.name,
            lifecycle_uid=seat.uid,
            count=count,
            letters=[_dead_row(letter) for letter in letters],
            truncated=count > len(letters),
        )

    async def redeliver(self, args: control.DeadLetterArgs) -> control.RedeliverDeadLetterReply:
        """Put one dead letter back into the seat's inbox, then remove it from the dead letters:
        a crash between the two leaves it in both, never in neither."""
        mgr = self.mgr
        async with mgr.lifecycle("redeliver", seat=args.name):
            seat = mgr.seat(args.name)
            owner = names.SEAT_OWNER
            letter = await deadletter.fetch(mgr.js, mgr.space, owner, seat.name, seat.uid, args.id)
            return await self._put_back(seat, letter)

    async def _put_back(
        self, seat: Seat, letter: deadletter.DeadLetter
    ) -> control.RedeliverDeadLetterReply:
        mgr = self.mgr
        seq = await deadletter.put_back(mgr.js, mgr.space, names.SEAT_OWNER, seat.name, letter)
        await deadletter.remove(mgr.js, mgr.space, letter.id)
        self._count_removed(seat)
        log.info("deadletter.redelivered", seat=seat.name, id=letter.id, seq=seq)
        return control.RedeliverDeadLetterReply(
            name=seat.name,
            lifecycle_uid=seat.uid,
            id=letter.id,
            message_id=_message_id(letter),
            seq=seq,
            # What the harness is told: its next delivery's number.
            delivery=letter.meta.deliveries + 1,
        )

    async def redeliver_all(self, args: control.RedeliverAllArgs) -> control.RedeliverAllReply:
        """Every dead letter the seat had when the call began back into its inbox, oldest
        first, each published before the next, so the inbox holds them in the order they died.
        Read a batch at a time from the oldest: each one put back is removed, so the next read
        starts past it, and a letter cotal did not write (which the listing skips) never loops
        it. A letter buried while the call runs (a message put back that failed again) is not
        put back by the same call: it would come back in the reply twice."""
        mgr = self.mgr
        async with mgr.lifecycle("redeliver", seat=args.name):
            seat = mgr.seat(args.name)
            rows: list[control.RedeliverDeadLetterReply] = []
            count = 0
            newest = await deadletter.last_id(mgr.js, mgr.space)
            for _ in range(deadletter.DEAD_PER_SEAT // deadletter.LIST_MAX + 1):
                listed = await deadletter.listing(
                    mgr.js, mgr.space, names.SEAT_OWNER, seat.name, seat.uid
                )
                batch = [letter for letter in listed if letter.id <= newest]
                if not batch:
                    break
                for letter in batch:
                    row = await self._put_back(seat, letter)
                    count += 1
                    if len(rows) < control.REDELIVER_ALL_LISTED:
                        rows.append(row)
            log.info("deadletter.redelivered_all", seat=seat.name, count=count)
            return control.RedeliverAllReply(
                name=seat.name,
                lifecycle_uid=seat.uid,
                count=count,
                letters=rows,
                truncated=count > len(rows),
            )

    async def drop(self, args: control.DeadLetterArgs) -> control.DropDeadLetterReply:
        mgr = self.mgr
        async with mgr.lifecycle("drop", seat=args.name):
            seat = mgr.seat(args.name)
            letter = await deadletter.fetch(
                mgr.js, mgr.space, names.SEAT_OWNER, seat.name, seat.uid, args.id
            )
            await deadletter.remove(mgr.js, mgr.space, letter.id)
            self._count_removed(seat)
            log.info("deadletter.dropped", seat=seat.name, id=letter.id)
            return control.DropDeadLetterReply(
                name=seat.name, lifecycle_uid=seat.uid, id=letter.id, message_id=_message_id(letter)
            )

    def _count_removed(self, seat: Seat) -> None:
        self.mgr.dead_counts[seat.uid] = max(0, self.mgr.dead_counts.get(seat.uid, 0) - 1)


async def refuse_dead_letters(
    mgr: DeadLetterCheckOwner, *, only: frozenset[str] = frozenset()
) -> None:
    """A cut carries each seat's dead letters beside its inbox (`space.export_dead_letters`,
    read once the seat is proven stopped), so dead letters no longer hold a cut up: it is
    refused, before the fence so that nothing stops, only for a seat whose dead letters are
    more than a checkpoint carries. The read is retried until no move to dead letters was under
    way across it, so none lands unseen between the read and the fence (the fence, which
    follows with no await, ends them)."""
    gate = mgr.delivery_gate
    while True:
        begun = await gate.quiet()
        found = await deadletter.counts(mgr.js, mgr.space)
        if not gate.burying and gate.burials_begun == begun:
            break
    mgr.dead_counts.clear()
    mgr.dead_counts.update(found)
    held = {n: c for n, c in dead_by_seat(mgr).items() if not only or n in only}
    uids = {s.name: s.uid for s in mgr.seats.values()}
    over: dict[str, int] = {}
    for name in held:
        letters = await deadletter.listing(
            mgr.js, mgr.space, names.SEAT_OWNER, name, uids[name], limit=MAX_CARRIED_DEAD_LETTERS
        )
        size = sum(len(letter.data) for letter in letters)
        if size > MAX_CARRIED_BYTES:
            over[name] = size
    if over:
        listed = ", ".join(f"{name} {size} bytes" for name, size in over.items())
        first = next(iter(over))
        raise Refusal(
            Code.DEAD_LETTERS_WAITING,
            f"preservation refused: the dead letters of seat(s) {listed} are more than the "
            f"{MAX_CARRIED_BYTES} bytes a checkpoint carries beside an inbox",
            f"`cotal inbox {first}` lists them; drop what need not travel (`--drop ID`) or put "
            f"them back (`cotal inbox {first} --redeliver-all`), for every seat named, then "
            "cut again; nothing was stopped",
        )
