"""The maintenance journal and the resume document, on disk under `.cotal/maintenance/v1/`.

The resume document is the inventory a cut persisted, as normalized bytes. The journal names it
by a descriptor (version, file, size, sha256) and records how far the cut or the resume got.
Both are written privately and atomically with fsync, and both are read strictly: a journal
that does not parse is a loud refusal naming the file and the cure, never a silent reset,
because resetting it would forget that seats were stopped and are waiting to be resumed.

The journal is only written by a coordinator that holds the maintenance lock (`lock.py`); this
module does not take the lock itself, so one lock covers a whole multi-step run.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from manager.workspace.layout import Layout
from manager.workspace.private import (
    ensure_private_dir,
    fsync_dir,
    read_stable,
    write_private_atomic,
)
from protocol.errors import DecodeError, Refusal
from protocol.instant import now_iso
from protocol.inventory import (
    INVENTORY_CAP,
    SUPPORTED_VERSIONS,
    Inventory,
    decode_inventory,
    encode_inventory,
    inventory_version,
)
from protocol.maintenance import (
    DISCARDABLE_STATES,
    JOURNAL_CAP,
    RESUME_FILE,
    ClockNote,
    Consent,
    Degraded,
    IllegalTransition,
    JournalRecord,
    JournalState,
    ResumeDescriptor,
    decode_journal,
    encode_journal,
    next_record,
)
from protocol.refusals import Code

JOURNAL_FILE = "journal.json"
_WHAT_RESUME = "maintenance resume document"


def utc_now() -> str:
    return now_iso()


def _maintenance_dir(layout: Layout) -> Path:
    ensure_private_dir(layout.control)
    ensure_private_dir(layout.maintenance.parent)
    return ensure_private_dir(layout.maintenance)


def resume_path(layout: Layout) -> Path:
    return layout.maintenance / RESUME_FILE


def journal_path(layout: Layout) -> Path:
    return layout.maintenance / JOURNAL_FILE


# -- the resume document ---------------------------------------------------------------------------


def write_resume_document(layout: Layout, inventory: Inventory) -> ResumeDescriptor:
    """Persist `inventory` as resume.json and prove it by reading it back through the reader.

    An existing journal pins the document its attempt depends on: rewriting the same bytes is a
    retry and succeeds; different bytes are refused, because the journal's descriptor (and the
    seats it says were stopped) would then point at an inventory that no longer exists.
    """
    data = encode_inventory(inventory)
    if len(data) > INVENTORY_CAP:
        raise Refusal(
            Code.TOO_LARGE,
            f"resume inventory is {len(data)} bytes, over the {INVENTORY_CAP}-byte cap",
            "cut fewer seats at a time",
        )
    # The bytes on disk must be ones the resume parser accepts; refuse before writing if not.
    decode_inventory(data)
    descriptor = ResumeDescriptor(
        version=inventory.version,
        file=RESUME_FILE,
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    _maintenance_dir(layout)
    record = Journal(layout).load()
    if record is not None and record.resume is not None and record.resume != descriptor:
        raise Refusal(
            Code.RESUME_MISMATCH,
            f"maintenance journal {journal_path(layout)} (attempt {record.attempt_id}, state "
            f"{record.state}) names a different resume document (sha256 {record.resume.sha256}); "
            f"refusing to replace it with {descriptor.sha256}",
            "finish or discard that attempt first; a cut that re-prepares must reproduce the "
            "inventory it persisted byte for byte",
        )
    write_private_atomic(resume_path(layout), data)
    read_resume_document(layout, descriptor)
    return descriptor


def _check_descriptor(descriptor: ResumeDescriptor) -> None:
    if descriptor.version not in SUPPORTED_VERSIONS:
        raise Refusal(
            Code.UNSUPPORTED_VERSION,
            f"resume descriptor names version {descriptor.version!r}",
            "upgrade cotal to the version that wrote it",
        )
    if descriptor.file != RESUME_FILE or not (0 < descriptor.bytes <= INVENTORY_CAP):
        raise Refusal(
            Code.RESUME_MISMATCH,
            f"resume descriptor {descriptor!r} does not describe a resume document",
            "the journal is damaged; restore it from the cut's copy",
        )


def read_resume_document(
    layout: Layout, descriptor: ResumeDescriptor, *, attempt_id: str | None = None
) -> Inventory:
    """Read resume.json and trust it only if it is exactly the bytes `descriptor` names.

    No symlink, a regular 0600 file owned by us, the recorded size, unchanged while read (a
    re-stat after reading), the recorded sha256, the recorded version, and normalized bytes.
    `attempt_id` binds a v1 document, which carries no attempt of its own.
    """
    _check_descriptor(descriptor)
    path = resume_path(layout)
    cure_tamper = (
        "the document is not the one this attempt persisted; restore the cut's resume.json, "
        "or discard the attempt and cut again"
    )
    # The size cap is the descriptor's size: a bigger file is refused before a byte is read.
    try:
        got = read_stable(path, cap=descriptor.bytes, what=_WHAT_RESUME, require_private=True)
    except Refusal as exc:
        if exc.code == Code.TOO_LARGE:
            raise Refusal(
                Code.RESUME_MISMATCH,
                f"{_WHAT_RESUME} {path} is larger than the {descriptor.bytes} bytes the journal "
                "records",
                cure_tamper,
            ) from None
        raise
    mode = stat.S_IMODE(got.st.st_mode)
    if mode != 0o600 or got.st.st_uid != os.geteuid():
        raise Refusal(
            Code.NOT_PRIVATE,
            f"{_WHAT_RESUME} {path} has mode {mode:04o} and owner uid {got.st.st_uid}; expected "
            f"0600 and uid {os.geteuid()}",
            f"check it is the document this attempt wrote, then chmod 600 {path}",
        )
    if len(got.data) != descriptor.bytes:
        raise Refusal(
            Code.RESUME_MISMATCH,
            f"{_WHAT_RESUME} {path} is {len(got.data)} bytes, the journal records "
            f"{descriptor.bytes}",
            cure_tamper,
        )
    digest = hashlib.sha256(got.data).hexdigest()
    if digest != descriptor.sha256:
        raise Refusal(
            Code.RESUME_MISMATCH,
            f"{_WHAT_RESUME} {path} hashes to {digest}, the journal records {descriptor.sha256}",
            cure_tamper,
        )
    declared = inventory_version(got.data)
    if declared != descriptor.version:
        raise Refusal(
            Code.RESUME_MISMATCH,
            f"{_WHAT_RESUME} {path} is {declared}, the journal records {descriptor.version}",
            cure_tamper,
        )
    inventory = decode_inventory(got.data, attempt_id=attempt_id)
    # What this cotal writes is normalized; matching digests make this unreachable short of a
    # descriptor forged to fit a hand-edited file, which is still refused.
    if declared == inventory.version and encode_inventory(inventory) != got.data:
        raise Refusal(
            Code.RESUME_MISMATCH, f"{_WHAT_RESUME} {path} is not in normalized form", cure_tamper
        )
    return inventory


# -- the journal ---------------------------------------------------------------------------------


class Journal:
    """The one maintenance journal of a workspace root. Callers hold the maintenance lock."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.path = journal_path(layout)

    def _cure(self) -> str:
        return (
            f"cotal never resets a journal: inspect {self.path}; if no cut or resume is in "
            f"progress for this root, move it aside (mv {self.path} {self.path}.broken) and "
            "run the step again"
        )

    def load(self) -> JournalRecord | None:
        """The current record, or None when no journal exists. Anything else unreadable refuses."""
        try:
            os.lstat(self.path)
        except FileNotFoundError:
            return None
        try:
            got = read_stable(
                self.path, cap=JOURNAL_CAP, what="maintenance journal", require_private=True
            )
            return decode_journal(got.data, what=f"maintenance journal {self.path}")
        except DecodeError as exc:
            raise Refusal(Code.JOURNAL_MALFORMED, exc.message, self._cure()) from None
        except Refusal as exc:
            if exc.code == Code.MISSING:  # discarded between the lstat and the open
                return None
            raise Refusal(exc.code, exc.message, self._cure()) from None

    def resume_document(self, record: JournalRecord | None = None) -> Inventory:
        """The inventory the journal's descriptor names, verified byte for byte."""
        record = record if record is not None else self.load()
        if record is None or record.resume is None:
            raise Refusal(
                Code.RESUME_MISSING,
                f"no maintenance journal with a resume document at {self.path}",
                "cut the seats first (cotal down --preserve-state)",
            )
        return read_resume_document(self.layout, record.resume, attempt_id=record.attempt_id)

    def advance(
        self,
        attempt_id: str,
        to_state: JournalState,
        *,
        resume: ResumeDescriptor | None = None,
        checkpoint_dir: str | None = None,
        durable_commit_token: str | None = None,
        consents: list[Consent] | None = None,
        degraded: Degraded | None = None,
        clock: ClockNote | None = None,
    ) -> JournalRecord:
        """Apply the journal table, bump the revision and publish atomically (fsync'd).

        Re-running a step that is already recorded with identical facts returns the record
        unchanged, so a coordinator restarted after a crash can repeat its last step.
        """
        _maintenance_dir(self.layout)
        prev = self.load()
        record = next_record(
            prev,
            attempt_id,
            to_state,
            now=utc_now(),
            resume=resume,
            checkpoint_dir=checkpoint_dir,
            durable_commit_token=durable_commit_token,
            consents=consents,
            degraded=degraded,
            clock=clock,
        )
        if record is prev:
            return record
        # The journal must never point at a document that is not there: re-prove it before the
        # write. A degraded record is exempt because degrading is how a missing document is
        # reported.
        if record.resume is not None and record.state != "degraded":
            read_resume_document(self.layout, record.resume, attempt_id=record.attempt_id)
        write_private_atomic(self.path, encode_journal(record))
        return record

    def discard(self, attempt_id: str) -> None:
        """Remove the journal of an abandoned cut, a retired resume or an acknowledged
        degradation. resume.json stays: it is the evidence a rollback still needs."""
        record = self.load()
        if record is None:
            return
        if record.attempt_id != attempt_id:
            raise Refusal(
                Code.ATTEMPT_MISMATCH,
                f"maintenance journal belongs to attempt {record.attempt_id}; refusing to discard "
                "it "
                f"for attempt {attempt_id}",
                "name the attempt the journal records",
            )
        if record.state not in DISCARDABLE_STATES:
            raise IllegalTransition(
                "maintenance journal",
                record.state,
                "discard",
                "seats of this attempt may be stopped and waiting; only a cut that never "
                "committed, a retired resume or a degraded attempt can be discarded",
                "continue the attempt, or degrade it with a recourse first",
            )
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return
        fsync_dir(self.path.parent)
