"""The writer fence: every message published on a seat's behalf is checked by the broker.

All of a seat's outbound DMs share one subject filter, `cotal.<space>.inst.*.*.<owner>.<seat>`.
The holder publishes with `Nats-Expected-Last-Subject-Sequence` (the last sequence it wrote or
fenced on that filter) and `Nats-Expected-Last-Subject-Sequence-Subject` (the filter). A new
holder, right after it wins custody, writes a fence marker on the same filter. From then on a
stale holder's expectation is behind, and the broker refuses its write (err_code 10071): the
fence is enforced where the write lands, not by a courtesy check in the client.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import structlog
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError

from manager.broker import grants, retention
from manager.broker.retry import riding_elections
from protocol import names
from protocol.errors import Refusal
from protocol.refusals import Code

log = structlog.get_logger("cotal.fence")

WRONG_LAST_SEQUENCE = (10071, 10164)
EXPECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECT_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
HOLDER = "Cotal-Holder"
# One value per fence object: the holder id is the root's and survives a manager's restart, so
# only this token tells a write this very writer made from one a successor made as the same root.
WRITER = "Cotal-Writer"
MSG_ID = "Nats-Msg-Id"
# A marker that outlives the channel stream's age bound (the stream allows per-message TTLs).
TTL = "Nats-TTL"
CALL_S = 5.0
FENCE_ATTEMPTS = 8


class FencedOut(Refusal):
    def __init__(self, seat: str, detail: str) -> None:
        super().__init__(
            Code.FENCED_OUT,
            f"the broker refused a write as {seat}: {detail}; another holder has custody",
            "this manager must stop the seat and never relaunch it",
        )


def outbound_filter(space: str, owner: str, seat: str) -> str:
    return f"{names.subject_prefix(space)}.inst.*.*.{owner}.{seat}"


def marker_subject(space: str, owner: str, seat: str, generation: int) -> str:
    return f"{names.subject_prefix(space)}.inst._custody.g{generation}.{owner}.{seat}"


def _wrong_sequence(exc: Exception) -> bool:
    return isinstance(exc, APIError) and getattr(exc, "err_code", None) in WRONG_LAST_SEQUENCE


@dataclass
class WriterFence:
    js: JetStreamContext
    space: str
    seat: str
    holder: str
    generation: int
    last_seq: int = 0
    # The sequence of this holder's post marker in the channel stream; 0 until it is written.
    post_seq: int = 0
    owner: str = names.SEAT_OWNER
    writer: str = field(default_factory=lambda: secrets.token_hex(8))
    lock: anyio.Lock = field(default_factory=anyio.Lock)

    @property
    def filter(self) -> str:
        return outbound_filter(self.space, self.owner, self.seat)

    async def _last_msg(
        self, stream: str | None = None, subject: str | None = None
    ) -> api.RawStreamMsg | None:
        """The newest write on `subject` of `stream` (the seat's outbound filter in the DM
        stream unless told), whoever made it."""
        where = (stream or names.dm_stream(self.space), subject or self.filter)
        try:
            return await riding_elections(
                f"fence {self.seat}", lambda: self.js.get_last_msg(*where)
            )
        except NotFoundError:
            return None

    async def _last_seq(self, stream: str | None = None, subject: str | None = None) -> int:
        msg = await self._last_msg(stream, subject)
        return int(msg.seq or 0) if msg is not None else 0

    async def _mark(
        self,
        subject: str,
        read_last: Callable[[], Awaitable[int]],
        headers: dict[str, str],
        room: Callable[[Callable[[], Awaitable[api.PubAck]]], Awaitable[api.PubAck]],
    ) -> int | None:
        """Write a marker at `subject` expecting the last write `read_last` finds, read again
        and retried while another write beats it; its sequence, or None if it never landed."""
        for _ in range(FENCE_ATTEMPTS):
            sent = {
                EXPECT_SEQ: str(await read_last()),
                **headers,
                HOLDER: self.holder,
                WRITER: self.writer,
            }
            publish = functools.partial(self.js.publish, subject, b"", headers=sent)
            ridden = functools.partial(riding_elections, f"fence {self.seat}", publish)
            try:
                ack = await room(ridden)
            except APIError as exc:
                if _wrong_sequence(exc):
                    continue
                raise
            return int(ack.seq)
        return None

    async def establish(self) -> int:
        """Write this holder's fence marker; from its sequence on, earlier holders are refused.

        Called only after custody was won at the custody bucket. A stale holder may still write
        between our read and our marker; then the marker's expectation fails and we read again,
        so the marker always lands after every write that beat it.
        """
        subject = marker_subject(self.space, self.owner, self.seat, self.generation)
        # On a broker with grants, the marker lands only once the broker lets this holder write
        # as the seat, which is also when it stops letting the previous holder.
        await grants.wait_granted(self.js, self.space, self.holder, {self.seat: self.generation})
        async with self.lock:
            # A stream full of acknowledged mail is trimmed first (the trim keeps every
            # subject's last message, so the expectation still holds); one full of mail not yet
            # acknowledged refuses `dm-stream-full`.
            seq = await self._mark(
                subject,
                self._last_seq,
                {EXPECT_SUBJECT: self.filter},
                lambda publish: retention.with_room(self.js, self.space, publish),
            )
            if seq is not None:
                self.last_seq = seq
                log.info("fence.established", seat=self.seat, generation=self.generation, seq=seq)
                return seq
        raise Refusal(
            Code.FENCE_CONTENDED,
            f"could not fence {self.seat}: its outbound subject kept moving",
            "another writer is still publishing as this seat; find and stop it",
        )

    @property
    def post_subject(self) -> str:
        return names.chan_fence_subject(self.space, self.owner, self.seat)

    async def _last_post_marker(self) -> int:
        return await self._last_seq(names.chan_stream(self.space), self.post_subject)

    async def establish_posts(self) -> int:
        """Write this holder's post marker in the channel stream. Every post names it as the
        last write on the marker's subject, so once a successor writes its own marker the
        broker refuses the stale holder's posts, whichever id they carry. Called by the manager
        after `establish`, where the channel stream exists."""

        async def as_is(publish: Callable[[], Awaitable[api.PubAck]]) -> api.PubAck:
            return await publish()

        seq = await self._mark(self.post_subject, self._last_post_marker, {TTL: "never"}, as_is)
        if seq is not None:
            self.post_seq = seq
            log.info("fence.posts_established", seat=self.seat, seq=seq)
            return seq
        raise Refusal(
            Code.FENCE_CONTENDED,
            f"could not fence {self.seat}'s posts: its post marker kept moving",
            "another manager is taking custody of this seat; find and stop it",
        )

    def _require_posts(self) -> None:
        if not self.post_seq:
            raise Refusal(Code.NOT_READY, f"seat {self.seat} is not fenced yet", "retry")

    async def post(self, subject: str, payload: bytes, headers: dict[str, str]) -> int:
        """Store a post on the seat's behalf, refused by the broker once a successor fenced."""
        self._require_posts()
        fenced = {
            **headers,
            EXPECT_SEQ: str(self.post_seq),
            EXPECT_SUBJECT: self.post_subject,
            HOLDER: self.holder,
            WRITER: self.writer,
        }
        try:
            # A retry after a lost answer is the broker's duplicate, not a second post.
            ack = await riding_elections(
                f"post as {self.seat}",
                functools.partial(self.js.publish, subject, payload, headers=fenced),
            )
        except APIError as exc:
            if not _wrong_sequence(exc):
                raise
            log.error("fence.post_refused", seat=self.seat, expected=self.post_seq)
            raise FencedOut(self.seat, str(getattr(exc, "description", exc))) from None
        return int(ack.seq)

    async def confirm(self) -> None:
        """A read on the seat's behalf (a channel's history, the roster) goes on only while the
        broker still holds this holder's post marker as the last one."""
        self._require_posts()
        last = await self._last_post_marker()
        if last != self.post_seq:
            raise FencedOut(
                self.seat, f"its post marker is {last}, this holder wrote {self.post_seq}"
            )

    async def publish(
        self, subject: str, payload: bytes, headers: dict[str, str] | None = None
    ) -> int:
        """Publish on the seat's behalf, refused by the broker unless we still hold the fence."""
        async with self.lock:
            for _ in range(FENCE_ATTEMPTS):
                fenced = {
                    **(headers or {}),
                    EXPECT_SEQ: str(self.last_seq),
                    EXPECT_SUBJECT: self.filter,
                    HOLDER: self.holder,
                    WRITER: self.writer,
                }
                try:
                    # Retried on a leaderless moment; the message id makes a retry a duplicate,
                    # not a second message.
                    ack = await riding_elections(
                        f"publish as {self.seat}",
                        functools.partial(self.js.publish, subject, payload, headers=fenced),
                    )
                except APIError as exc:
                    if not _wrong_sequence(exc):
                        raise
                    mine = await self._own_last(fenced.get(MSG_ID))
                    if mine is None:
                        log.error(
                            "fence.refused",
                            seat=self.seat,
                            holder=self.holder,
                            expected=self.last_seq,
                            detail=str(exc),
                        )
                        raise FencedOut(self.seat, str(getattr(exc, "description", exc))) from None
                    seq, landed = mine
                    # Our own write whose ack was lost (a broker that died after storing it, or
                    # a publish nats-py buffered through a reconnect): nobody fenced us since.
                    log.info("fence.own_write_recognised", seat=self.seat, seq=seq, landed=landed)
                    self.last_seq = seq
                    if landed:
                        return seq
                    continue
                # A duplicate answers with our own earlier write's sequence: still our last write.
                self.last_seq = max(self.last_seq, int(ack.seq))
                return int(ack.seq)
        raise Refusal(
            Code.FENCE_CONTENDED,
            f"could not publish as {self.seat}: its outbound subject kept moving under this holder",
            "restart the seat (cotal restart NAME); if it recurs, another process shares this "
            "manager's holder id",
        )

    async def _own_last(self, msg_id: str | None) -> tuple[int, bool] | None:
        """The last write on the seat's filter, if this holder made it: its sequence, and
        whether it is the very message `msg_id` names. None when someone else wrote last."""
        msg = await self._last_msg()
        if msg is None:
            return None
        headers = msg.headers or {}
        if headers.get(WRITER) != self.writer or not msg.seq:
            return None
        return int(msg.seq), msg_id is not None and headers.get(MSG_ID) == msg_id
