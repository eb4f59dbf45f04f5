"""A seat's sends into the mesh, manager side (docs/mesh.md, docs/design.md decision 30).

Each incarnation's driver is given a port bound to its seat (`port`): the call comes in on that
seat's own stdio, which only its process holds, so the manager knows the sender without asking
the call. The manager then checks the call strictly, the seat's `--allow-send`, that a turn is
in flight and that the recipient is a seat of the space, and publishes into the recipient's
inbox (the `dm_` durable keyed by its lifecycle uid, wherever it is: running, stopped, held by
a cut, or on another manager of the same broker) through the sender's writer fence, with the
sender's name as a header. Every refusal goes back to the seat by its code and is logged with
the seat's name; nothing is dropped unsaid. A send to a seat of another manager whose lease
lapsed (the seat `lost`, as `cotal ps --fleet` says) still queues in its inbox, but answers
`queued` with since when its host is unreachable, never `delivered`: nobody runs it to read it.

A post (`post`) goes to the space's channel stream under the channel's subject, refused unless
the seat's `--allow-post` names the channel; its id is derived as a send's is, apart from it
(`protocol.meshcall.post_message_id`). A post passes the writer fence too: it names the seat's
post marker in the channel stream as the last write there, so once a successor has written its
own marker the broker refuses the stale holder's post, and it is never stored to shadow the
holder's (`fence.WriterFence.post`). `history` reads a channel's recent posts for a seat
subscribed to it or allowed to post there, and it and the roster read answer only while the
broker still holds this holder's marker. A send or post the fence refuses fences the seat, as
a refused reply does: its process is stopped and never relaunched here.

The message id is derived from the sender's uid, the message its turn answers and the send's
ordinal in that turn, so a turn run again (a crash, a cut, a redelivery) makes the same ids.
Each send and post the broker stores is written to the space's sent ledger
(`manager.broker.sent`), and one whose id is there is answered as made and not published again:
the ledger keeps ids for the recency horizon across a broker restart, and a checkpoint carries
the seat's to another broker. The streams' own duplicate windows
(`manager.broker.footprint.dm_stream_config`) cover a send made but not yet written down.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import structlog
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from connectors.base import MeshPort
from manager.broker import channels, fleet, sent
from manager.broker.dm import publish_dm
from manager.broker.fence import FencedOut, WriterFence
from manager.broker.retry import riding_elections
from manager.daemon.seat import Incarnation, Seat
from protocol import meshcall, names
from protocol.checkpoint import SentEntry
from protocol.errors import Refusal
from protocol.instant import now_iso
from protocol.messages import DirectMessage
from protocol.refusals import Code

log = structlog.get_logger("cotal.mesh")


class MeshOwner(Protocol):
    """What a seat's sends read of the Manager: its space at the broker and its table, to
    know a recipient; a send never changes the table."""

    @property
    def space(self) -> str: ...

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def seats(self) -> Mapping[str, Seat]: ...

    def sent_ledger(self) -> KeyValue: ...


class MeshSends:
    """The ports of the Manager's seats."""

    def __init__(self, mgr: MeshOwner) -> None:
        self.mgr = mgr

    def port(self, seat: Seat, incarnation: Incarnation) -> MeshPort:
        """The port of this incarnation: every call on it is this seat's."""

        async def answer_call(call: bytes) -> bytes:
            return meshcall.encode_result(await self.answer(seat, incarnation, call))

        return answer_call

    async def answer(
        self, seat: Seat, incarnation: Incarnation, body: bytes
    ) -> meshcall.MeshResult:
        try:
            call = meshcall.decode_call(body)
            if isinstance(call, meshcall.SeatsCall):
                await _fence_of(seat).confirm()
                return await self._seats(seat)
            if isinstance(call, meshcall.PostCall):
                return await self._post(seat, incarnation, call)
            if isinstance(call, meshcall.HistoryCall):
                return await self._history(seat, call)
            return await self._send(seat, incarnation, call)
        except FencedOut as exc:
            # The broker refused a write (or the post marker moved): a successor holds the seat.
            # Fenced as a refused reply is, so this process is stopped, never relaunched here.
            log.error("mesh.fenced_out", seat=seat.name, error=exc.message)
            bridge = incarnation.bridge
            if bridge is not None:
                bridge.on_fenced()
            return meshcall.refused(exc)
        except Refusal as exc:
            log.warning("mesh.send_refused", seat=seat.name, code=str(exc.code), error=exc.message)
            return meshcall.refused(exc)
        except Exception as exc:
            # The broker failed the publish: the seat is told, and its turn decides.
            log.error("mesh.send_failed", seat=seat.name, error=str(exc) or type(exc).__name__)
            return meshcall.refused(
                Refusal(
                    Code.BROKER_UNAVAILABLE,
                    f"the send could not be published: {str(exc) or type(exc).__name__}",
                    "try the send again; a repeat of the same send is dropped as a duplicate",
                )
            )

    async def _seats(self, seat: Seat) -> meshcall.MeshResult:
        reachable = [
            name
            for name in sorted(await self._inboxes())
            if meshcall.may_send(seat.allow_send, seat.name, name)
        ]
        return meshcall.MeshResult(status="listed", seats=reachable)

    async def _send(
        self, seat: Seat, incarnation: Incarnation, call: meshcall.SendCall
    ) -> meshcall.MeshResult:
        inbound, ordinal = _claim_turn(seat, incarnation, f"sent to {call.to}", "send")
        if not meshcall.may_send(seat.allow_send, seat.name, call.to):
            allowed = ", ".join(seat.allow_send) or "no seat"
            raise Refusal(
                Code.SEND_NOT_ALLOWED,
                f"seat {seat.name} may not send to {call.to} (it may send to: {allowed})",
                f"spawn {seat.name} with `--allow-send {call.to}` if it should",
            )
        if not call.text:
            raise Refusal(
                Code.EMPTY_MESSAGE, "refusing to send an empty message", "pass the text to send"
            )
        elsewhere = await self._require_recipient(call.to)
        # Read before the publish, so a failed read says truly that nothing was published.
        gone = (
            await fleet.lost(self.mgr.js, self.mgr.space, call.to, elsewhere)
            if elsewhere is not None
            else None
        )
        dm = DirectMessage(
            id=meshcall.send_message_id(seat.uid, inbound, ordinal),
            sender=names.principal(names.SEAT_OWNER, seat.name),
            recipient=names.principal(names.SEAT_OWNER, call.to),
            text=call.text,
            sent_at=now_iso(),
        )
        fence = _fence_of(seat)
        ledger = self.mgr.sent_ledger()
        made = await sent.recall(ledger, seat.uid, dm.id)
        if made is not None:
            _dropped(seat, made, inbound, ordinal)
            return _sent(dm.id, call.to, made.seq, gone)
        seq = await publish_dm(
            self.mgr.js,
            self.mgr.space,
            dm,
            publish=fence.publish,
            headers={meshcall.SENDER_HEADER: seat.name},
        )
        await sent.remember(ledger, seat.uid, SentEntry(id=dm.id, kind="send", seq=seq))
        log.info(
            "mesh.sent",
            seat=seat.name,
            to=call.to,
            id=dm.id,
            seq=seq,
            turn=inbound,
            ordinal=ordinal,
            host_lost_since=gone.since if gone is not None else None,
        )
        return _sent(dm.id, call.to, seq, gone)

    async def _post(
        self, seat: Seat, incarnation: Incarnation, call: meshcall.PostCall
    ) -> meshcall.MeshResult:
        # Checked before the turn's ordinal is claimed, so a refused post leaves the ids of the
        # turn's later sends and posts as a rerun that is refused again derives them.
        if call.channel not in seat.allow_post:
            allowed = ", ".join(f"#{c}" for c in seat.allow_post) or "no channel"
            raise Refusal(
                Code.POST_NOT_ALLOWED,
                f"seat {seat.name} may not post to #{call.channel} (it may post to: {allowed})",
                f"spawn {seat.name} with `--allow-post {call.channel}` if it should",
            )
        if not call.text:
            raise Refusal(
                Code.EMPTY_MESSAGE, "refusing to post an empty message", "pass the text to post"
            )
        inbound, ordinal = _claim_turn(seat, incarnation, f"posted to #{call.channel}", "post")
        post = meshcall.ChannelPost(
            id=meshcall.post_message_id(seat.uid, inbound, ordinal),
            channel=call.channel,
            sender=seat.name,
            text=call.text,
            sent_at=now_iso(),
        )
        fence = _fence_of(seat)
        ledger = self.mgr.sent_ledger()
        made = await sent.recall(ledger, seat.uid, post.id)
        if made is not None:
            _dropped(seat, made, inbound, ordinal)
            return meshcall.MeshResult(
                status="posted", id=post.id, channel=call.channel, seq=made.seq
            )
        seq = await channels.publish_post(self.mgr.js, self.mgr.space, post, publish=fence.post)
        await sent.remember(ledger, seat.uid, SentEntry(id=post.id, kind="post", seq=seq))
        log.info(
            "mesh.posted",
            seat=seat.name,
            channel=call.channel,
            id=post.id,
            seq=seq,
            turn=inbound,
            ordinal=ordinal,
        )
        return meshcall.MeshResult(status="posted", id=post.id, channel=call.channel, seq=seq)

    async def _history(self, seat: Seat, call: meshcall.HistoryCall) -> meshcall.MeshResult:
        if call.channel not in seat.subscribe and call.channel not in seat.allow_post:
            raise Refusal(
                Code.HISTORY_NOT_ALLOWED,
                f"seat {seat.name} may not read #{call.channel}: it neither subscribes to it nor "
                "may post there",
                f"spawn {seat.name} with `--subscribe {call.channel}` if it should",
            )
        await _fence_of(seat).confirm()
        posts = await channels.history(self.mgr.js, self.mgr.space, call.channel, call.limit)
        return meshcall.MeshResult(status="history", channel=call.channel, posts=posts)

    async def _require_recipient(self, to: str) -> set[str] | None:
        """A seat of this manager's table (None: its host is this one), or one whose inbox
        durable the broker holds (cut out of the table, or another manager's: the lifecycle
        uids of its inboxes): a name with no inbox anywhere is refused rather than left to queue
        for nobody."""
        if to in self.mgr.seats:
            return None
        uids = (await self._inbox_uids()).get(to)
        if uids:
            return uids
        raise Refusal(
            Code.NO_SUCH_SEAT,
            f"no seat named {to!r} in space {self.mgr.space}",
            "see `cotal ps` (or `cotal ps --fleet` on a shared broker)",
        )

    async def _inboxes(self) -> set[str]:
        """The seats of the space with an inbox: this manager's table, and every `dm_` durable
        the broker holds (a seat a cut holds, another manager's seat)."""
        return set(self.mgr.seats) | set(await self._inbox_uids())

    async def _inbox_uids(self) -> dict[str, set[str]]:
        """Each seat with an inbox durable at the broker, and the lifecycle uid of each."""
        mgr = self.mgr
        prefix = f"dm_{names.SEAT_OWNER}-"

        async def durables() -> list[str]:
            infos = await mgr.js.consumers_info(names.dm_stream(mgr.space))
            return [i.name for i in infos if i.name]

        found: dict[str, set[str]] = {}
        for durable in await riding_elections("inbox durables", durables):
            # dm_<owner>-<seat>-<uid>: neither a seat name nor a uid holds a '-'.
            name, dash, uid = durable.removeprefix(prefix).rpartition("-")
            if durable.startswith(prefix) and dash and names.SEAT_NAME.matches(name):
                found.setdefault(name, set()).add(uid)
        return found


def _sent(message_id: str, to: str, seq: int, gone: fleet.Lost | None) -> meshcall.MeshResult:
    """A send in the recipient's inbox: `delivered`, or `queued` when its host is lost."""
    if gone is None:
        return meshcall.MeshResult(status="delivered", id=message_id, to=to, seq=seq)
    return meshcall.MeshResult(
        status="queued",
        id=message_id,
        to=to,
        seq=seq,
        message=meshcall.host_unreachable(gone.since),
    )


def _dropped(seat: Seat, made: SentEntry, inbound: str, ordinal: int) -> None:
    """A send or post of a turn run again, already made inside the horizon: answered as made,
    with the sequence the broker that stored it gave it, and not published again."""
    log.info(
        "mesh.duplicate_dropped",
        seat=seat.name,
        id=made.id,
        kind=made.kind,
        seq=made.seq,
        turn=inbound,
        ordinal=ordinal,
    )


def _fence_of(seat: Seat) -> WriterFence:
    fence = seat.fence
    if fence is None:
        raise Refusal(Code.NOT_READY, f"seat {seat.name} is not fenced yet", "retry")
    return fence


def _claim_turn(seat: Seat, incarnation: Incarnation, did: str, verb: str) -> tuple[str, int]:
    """The inbound message id of the turn in flight and this call's ordinal in it, from which
    its message id is derived; refused when no delivered turn is in flight."""
    bridge = incarnation.bridge
    claimed = bridge.claim_send() if bridge is not None else None
    if claimed is None:
        raise Refusal(
            Code.SEND_OUTSIDE_TURN,
            f"seat {seat.name} {did} outside a delivered turn",
            f"{verb} from within a turn the manager delivered",
        )
    return claimed
