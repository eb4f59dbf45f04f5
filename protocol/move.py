"""`cotal move`: what a source coordinator asks a destination manager over the broker.

Three requests on the destination's own subjects (`names.move_subject`): `probe` before anything
is fenced (would this manager take these seats, signed by this key?), `precopy` while the seats
still run (keep this seat's history, in the move bucket, by its digest), and `offer` once the
seats are cut and their checkpoint is in the move bucket (fetch it, admit it with your own trust
store, adopt it). Each is answered by a `MoveAnswer`.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

from protocol.codec import decode_json, encode_json
from protocol.inventory import AttemptId, SeatName
from protocol.meshcall import AllowSend, Channels

MOVE_CAP = 64 * 1024
# A probe names each seat's launch profile and permission lists: up to 256 seats of them.
PROBE_CAP = 1024 * 1024
# What a carried checkpoint may weigh in the bucket (the repository of 2,000 commits with a
# 32 MiB blob packs to about 40 MiB).
OBJECT_CAP = 4 * 1024 * 1024 * 1024

Digest = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
Uid = Annotated[str, msgspec.Meta(pattern="^[a-z0-9]{26,32}$")]


class ProbedSeat(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """What the destination must have for one seat, asked before the source fences anything:
    the launch profile its admission will compare (the connector, the model the source
    resolved, the permission lists and the digest they make with the source's settings), the
    harness version the seat runs at the source (None when the source's check could not tell),
    and how many bytes its history and carried files take (the pre-copy and the checkpoint
    land in the destination's root)."""

    name: SeatName
    agent: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}\Z")]
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)] | None
    profile: Digest
    harness_version: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    # An estimate, not an object's size: a tree may hold more than one object can carry.
    bytes: Annotated[int, msgspec.Meta(ge=0, le=1 << 62)] = 0
    allow_send: AllowSend = []
    subscribe: Channels = []
    allow_post: Channels = []


class MoveProbe(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    source: str
    signer: Annotated[str, msgspec.Meta(max_length=128)]
    seats: Annotated[list[SeatName], msgspec.Meta(min_length=1, max_length=256)]
    uids: Annotated[list[Uid], msgspec.Meta(min_length=1, max_length=256)]
    # Each seat's profile, harness and size, for the destination's checks before the fence. A
    # rerun whose source manager died sends none, and the destination then checks none of them
    # (its admission still does, after the cut).
    needs: Annotated[list[ProbedSeat], msgspec.Meta(max_length=256)] = []


class MoveOffer(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    source: str
    attempt_id: AttemptId
    object: Annotated[str, msgspec.Meta(max_length=128)]
    sha256: Digest
    bytes: Annotated[int, msgspec.Meta(ge=1, le=OBJECT_CAP)]
    seats: Annotated[list[SeatName], msgspec.Meta(min_length=1, max_length=256)]
    uids: Annotated[list[Uid], msgspec.Meta(min_length=1, max_length=256)]
    # The pre-copied bundles the cut builds on, which the destination drops once it adopted.
    precopy: Annotated[list[Digest], msgspec.Meta(max_length=256)] = []


class MovePrecopy(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """Before the fence: one seat's history (a bundle of its repository while it runs) is in the
    move bucket as `object`; the destination keeps it by digest for the cut's increment."""

    source: str
    seat: SeatName
    uid: Uid
    object: Annotated[str, msgspec.Meta(max_length=128)]
    sha256: Digest
    bytes: Annotated[int, msgspec.Meta(ge=1, le=OBJECT_CAP)]
    # The source's signing key and its Ed25519 signature over `precopy_payload`: the
    # destination unbundles only history a signer it trusts vouches for.
    signer: Annotated[str, msgspec.Meta(max_length=128)]
    signature: Annotated[str, msgspec.Meta(max_length=128)]


def precopy_payload(space: str, pre: MovePrecopy) -> bytes:
    """What a pre-copy's signature covers: every field but the signature, and the space."""
    fields = (space, pre.source, pre.seat, pre.uid, pre.object, pre.sha256, str(pre.bytes))
    return b"cotal-move-precopy-v1\0" + "\0".join((*fields, pre.signer)).encode()


class MoveAnswer(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    ok: bool
    code: str | None = None
    message: str | None = None
    # The seats already run here under these uids: a rerun of a move that finished.
    already: bool = False
    # A refused offer whose destination had claimed custody (its journal holds the attempt):
    # the destination owns the seats from here and a rerun finishes the move there.
    claimed: bool = False
    # The destination's restore result (what `up --restore --json` prints; the source decodes
    # it strictly as `manager/coord/records.py`'s RestoreResult), or `null`.
    result: msgspec.Raw = msgspec.Raw(b"null")


_VERSION = re.compile(r"\d+(?:\.\d+)+(?:[-+.]?[0-9A-Za-z][0-9A-Za-z.+-]*)?")


def harness_version_key(text: str) -> str:
    """What of a harness's version two hosts must agree on: the version number it names (`pi
    0.73.1` and `0.73.1` are one version), or the whole text when it names none (scribe's
    `built-in`)."""
    found = _VERSION.search(text)
    return found.group(0) if found else text.strip()


def encode(record: MoveProbe | MoveOffer | MovePrecopy | MoveAnswer) -> bytes:
    return encode_json(record)


def decode_probe(data: bytes) -> MoveProbe:
    return decode_json(data, MoveProbe, what="move probe", cap=PROBE_CAP)


def decode_offer(data: bytes) -> MoveOffer:
    return decode_json(data, MoveOffer, what="move offer", cap=MOVE_CAP)


def decode_precopy(data: bytes) -> MovePrecopy:
    return decode_json(data, MovePrecopy, what="move pre-copy", cap=MOVE_CAP)


def decode_answer(data: bytes) -> MoveAnswer:
    return decode_json(data, MoveAnswer, what="move answer", cap=16 * 1024 * 1024)


class CarriedSeat(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: SeatName
    lifecycle_uid: Uid
    # The custody generation the seat was cut at; the destination's claim makes it one more.
    generation: Annotated[int, msgspec.Meta(ge=0)]


class CarriedMeta(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """What a carried attempt in the move bucket says of itself (its Object Store description),
    so `cotal ps --fleet` shows its seats in transit while it travels."""

    source: Annotated[str, msgspec.Meta(max_length=128)]
    attempt_id: AttemptId
    seats: Annotated[list[CarriedSeat], msgspec.Meta(min_length=1, max_length=256)]
    # The destination's instance id; None when the putter did not name it (the seats are in
    # transit all the same, to an instance the roster cannot name).
    to: Annotated[str, msgspec.Meta(max_length=128)] | None = None


def encode_carried(meta: CarriedMeta) -> str:
    return encode_json(meta).decode()


def decode_carried(data: str) -> CarriedMeta:
    return decode_json(data, CarriedMeta, what="carried object's description", cap=MOVE_CAP)
