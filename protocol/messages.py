"""Records that travel through the broker: direct messages, presence, the manager lease and
its mark."""

from __future__ import annotations

from typing import Literal

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
    # `[failover] standby`: this manager takes lost hosts' seats over on its own. Absent from
    # the encoding otherwise, so a lease that is not a standby's reads as it always did.
    standby: bool | msgspec.UnsetType = msgspec.UNSET


class ManagerMark(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """A manager's own word that it started (`up`) or stopped as asked (`down`: `cotal down`,
    a cut, a signal), kept beside the custody records under `names.manager_mark_key` with no
    TTL. Its lease says whether it lives and ages out without a trace; this outlives it, so a
    holder with no lease reads as stopped on purpose (its last mark `down`) or lost (`up`: it
    never said it stopped), and a claim's holder as started since the claim or not."""

    holder: str
    state: Literal["up", "down"]
    at: str


MARK_CAP = 1024


def decode_dm(data: bytes) -> DirectMessage:
    return decode_json(data, DirectMessage, what="direct message", cap=DM_CAP)


def encode(obj: msgspec.Struct) -> bytes:
    return encode_json(obj)
