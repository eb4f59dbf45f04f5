"""A seat's own call into the mesh: the request a harness makes, the answer it gets, and the
rules the manager applies to it (docs/mesh.md).

The request names no sender. The manager takes the sender from the channel the call came in on
(the seat's own stdio, which only that seat's process holds), so a field that claims one is an
unknown field and the call is refused whole. A send's message id is derived from the sender's
lifecycle uid, the inbound message whose turn made the call and the send's ordinal in that
turn, so a turn that runs again publishes the same ids and the broker drops the copies.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Literal

import msgspec

from protocol import names
from protocol.codec import decode_json, encode_json
from protocol.errors import Refusal
from protocol.messages import DM_CAP, DM_TEXT_MAX
from protocol.refusals import Code

CALL_CAP = DM_TEXT_MAX + 4096
# `--allow-send '*'`: every seat of the space but the sender itself.
ANY_SEAT = "*"
# A shared broker holds more seats than one manager (`names.MAX_SEATS`), so a seat may name more;
# the bound keeps every record that carries the list (seat record, resume entry) decodable.
MAX_ALLOW_SEND = 256
# The NATS header a seat-sent message carries, naming its sender seat (`operator` for `cotal
# send`); the DM's own `sender` says the same as a principal.
SENDER_HEADER = "Cotal-Sender"
OPERATOR = names.OPERATOR_ACTOR

SeatName = Annotated[str, msgspec.Meta(pattern=names.SEAT_NAME.pattern)]
# `--allow-send` as the manager checked it (`check_allow_send`), in a record that crosses a disk
# or a host: the seat record and the resume entry.
AllowSendEntry = Annotated[str, msgspec.Meta(pattern=rf"^(?:\*|{names.SEAT_NAME.body})\Z")]
AllowSend = Annotated[list[AllowSendEntry], msgspec.Meta(max_length=MAX_ALLOW_SEND)]
Text = Annotated[str, msgspec.Meta(max_length=DM_TEXT_MAX)]
# A channel name is a seat-name token: it becomes a broker subject token (`names.chan_subject`).
ChannelName = Annotated[str, msgspec.Meta(pattern=names.SEAT_NAME.pattern)]
# `--subscribe` and `--allow-post` as the manager checked them (`check_channels`), in the seat
# record and the resume entry.
MAX_CHANNELS = 64
Channels = Annotated[list[ChannelName], msgspec.Meta(max_length=MAX_CHANNELS)]
# What one `history` call may ask for; the channel keeps at most its `[channels] history`.
MAX_HISTORY_READ = 1000
HistoryLimit = Annotated[int, msgspec.Meta(ge=1, le=MAX_HISTORY_READ)]


class SendCall(
    msgspec.Struct, forbid_unknown_fields=True, tag_field="op", tag="send", rename="camel"
):
    """Send `text` to the seat `to` as a direct message from the calling seat."""

    to: SeatName
    text: Text


class SeatsCall(msgspec.Struct, forbid_unknown_fields=True, tag_field="op", tag="seats"):
    """List the seats the calling seat may send to, as the space holds them now."""


class PostCall(
    msgspec.Struct, forbid_unknown_fields=True, tag_field="op", tag="post", rename="camel"
):
    """Post `text` to `channel` as the calling seat (its `--allow-post` must name it)."""

    channel: ChannelName
    text: Text


class HistoryCall(
    msgspec.Struct, forbid_unknown_fields=True, tag_field="op", tag="history", rename="camel"
):
    """The `limit` most recent posts of `channel`, oldest first (the caller must be subscribed
    to it or allowed to post there)."""

    channel: ChannelName
    limit: HistoryLimit = 20


MeshCall = SendCall | SeatsCall | PostCall | HistoryCall
_calls: msgspec.json.Decoder[SendCall | SeatsCall | PostCall | HistoryCall] = msgspec.json.Decoder(
    MeshCall, strict=True
)


class ChannelPost(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One post as the channel stream holds it. `id` doubles as its Nats-Msg-Id; `sender` is
    the posting seat's name, which the manager writes (the call names none)."""

    id: Annotated[str, msgspec.Meta(pattern=names.MESSAGE_ID.pattern)]
    channel: ChannelName
    sender: SeatName
    text: Text
    sent_at: Annotated[str, msgspec.Meta(pattern=names.INSTANT.pattern)]


class MeshPost(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """A post as a `history` answer shows it."""

    seq: int
    sender: str
    text: str
    sent_at: str


class MeshResult(msgspec.Struct, forbid_unknown_fields=True, rename="camel", omit_defaults=True):
    """The answer to one call: `delivered` (queued in the recipient's inbox, `id` its message
    id), `queued` (in its inbox too, but the manager holding the recipient has lost its lease:
    nobody runs it to read the mail until its host comes back or it is resumed elsewhere;
    `message` says since when, `queued; its host is unreachable since <instant>`), `listed`
    (`seats`, sorted), `posted` (stored in the channel's stream, `id` its message id),
    `history` (`posts`, oldest first), or `refused` with the refusal's code, message and
    cure."""

    status: Literal["delivered", "queued", "listed", "posted", "history", "refused"]
    id: str | None = None
    to: str | None = None
    channel: str | None = None
    seq: int | None = None
    seats: list[str] | None = None
    posts: list[MeshPost] | None = None
    code: str | None = None
    message: str | None = None
    cure: str | None = None


def decode_call(data: bytes) -> MeshCall:
    """A harness's call, strictly: an unknown op, an unknown field (a claimed sender) or a bad
    recipient name refuses the whole call."""
    if len(data) > CALL_CAP:
        why = f"{len(data)} bytes exceeds the {CALL_CAP}-byte cap"
    else:
        try:
            return _calls.decode(data)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            why = str(exc)
    raise Refusal(
        Code.MESH_CALL_INVALID,
        f"the mesh call was refused: {why}",
        'send {"op": "send", "to": SEAT, "text": TEXT}, {"op": "seats"}, {"op": "post", '
        '"channel": CHANNEL, "text": TEXT} or {"op": "history", "channel": CHANNEL} and nothing '
        "else; "
        "the sender is the seat whose channel carries the call, never a field",
    )


def decode_post(data: bytes) -> ChannelPost:
    """A post as the channel stream holds it (`protocol.errors.DecodeError` if it is not one)."""
    return decode_json(data, ChannelPost, what="channel post", cap=DM_CAP)


def encode_result(result: MeshResult) -> bytes:
    return encode_json(result)


def host_unreachable(since: str | None) -> str:
    """A `queued` send's message: the mail waits in the inbox of a seat whose host is lost."""
    return f"queued; its host is unreachable since {since or 'an unknown time'}"


def refused(exc: Refusal) -> MeshResult:
    return MeshResult(status="refused", code=str(exc.code), message=exc.message, cure=exc.cure)


def send_message_id(sender_uid: str, inbound_id: str, ordinal: int) -> str:
    """The id of the `ordinal`-th send (0-based) of the turn answering `inbound_id`: a pure
    function of the three, so a redelivered turn's sends are the broker's duplicates."""
    body = f"cotal-send\0{sender_uid}\0{inbound_id}\0{ordinal}".encode()
    return hashlib.sha256(body).hexdigest()[:32]


def post_message_id(sender_uid: str, inbound_id: str, ordinal: int) -> str:
    """A post's id, as `send_message_id` but apart from it: a turn run again posts the same
    ids, and the channel stream's duplicate window drops the copies."""
    body = f"cotal-post\0{sender_uid}\0{inbound_id}\0{ordinal}".encode()
    return hashlib.sha256(body).hexdigest()[:32]


def post_turn_id(seat_uid: str, post_id: str) -> str:
    """The id of a subscriber's turn for one post: the post's id is every subscriber's, so each
    seat's turn (its reply's id, its own sends' ids) is keyed by its uid as well."""
    body = f"cotal-post-turn\0{seat_uid}\0{post_id}".encode()
    return hashlib.sha256(body).hexdigest()[:32]


def carried_post_id(seat_uid: str, post_id: str) -> str:
    """A post's id once carried to another broker in one subscriber's frontier: the post's own
    id is every subscriber's, and the channel stream there keeps one message per id."""
    body = f"cotal-post-carried\0{seat_uid}\0{post_id}".encode()
    return hashlib.sha256(body).hexdigest()[:32]


def check_channels(values: Iterable[str], what: str) -> list[str]:
    """`--subscribe` or `--allow-post` values: channel names (a leading `#` is dropped), first
    mention kept."""
    out: list[str] = []
    for value in values:
        channel = value.removeprefix("#")
        if not names.SEAT_NAME.matches(channel):
            raise Refusal(
                Code.BAD_NAME,
                f"{what} {value!r} is not a channel name (letters, digits and _, up to 64)",
                "name channels such as `plan` or `review_2`",
            )
        if channel not in out:
            out.append(channel)
    if len(out) > MAX_CHANNELS:
        raise Refusal(
            Code.BAD_NAME,
            f"{what} names {len(out)} channels, more than {MAX_CHANNELS}",
            "name fewer channels",
        )
    return out


def check_allow_send(values: Iterable[str]) -> list[str]:
    """`--allow-send` values: seat names or `*`, first mention kept, `*` alone when given."""
    out: list[str] = []
    for value in values:
        if value != ANY_SEAT:
            names.check_seat_name(value)
        if value not in out:
            out.append(value)
    if ANY_SEAT in out:
        return [ANY_SEAT]
    if len(out) > MAX_ALLOW_SEND:
        raise Refusal(
            Code.BAD_NAME,
            f"--allow-send names {len(out)} seats, more than {MAX_ALLOW_SEND}",
            "name fewer seats, or allow '*'",
        )
    return out


def may_send(allow_send: Iterable[str], sender: str, to: str) -> bool:
    allowed = set(allow_send)
    return to != sender and (ANY_SEAT in allowed or to in allowed)


def sender_of(principal: str) -> str:
    """The name a recipient is shown for a DM's sender principal: the seat, or `operator`."""
    _owner, _dot, actor = principal.partition(".")
    return actor or principal


def framed_post(channel: str, sender: str, text: str) -> str:
    """What a subscribed seat's harness is handed for a post: the first line, the manager's,
    names the channel and the posting seat."""
    return f"[cotal: post on #{channel} by seat {sender}]\n\n{text}"


_FRAME = re.compile(
    r"\A\[cotal: (?:message from seat ([A-Za-z0-9_]{1,64})"
    r"|post on #([A-Za-z0-9_]{1,64}) by seat ([A-Za-z0-9_]{1,64}))\]\n\n"
)


def seat_sender(headers: Mapping[str, str] | None, principal: str) -> str | None:
    """The seat that sent a DM, or None for a message that is not a seat's send: only a
    manager's publish of a seat's call carries `SENDER_HEADER`, naming the very actor of the
    body's sender. Any other principal (the operator, a tool of the operator's on the broker) is
    answered as `cotal send` is, to the sender."""
    actor = sender_of(principal)
    named = (headers or {}).get(SENDER_HEADER)
    return actor if named == actor and actor != OPERATOR else None


def framed(sender: str, text: str) -> str:
    """What a seat's harness is handed for a message another seat sent: the first line names
    the sender, written by the manager, never by the sender (an operator's message is handed
    as it is)."""
    if sender == OPERATOR:
        return text
    return f"[cotal: message from seat {sender}]\n\n{text}"


def frame_sender(text: str) -> str | None:
    """The sender seat a framed text's first line names (a message's, or a post's), or None for
    an unframed one."""
    found = _FRAME.match(text)
    if found is None:
        return None
    return found.group(1) or found.group(3)


def frame_channel(text: str) -> str | None:
    """The channel a framed post's first line names, or None for any other text."""
    found = _FRAME.match(text)
    return found.group(2) if found else None
