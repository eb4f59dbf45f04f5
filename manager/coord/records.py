"""What each coordinator returns: one record per result, the `--json` document of its command.

Strict records, as every record that crosses a process boundary is: the CLI prints them, a
script reads them, and a move's destination sends its `RestoreResult` back to the source inside
the move's answer. Their fields are camelCase on the wire, as the CLI's JSON always was; a field
that only some outcomes carry is left out of the others (`UNSET`), so each document says exactly
what happened and nothing it did not.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

from protocol.custody import HandOffRecord
from protocol.maintenance import ClockNote, Consent


class _Record(
    msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True, kw_only=True
):
    pass


class _Sparse(_Record, omit_defaults=True, frozen=True):
    pass


# -- admission, shared by the restore and the verification --------------------------------


class Signer(_Record, frozen=True):
    """Who sealed the checkpoint, and why this root trusts the key."""

    instance_id: str
    public_key: str
    fingerprint: str
    pinned: bool
    # "pinned" (--trust-signer), "own" (this root's instance key) or a trust-store name.
    trusted_as: str


class Relocated(_Record, frozen=True):
    cwd_before: str
    cwd_after: str


class ChainLink(_Record, frozen=True):
    """One proven predecessor of an incremental seat: where it was found, its bundle's bytes."""

    attempt_id: str
    dir: str
    bundle_bytes: int


class EvictionProof(_Record, frozen=True):
    """A predecessor manager verified gone from the broker before its seat was adopted."""

    seat: str
    instance_id: str
    servers: list[str]
    connections_scanned: int
    remaining: int


# -- the restore --------------------------------------------------------------------------


class Claim(_Record, frozen=True):
    """Custody claimed at the broker for one seat, at the successor generation."""

    name: str
    generation: int
    revision: int


class ChannelImported(_Record, frozen=True):
    channel: str
    kept: bool
    start_seq: int
    republished: int
    duplicates: int


class InboxImported(_Record, frozen=True):
    """One seat's carried inbox and channel frontiers as this broker now holds them."""

    name: str
    kept: bool
    start_seq: int
    republished: int
    duplicates: int
    channels: list[ChannelImported]


class RestoredTree(_Record, frozen=True):
    name: str
    cwd: str
    # Where the tree that stood at `cwd` before was moved aside (never deleted).
    superseded: str | None
    session_files: int


class Observation(_Sparse, frozen=True):
    """Record 6 step 9 for one seat: what it was before the cut against what runs now."""

    name: str
    continuity: str
    observation: str
    session_before: str | None
    session_after: str | None
    uid_before: str
    uid_after: str | None
    same_session: bool
    same_uid: bool
    relocated: Relocated | UnsetType = UNSET
    relocation_note: str | UnsetType = UNSET
    map_landing: str | UnsetType = UNSET


class RestoreResult(_Sparse, frozen=True):
    """`cotal up --restore`, and a move's destination."""

    attempt_id: str
    # The manager's state after finalize, and the journal's.
    state: str
    journal: str
    # A rerun that continued a resume the journal held past its intent.
    continued: bool
    claims: list[Claim]
    restored: list[RestoredTree]
    consents: list[Consent]
    seats: list[Observation]
    eviction_evidence: list[EvictionProof]
    signer: Signer
    wall_ms: int = 0
    # Absent for a rerun that found the resume past its claim and import.
    shared_broker: bool | UnsetType = UNSET
    inbox: list[InboxImported] | UnsetType = UNSET
    # Present (true) when a running manager adopted the seats beside its own.
    adopted: bool | UnsetType = UNSET
    # Who vouched for this host's clock when the recency gate admitted the attempt, when it was
    # not the kernel: the operator's declaration in cotal.toml, or the test hook. Journaled too.
    clock: ClockNote | UnsetType = UNSET


# -- the verification ---------------------------------------------------------------------


class Gates(_Record, frozen=True):
    integrity: str
    identity: str
    recency: str


class VerifiedSeat(_Sparse, frozen=True):
    name: str
    lifecycle_uid: str
    continuity: str
    captured_at: str
    session_id: str | None
    chain: list[ChainLink] | UnsetType = UNSET
    relocated: Relocated | UnsetType = UNSET
    relocation_note: str | UnsetType = UNSET
    map_landing: str | UnsetType = UNSET


class VerifyResult(_Sparse, frozen=True):
    """`cotal checkpoint verify`: the three gates passed, nothing changed."""

    src: str
    attempt_id: str
    space: str
    gates: Gates
    seats: list[VerifiedSeat]
    signer: Signer
    consents: list[Consent]
    admitted: bool
    # As in RestoreResult: who vouched for the clock, when not the kernel.
    clock: ClockNote | UnsetType = UNSET


# -- pack, list, discard ------------------------------------------------------------------


class PackResult(_Record, frozen=True):
    attempt_id: str
    file: str
    sha256: str
    bytes: int
    seats: list[str]
    hand_off: HandOffRecord
    broker: str
    # The destination root's box key the file is sealed to, or None (any trusting root).
    sealed_to: str | None


class HandedOff(_Record, frozen=True):
    packed_at: str
    sha256: str
    taken_back_at: str | None


class CheckpointEntry(_Record, frozen=True):
    """One directory under this root's checkpoints, as `cotal checkpoint list` shows it."""

    name: str
    attempt_id: str
    path: str
    # "sealed", "partial" (a cut under way) or "failed" (evidence), with why for the last.
    state: str
    detail: str | None
    seats: list[str]
    bytes: int
    created_at: str
    handed_off: HandedOff | None
    journal_state: str | None
    journal_needs_it: bool


class CheckpointList(_Record, frozen=True):
    root: str
    journal_error: str | None
    checkpoints: list[CheckpointEntry]


class Discarded(_Record, frozen=True):
    attempt_id: str
    removed: str | None
    # The journal state dropped with the checkpoint, if the journal named it.
    journal_discarded: str | None


# -- the cut's abort ----------------------------------------------------------------------


class Aborted(_Sparse, frozen=True):
    """`cotal down --preserve-state --abort`: what was undone, or that nothing was under way."""

    aborted: bool
    nothing: bool | UnsetType = UNSET
    attempt_id: str | UnsetType = UNSET
    fence_lifted: bool | UnsetType = UNSET
    journal_discarded: bool | UnsetType = UNSET
    state: str | UnsetType = UNSET


# -- the move -----------------------------------------------------------------------------


class MovedSeat(_Sparse, frozen=True):
    name: str
    lifecycle_uid: str
    session: str | None
    generation: int | None
    downtime_ms: int
    # What carried its history: shipped before the fence, and the cut's increment.
    precopy_bytes: int | UnsetType = UNSET
    bundle_bytes: int | UnsetType = UNSET


class MoveResult(_Sparse, frozen=True):
    attempt_id: str
    to: str
    seats: list[MovedSeat]
    downtime_ms: int
    total_ms: int
    # Who vouched for the destination's clock when it admitted the seats, when not its kernel.
    destination_clock: ClockNote | UnsetType = UNSET
