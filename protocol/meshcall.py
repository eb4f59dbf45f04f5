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
from protocol.codec import encode_json
from protocol.errors import Refusal
from protocol.messages import DM_TEXT_MAX
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


class SendCall(
    msgspec.Struct, forbid_unknown_fields=True, tag_field="op", tag="send", rename="camel"
):
    """Send `text` to the seat `to` as a direct message from the calling seat."""

    to: SeatName
    text: Text


class SeatsCall(msgspec.Struct, forbid_unknown_fields=True, tag_field="op", tag="seats"):
    """List the seats the calling seat may send to, as the space holds them now."""


MeshCall = SendCall | SeatsCall
_calls: msgspec.json.Decoder[SendCall | SeatsCall] = msgspec.json.Decoder(MeshCall, strict=True)


class MeshResult(msgspec.Struct, forbid_unknown_fields=True, rename="camel", omit_defaults=True):
    """The answer to one call: `delivered` (queued in the recipient's inbox, `id` its message
    id), `listed` (`seats`, sorted), or `refused` with the refusal's code, message and cure."""

    status: Literal["delivered", "listed", "refused"]
    id: str | None = None
    to: str | None = None
    seq: int | None = None
    seats: list[str] | None = None
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
        'send {"op": "send", "to": SEAT, "text": TEXT} or {"op": "seats"} and nothing else; '
        "the sender is the seat whose channel carries the call, never a field",
    )


def encode_result(result: MeshResult) -> bytes:
    return encode_json(result)


def refused(exc: Refusal) -> MeshResult:
    return MeshResult(status="refused", code=str(exc.code), message=exc.message, cure=exc.cure)


def send_message_id(sender_uid: str, inbound_id: str, ordinal: int) -> str:
    """The id of the `ordinal`-th send (0-based) of the turn answering `inbound_id`: a pure
    function of the three, so a redelivered turn's sends are the broker's duplicates."""
    body = f"cotal-send\0{sender_uid}\0{inbound_id}\0{ordinal}".encode()
    return hashlib.sha256(body).hexdigest()[:32]


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


_FRAME = re.compile(r"\A\[cotal: message from seat ([A-Za-z0-9_]{1,64})\]\n\n")


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
    """The sender seat a framed text's first line names, or None for an unframed one."""
    found = _FRAME.match(text)
    return found.group(1) if found else None
