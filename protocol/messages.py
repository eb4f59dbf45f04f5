"""Records that travel through the broker: direct messages, presence, the manager lease."""

from __future__ import annotations

import msgspec

from protocol.codec import decode_json, encode_json

DM_CAP = 256 * 1024
DM_TEXT_MAX = 128 * 1024


class DirectMessage(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One DM. `id` doubles as the JetStream Nats-Msg-Id, so a retried publish is deduplicated."""

    id: str
    sender: str
    recipient: str
    text: str
    sent_at: str
    in_reply_to: str | None = None


class Presence(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    seat: str
    lifecycle_uid: str
    instance_id: str
    agent: str
    pid: int
    since: str


class ManagerLease(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    holder: str
    root: str
    pid: int
    since: str
    # Where the manager runs, for `cotal ps --fleet`; empty in a lease an older cotal wrote.
    host: str = ""


def decode_dm(data: bytes) -> DirectMessage:
    return decode_json(data, DirectMessage, what="direct message", cap=DM_CAP)


def encode(obj: msgspec.Struct) -> bytes:
    return encode_json(obj)
