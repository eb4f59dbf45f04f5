"""Maintenance states: the daemon's fence and the coordinator's journal, as tables.

Two rules, borrowed from h11. Everything that decides whether a maintenance step is legal lives
in this module; the daemon and the CLI only perform the effects around a transition (stopping a
child, fsyncing a file). And nothing here performs I/O: callers feed events in and read the new
state out, so the tables can be driven directly by tests without a daemon.

Theory of operation
-------------------

The daemon (one machine per manager):

    active --prepare--> preserving --commit--> preserving --stopped--> preserved
       ^                    |
       +------abort---------+   (only while no child has been told to stop)

    resume-required --resume--> resuming --commit-resume--> awaiting-finalize --finalize--> active

`prepare` is the fence. The daemon applies it before its first await, which is what makes the
in-flight counter sound: lifecycle work (spawn, stop-seat, a crash restart, a detached teardown)
is admitted only by `check_lifecycle`, and the daemon increments its in-flight counter in the
same synchronous step as that check. So by the time `prepare` has moved the state out of
`active`, every piece of work that got in has already counted itself, nothing new can get in,
and the drain (wait until the counter is zero) sees all of it. The counter lives in the daemon,
because only the daemon knows when a piece of work ends; this machine only answers "may work
start now?".

`commit` marks the point of no return. Once the daemon has been told to hard-stop children,
`abort` is illegal: a half-stopped set of seats cannot be handed back as if nothing happened. An
abort is also refused while preparation or accepted work is still draining, because the plan
being abandoned would race work that is still finishing. Each `prepare` from `active` and each
`abort` advances `generation`, so a preparation task that wakes up after its attempt was
abandoned can tell and stop.

A daemon started for a resume begins in `resume-required`, bound to one attempt. Only the resume
operations of that attempt are admitted until `finalize`; ordinary work is fenced the whole
time. `commit-resume` needs a successful activation first (`activated`), and is idempotent in
`awaiting-finalize`. Tokens and inventories are the daemon's to compare; the machine binds the
attempt.

The coordinator's journal (one record on disk, `JournalRecord`):

    (absent) --begin-cut--> cut-intent --record-commit--> cut-committed --complete-cut--> ready
    ready or (absent) --begin-resume--> resume-intent --activate--> resume-active
        --record-resume-commit--> resume-committed --retire--> retired
    any non-terminal --degrade--> degraded (with a reason and the operator's recourse)

`retired` and `degraded` are terminal. A journal is removed only from `cut-intent` (the cut was
abandoned before its manager committed), `retired` (consumed) or `degraded` (the operator took
the recourse). Re-running a step whose state is already recorded with identical facts is a
no-op, which is what lets a coordinator that crashed continue from what the journal says.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, get_args

import msgspec

from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError, Refusal
from protocol.inventory import INVENTORY_CAP, AbsPath, AttemptId, Digest, Instant, SeatName
from protocol.names import CommitTokenField, check_attempt_id
from protocol.refusals import Code

# -- errors --------------------------------------------------------------------------------------


class IllegalTransition(Refusal):
    """An event the current state does not allow. Names the machine, the state and the event."""

    def __init__(
        self, machine: str, state: str, event: str, reason: str = "", cure: str = ""
    ) -> None:
        self.machine = machine
        self.state = state
        self.event = event
        self.reason = reason
        message = f'{machine} state "{state}" does not allow event "{event}"'
        if reason:
            message += f": {reason}"
        super().__init__(Code.ILLEGAL_TRANSITION, message, cure)


# -- the daemon's maintenance machine ------------------------------------------------------------

MaintenanceState = Literal[
    "active", "preserving", "preserved", "resume-required", "resuming", "awaiting-finalize"
]
MaintenanceEvent = Literal[
    "prepare", "commit", "stopped", "abort", "resume", "activated", "commit-resume", "finalize"
]

MAINTENANCE_TRANSITIONS: Final[dict[MaintenanceState, dict[MaintenanceEvent, MaintenanceState]]] = {
    "active": {"prepare": "preserving"},
    "preserving": {
        # A repeated prepare by the same attempt joins the one in flight.
        "prepare": "preserving",
        # Commit has begun: children are being hard-stopped; the state changes only once every
        # exit is proven (`stopped`), and a failed stop leaves the manager fenced here.
        "commit": "preserving",
        "stopped": "preserved",
        "abort": "active",
    },
    # Terminal for the cut: the daemon exits; repeats of the same attempt are answered as done.
    "preserved": {"prepare": "preserved", "commit": "preserved"},
    "resume-required": {"resume": "resuming"},
    "resuming": {
        "resume": "resuming",
        "activated": "resuming",
        "commit-resume": "awaiting-finalize",
    },
    "awaiting-finalize": {"commit-resume": "awaiting-finalize", "finalize": "active"},
}

PRESERVATION_EVENTS: Final = frozenset({"prepare", "commit", "stopped", "abort"})

_CURE_FINISH_CUT = "finish the cut (cotal down --preserve-state) or abort it before commit"
_CURE_RESUME = "finish the resume (cotal up --restore) with the attempt the daemon was started for"


# -- adoption into a running mesh ----------------------------------------------------------------
#
# `cotal up --restore` at a root whose manager runs: the same three resume ops, answered by a
# manager in `active` that stays `active` (every seat it already runs carries on, and the
# adoption is lifecycle work the fence counts). This machine binds the ops to one attempt at a
# time; a cut is refused while an adoption is between its first op and its finalize, since its
# plan would catch seats the adoption has not committed.

AdoptionState = Literal["idle", "adopting", "adopted", "committed"]
AdoptionEvent = Literal["resume", "activated", "rollback", "commit-resume", "finalize"]

ADOPTION_TRANSITIONS: Final[dict[AdoptionState, dict[AdoptionEvent, AdoptionState]]] = {
    "idle": {"resume": "adopting"},
    # A failed adoption stops what it launched and lets go of the attempt; a rerun starts over.
    "adopting": {"activated": "adopted", "rollback": "idle"},
    # Repeats of an op already answered keep the state (the daemon answers them from its
    # record); a coordinator that died between two ops continues from here.
    "adopted": {"resume": "adopted", "commit-resume": "committed"},
    "committed": {"resume": "committed", "commit-resume": "committed", "finalize": "idle"},
}


class Adoption:
    """Applies `ADOPTION_TRANSITIONS` for one active manager."""

    def __init__(self) -> None:
        self.state: AdoptionState = "idle"
        self.attempt_id: str | None = None

    def apply(self, event: AdoptionEvent, attempt_id: str) -> AdoptionState:
        check_attempt_id(attempt_id)
        target = ADOPTION_TRANSITIONS[self.state].get(event)
        if self.state != "idle" and attempt_id != self.attempt_id:
            raise Refusal(
                Code.ADOPTION_BUSY,
                f"this manager is adopting attempt {self.attempt_id}; refusing attempt "
                f"{attempt_id} until it is finalized",
                f"finish that adoption first (`cotal up --restore` of attempt {self.attempt_id})",
            )
        if target is None:
            raise IllegalTransition(
                "adoption",
                self.state,
                event,
                f"adoption of attempt {attempt_id} is {self.state}",
                "rerun `cotal up --restore` for the attempt; it continues from its journal",
            )
        self.attempt_id = None if target == "idle" else attempt_id
        self.state = target
        return target


# -- a cut of some seats --------------------------------------------------------------------------
#
# `cotal down --preserve-state --seat NAME`: the daemon table's preservation steps for the named
# seats only, in a manager that stays `active`. The fence is per seat: the named seats take no
# new turn and no lifecycle work (`seat-fenced`), every other seat carries on, and spawns of new
# seats are admitted. One cut of some seats at a time: another `prepare` while one is preserving
# is refused `cut-under-way`; once sealed (`preserved`) the next attempt may begin.

SeatCutState = Literal["idle", "preserving", "preserved"]

SEAT_CUT_TRANSITIONS: Final[dict[SeatCutState, dict[MaintenanceEvent, SeatCutState]]] = {
    "idle": {"prepare": "preserving"},
    "preserving": {
        "prepare": "preserving",
        "commit": "preserving",
        "stopped": "preserved",
        # Only while no seat has been told to stop (`commit_started`), as for the whole mesh.
        "abort": "idle",
    },
    # The sealed attempt answers repeats; a new attempt starts from here as from idle.
    "preserved": {"prepare": "preserving", "commit": "preserved"},
}


class SeatCut:
    """Applies `SEAT_CUT_TRANSITIONS` for one active manager."""

    def __init__(self) -> None:
        self.state: SeatCutState = "idle"
        self.attempt_id: str | None = None
        self.seats: frozenset[str] = frozenset()
        self.commit_started = False

    def fences(self, seat: str) -> bool:
        return self.state == "preserving" and seat in self.seats

    def apply(
        self, event: MaintenanceEvent, attempt_id: str, seats: frozenset[str] = frozenset()
    ) -> SeatCutState:
        check_attempt_id(attempt_id)
        target = SEAT_CUT_TRANSITIONS[self.state].get(event)
        new_attempt = event == "prepare" and self.state in ("idle", "preserved")
        if not new_attempt and attempt_id != self.attempt_id:
            if event == "prepare":
                raise Refusal(
                    Code.CUT_UNDER_WAY,
                    f"a cut of seat(s) {', '.join(sorted(self.seats))} (attempt "
                    f"{self.attempt_id}) is under way; one cut of some seats at a time",
                    "let it finish (or `cotal down --preserve-state --abort` it before its "
                    "commit), then cut again; nothing was fenced",
                )
            raise Refusal(
                Code.ATTEMPT_MISMATCH,
                f"attempt {attempt_id} is not the cut of some seats this manager holds "
                f"({self.attempt_id or 'none'})",
                f"use attempt {self.attempt_id}" if self.attempt_id else "",
            )
        if target is None:
            raise IllegalTransition("seat cut", self.state, event)
        if event == "abort" and self.commit_started:
            raise IllegalTransition(
                "seat cut",
                self.state,
                event,
                f"cut {attempt_id} has begun stopping its seats and cannot be aborted",
                "finish it (cotal down --preserve-state); its seats resume from the checkpoint",
            )
        if new_attempt:
            self.attempt_id, self.seats, self.commit_started = attempt_id, seats, False
        elif event == "commit":
            self.commit_started = True
        elif event == "abort":
            self.attempt_id, self.seats, self.commit_started = None, frozenset(), False
        self.state = target
        return target


class Maintenance:
    """Applies `MAINTENANCE_TRANSITIONS` plus the guards a table cannot express."""

    def __init__(self, *, resume_attempt_id: str | None = None) -> None:
        self.state: MaintenanceState = "resume-required" if resume_attempt_id else "active"
        self.attempt_id: str | None = resume_attempt_id
        self.generation = 0
        self.commit_started = False
        self.activated = False
        self.adoption = Adoption()
        self.seat_cut = SeatCut()

    def check_lifecycle(self, *, resume_operation: bool = False, seat: str | None = None) -> None:
        """The fence. Admits work, or raises; the caller counts admitted work synchronously.
        `seat`: the one seat the work touches, which a cut of some seats may fence alone."""
        if self.state == "active":
            if seat is not None and self.seat_cut.fences(seat):
                raise Refusal(
                    Code.SEAT_FENCED,
                    f"seat {seat} is being cut (attempt {self.seat_cut.attempt_id}); it takes no "
                    "lifecycle work until the cut is sealed or aborted",
                    "wait for `cotal down --preserve-state --seat` to finish, or abort it",
                )
            return
        if self.state in ("resume-required", "resuming", "awaiting-finalize"):
            if resume_operation and self.state != "awaiting-finalize":
                return
            raise Refusal(
                Code.FENCED,
                f"manager is waiting for resume attempt {self.attempt_id}; ordinary "
                "lifecycle/control work is fenced",
                _CURE_RESUME,
            )
        raise Refusal(
            Code.FENCED,
            f"manager is in {self.state} mode; new lifecycle/control work is fenced",
            _CURE_FINISH_CUT,
        )

    def apply(
        self, event: MaintenanceEvent, attempt_id: str, *, draining: bool = False
    ) -> MaintenanceState:
        """Apply `event` for `attempt_id`. `draining` says preparation or accepted work is still
        in flight (the daemon's counter), which only `abort` consults."""
        check_attempt_id(attempt_id)
        row = MAINTENANCE_TRANSITIONS[self.state]
        target = row.get(event)
        if target is None:
            raise IllegalTransition(
                "maintenance", self.state, event, self._reason(event, attempt_id)
            )
        self._check_attempt(event, attempt_id)
        if event == "abort":
            if draining:
                raise IllegalTransition(
                    "maintenance",
                    self.state,
                    event,
                    f"preservation attempt {attempt_id} is still preparing or draining accepted "
                    "lifecycle work and cannot be aborted",
                    "retry the abort once the drain has finished",
                )
            if self.commit_started:
                raise IllegalTransition(
                    "maintenance",
                    self.state,
                    event,
                    f"preservation attempt {attempt_id} has begun stopping children and cannot "
                    "return to active mode",
                    "finish the cut (cotal down --preserve-state); its seats resume from the "
                    "checkpoint",
                )
        if event == "commit-resume" and self.state == "resuming" and not self.activated:
            raise IllegalTransition(
                "maintenance",
                self.state,
                event,
                f"resume attempt {attempt_id} has no successful activation to commit",
                "retry resume-preserved until every retained seat is live",
            )

        if event == "prepare" and self.state == "active" and self.seat_cut.state == "preserving":
            raise Refusal(
                Code.CUT_UNDER_WAY,
                f"a cut of seat(s) {', '.join(sorted(self.seat_cut.seats))} (attempt "
                f"{self.seat_cut.attempt_id}) is under way",
                "let it finish (or abort it before its commit), then cut the mesh",
            )
        if event == "prepare" and self.state == "active" and self.adoption.state != "idle":
            raise Refusal(
                Code.ADOPTION_UNDER_WAY,
                f"preservation refused: this manager is adopting attempt "
                f"{self.adoption.attempt_id}, whose seats are not committed yet",
                "let that `cotal up --restore` finish (or rerun it), then cut; nothing was fenced",
            )
        if event == "prepare" and self.state == "active":
            self.attempt_id = attempt_id
            self.generation += 1
            self.commit_started = False
        elif event == "commit":
            self.commit_started = True
        elif event == "abort":
            self.generation += 1
            self.attempt_id = None
            self.commit_started = False
        elif event == "activated":
            self.activated = True
        elif event == "finalize":
            self.attempt_id = None
            self.activated = False
        self.state = target
        return target

    def _check_attempt(self, event: MaintenanceEvent, attempt_id: str) -> None:
        bound = self.attempt_id
        if event == "prepare" and self.state == "active":
            return
        if attempt_id == bound:
            return
        if event == "prepare":
            message = (
                f"manager is fenced for preservation attempt {bound}; "
                f"refusing different attempt {attempt_id}"
            )
        elif event in ("commit", "stopped"):
            message = f"preservation attempt {attempt_id} was not prepared by this manager"
        elif event == "abort":
            message = f"preservation attempt {attempt_id} is not the active manager attempt"
        else:
            message = f"manager expects resume attempt {bound or '<none>'}, not {attempt_id}"
        raise Refusal(Code.ATTEMPT_MISMATCH, message, f"use attempt {bound}" if bound else "")

    def _reason(self, event: MaintenanceEvent, attempt_id: str) -> str:
        if event == "abort" and self.state == "preserved":
            return (
                f"preservation attempt {attempt_id} has begun stopping children and cannot return "
                "to active mode"
            )
        if event in PRESERVATION_EVENTS and self.state in (
            "resume-required",
            "resuming",
            "awaiting-finalize",
        ):
            return f"manager is waiting for resume attempt {self.attempt_id}"
        if event not in PRESERVATION_EVENTS and self.state in ("active", "preserving", "preserved"):
            return "this manager was not started for a resume"
        return ""


# -- the coordinator's journal -------------------------------------------------------------------

JournalState = Literal[
    "cut-intent",
    "cut-committed",
    "ready",
    "resume-intent",
    "resume-active",
    "resume-committed",
    "retired",
    "degraded",
]
JournalEvent = Literal[
    "begin-cut",
    "record-commit",
    "complete-cut",
    "begin-resume",
    "activate",
    "record-resume-commit",
    "retire",
    "degrade",
]
ABSENT: Final = "absent"

JOURNAL_TRANSITIONS: Final[dict[str, dict[JournalEvent, JournalState]]] = {
    ABSENT: {"begin-cut": "cut-intent", "begin-resume": "resume-intent"},
    "cut-intent": {"record-commit": "cut-committed", "degrade": "degraded"},
    "cut-committed": {"complete-cut": "ready", "degrade": "degraded"},
    # Same-root resume continues the cut's journal; a destination root starts from absent.
    "ready": {"begin-resume": "resume-intent", "degrade": "degraded"},
    "resume-intent": {"activate": "resume-active", "degrade": "degraded"},
    "resume-active": {"record-resume-commit": "resume-committed", "degrade": "degraded"},
    "resume-committed": {"retire": "retired", "degrade": "degraded"},
    "retired": {},
    "degraded": {},
}

# Every target state is reached by exactly one event, so an advance named by its target state
# still reports the event it attempted.
EVENT_FOR: Final[dict[JournalState, JournalEvent]] = {
    target: event for row in JOURNAL_TRANSITIONS.values() for event, target in row.items()
}
JOURNAL_STATES: Final[tuple[JournalState, ...]] = get_args(JournalState)

# Each state by name, so the coordinators compare and advance without spelling one out: a typo
# in a literal is a state no table knows, and would silently never match.
CUT_INTENT: Final = "cut-intent"
CUT_COMMITTED: Final = "cut-committed"
READY: Final = "ready"
RESUME_INTENT: Final = "resume-intent"
RESUME_ACTIVE: Final = "resume-active"
RESUME_COMMITTED: Final = "resume-committed"
RETIRED: Final = "retired"
DEGRADED: Final = "degraded"

TERMINAL_STATES: Final[frozenset[JournalState]] = frozenset({RETIRED, DEGRADED})
# What `Journal.discard` may remove: an abandoned intent, or an attempt that is over.
DISCARDABLE_STATES: Final[frozenset[JournalState]] = frozenset({CUT_INTENT, RETIRED, DEGRADED})
# The states each kind of attempt owns (`JournalRecord.kind`); `degraded` belongs to either.
CUT_STATES: Final[frozenset[JournalState]] = frozenset({CUT_INTENT, CUT_COMMITTED, READY})
RESUME_STATES: Final[frozenset[JournalState]] = frozenset(
    {RESUME_INTENT, RESUME_ACTIVE, RESUME_COMMITTED, RETIRED}
)
# A cut that stopped part-way: only `cotal down --preserve-state` finishes it.
CUT_UNDER_WAY: Final[frozenset[JournalState]] = frozenset({CUT_INTENT, CUT_COMMITTED})
# A resume that stopped part-way: only `cotal up --restore` of its checkpoint finishes it.
RESUME_UNDER_WAY: Final[frozenset[JournalState]] = RESUME_STATES - TERMINAL_STATES
# An attempt under way still reads its checkpoint directory, so nothing may remove it.
UNDER_WAY: Final[frozenset[JournalState]] = CUT_UNDER_WAY | RESUME_UNDER_WAY
# The journal still needs the attempt's checkpoint: under way, or sealed and not restored.
NEEDS_CHECKPOINT: Final[frozenset[JournalState]] = UNDER_WAY | {READY}
# A resume whose manager adopted the seats, which may have worked since: a rerun relaunches a
# manager over the trees as they are and never restores them again.
RESUME_ADOPTED: Final[frozenset[JournalState]] = frozenset({RESUME_ACTIVE, RESUME_COMMITTED})

JOURNAL_CAP = 256 * 1024
RESUME_FILE: Final = "resume.json"

CommitToken = CommitTokenField
Text = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]


class ResumeDescriptor(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """Names the exact bytes of resume.json: the journal trusts the document only through this."""

    version: Literal["cotal-manager-resume/v1", "cotal-manager-resume/v2"]
    file: Literal["resume.json"]
    bytes: Annotated[int, msgspec.Meta(ge=1, le=INVENTORY_CAP)]
    sha256: Digest


class Consent(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """An operator's exercised override of the recency gate, kept as evidence."""

    seat: SeatName
    captured_at: Instant
    age_ms: Annotated[int, msgspec.Meta(ge=0)]
    horizon_ms: Annotated[int, msgspec.Meta(gt=0)]


class Degraded(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    reason: Text
    recourse: Text


class JournalRecord(
    msgspec.Struct,
    forbid_unknown_fields=True,
    rename="camel",
    frozen=True,
    kw_only=True,
    omit_defaults=True,
):
    version: Literal[1]
    revision: Annotated[int, msgspec.Meta(ge=1)]
    attempt_id: AttemptId
    kind: Literal["cut", "resume"]
    state: JournalState
    updated_at: Instant
    resume: ResumeDescriptor | None
    consents: Annotated[list[Consent], msgspec.Meta(max_length=50)]
    checkpoint_dir: AbsPath | None = None
    durable_commit_token: CommitToken | None = None
    degraded: Degraded | None = None

    def __post_init__(self) -> None:
        if self.state in CUT_STATES and self.kind != "cut":
            raise ValueError(f"state {self.state} belongs to a cut, not a {self.kind}")
        if self.state in RESUME_STATES and self.kind != "resume":
            raise ValueError(f"state {self.state} belongs to a resume, not a {self.kind}")
        if self.state != "degraded" and self.resume is None:
            raise ValueError(f"state {self.state} requires the resume document descriptor")
        if self.state in ("resume-committed", "retired") and self.durable_commit_token is None:
            raise ValueError(f"state {self.state} requires durableCommitToken")
        if (self.state == "degraded") != (self.degraded is not None):
            raise ValueError("degraded (reason and recourse) is present exactly in state degraded")


def decode_journal(data: bytes, *, what: str = "maintenance journal") -> JournalRecord:
    return decode_json(data, JournalRecord, what=what, cap=JOURNAL_CAP)


def encode_journal(record: JournalRecord) -> bytes:
    return encode_json(record)


_CURE_JOURNAL = "the journal names what this attempt already did; continue it or discard it first"


def next_record(
    prev: JournalRecord | None,
    attempt_id: str,
    to_state: JournalState,
    *,
    now: str,
    resume: ResumeDescriptor | None = None,
    checkpoint_dir: str | None = None,
    durable_commit_token: str | None = None,
    consents: list[Consent] | None = None,
    degraded: Degraded | None = None,
) -> JournalRecord:
    """The record after advancing `prev` to `to_state`, or `prev` itself for an identical retry.

    A keyword left as None carries the previous value forward. A fact already recorded may be
    repeated but never replaced: a journal that changed its mind mid-attempt is not evidence.
    """
    state = prev.state if prev is not None else ABSENT
    event = EVENT_FOR[to_state]
    if (
        prev is not None
        and prev.attempt_id != attempt_id
        and not (event == "begin-resume" and state == "ready")
    ):
        raise Refusal(
            Code.ATTEMPT_MISMATCH,
            f"maintenance journal belongs to attempt {prev.attempt_id} (state {prev.state}); "
            f"refusing attempt {attempt_id}",
            _CURE_JOURNAL,
        )
    given = {
        "resume": resume,
        "checkpointDir": checkpoint_dir,
        "durableCommitToken": durable_commit_token,
        "consents": consents,
        "degraded": degraded,
    }
    if prev is not None and prev.state == to_state:
        current = {
            "resume": prev.resume,
            "checkpointDir": prev.checkpoint_dir,
            "durableCommitToken": prev.durable_commit_token,
            "consents": prev.consents,
            "degraded": prev.degraded,
        }
        for name, value in given.items():
            if value is not None and value != current[name]:
                raise Refusal(
                    Code.JOURNAL_MISMATCH,
                    f"maintenance journal already records {to_state} for attempt {attempt_id} "
                    f"with a different {name}",
                    _CURE_JOURNAL,
                )
        return prev
    if event not in JOURNAL_TRANSITIONS[state]:
        raise IllegalTransition("maintenance journal", state, event)

    def keep(name: str, old: object, new: object) -> None:
        if old not in (None, []) and new is not None and new != old:
            raise Refusal(
                Code.JOURNAL_MISMATCH,
                f"maintenance journal for attempt {attempt_id} already records its {name}; "
                "refusing to replace it",
                _CURE_JOURNAL,
            )

    if prev is not None:
        keep("resume", prev.resume, resume)
        keep("checkpointDir", prev.checkpoint_dir, checkpoint_dir)
        keep("durableCommitToken", prev.durable_commit_token, durable_commit_token)
        keep("consents", prev.consents, consents)
    if durable_commit_token is not None and to_state not in ("resume-committed", "retired"):
        raise IllegalTransition(
            "maintenance journal",
            state,
            event,
            "a durable commit token is recorded only at resume-committed",
        )
    if (degraded is not None) != (to_state == "degraded"):
        raise IllegalTransition(
            "maintenance journal",
            state,
            event,
            "a reason and a recourse are recorded exactly when degrading",
        )

    if to_state == "cut-intent":
        kind: Literal["cut", "resume"] = "cut"
    elif to_state == "resume-intent":
        kind = "resume"
    else:
        assert prev is not None  # only begin-* leave ABSENT
        kind = prev.kind
    try:
        record = JournalRecord(
            version=1,
            revision=(prev.revision + 1) if prev is not None else 1,
            attempt_id=attempt_id,
            kind=kind,
            state=to_state,
            updated_at=now,
            resume=resume if resume is not None else (prev.resume if prev else None),
            consents=list(consents if consents is not None else (prev.consents if prev else [])),
            checkpoint_dir=checkpoint_dir
            if checkpoint_dir is not None
            else (prev.checkpoint_dir if prev else None),
            durable_commit_token=durable_commit_token
            if durable_commit_token is not None
            else (prev.durable_commit_token if prev else None),
            degraded=degraded,
        )
    except ValueError as exc:  # the record's own consistency rules (__post_init__)
        raise IllegalTransition("maintenance journal", state, event, str(exc)) from None
    # Constructing a Struct does not run its field constraints; a round trip does, so a record
    # this function returns is one `decode_journal` will accept after a crash.
    try:
        return decode_journal(encode_journal(record), what="new maintenance journal record")
    except DecodeError as exc:
        raise IllegalTransition("maintenance journal", state, event, exc.message) from None


# -- reruns: what each command does with the journal it finds -------------------------------------

Command = Literal["cut", "abort", "restore", "discard", "up", "down"]
"""`cut` is `cotal down --preserve-state`, `abort` adds `--abort`, `restore` is `cotal up
--restore`, `discard` is `cotal checkpoint discard` of the journal's own attempt, `up` and `down`
are the plain commands."""
COMMANDS: Final[tuple[Command, ...]] = get_args(Command)

ActionKind = Literal["continue", "join", "refuse", "fresh"]
RefusalCode = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")]


class Action(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One cell of the rerun table.

    `continue`: the journal's attempt is this command's own, cut short (or, for `abort` and
    `discard`, the one it ends); the run carries it on from the journaled state. `join`: the
    other half journaled the attempt and this command carries it on as the same attempt (a
    resume of this root's own sealed cut). `fresh`: the journal holds nothing this command
    continues; it acts on its own (a new attempt, a plain start or stop). `refuse`: the journal
    forbids the command, with the code and the cure.
    """

    kind: ActionKind
    code: RefusalCode | None = None
    # A refusal's message, with `{attempt}` and `{state}` of the journal filled in.
    what: str = ""
    cure: str = ""
    # The command removes the journal's record: the attempt ends here, or an ended one is
    # cleared before a new attempt begins.
    drops: bool = False
    # An embedded broker that died under the attempt is started again before the rerun, which
    # may still need it (a fence's custody reads, a resume's commit).
    revive_broker: bool = False
    # The attempt already reached this command's end: the rerun reports it and changes nothing.
    finished: bool = False
    # A plain `cotal up` starts a fresh mesh beside an attempt it will not finish, never
    # silently: `cotal status` lists the attempt as waiting, with the command that finishes it.
    warns: bool = False

    def refusal(self, *, attempt: str, state: str) -> Refusal:
        assert self.kind == "refuse" and self.code is not None
        return Refusal(self.code, self.what.format(attempt=attempt, state=state), self.cure)


def _refusing(code: str, what: str, cure: str) -> Action:
    # Converted rather than constructed: a Struct's constructor skips field constraints, and
    # the code's shape is one.
    return msgspec.convert(
        {"kind": "refuse", "code": code, "what": what, "cure": cure}, Action, strict=True
    )


_CONTINUE: Final = Action(kind="continue")
_FRESH: Final = Action(kind="fresh")
_UP_WARNS: Final = Action(kind="fresh", warns=True)
_CURE_RERUN_CUT: Final = "rerun `cotal down --preserve-state` to finish the cut"
_CURE_FINISH_RESUME: Final = "finish that resume (cotal up --restore) first"
_CUT_BUSY: Final = _refusing(
    Code.JOURNAL_BUSY,
    "the maintenance journal is at {state} for attempt {attempt}",
    _CURE_FINISH_RESUME,
)
_ABORT_BUSY: Final = _refusing(
    Code.JOURNAL_BUSY,
    "the maintenance journal is at {state} for resume attempt {attempt}; there is no cut to abort",
    _CURE_FINISH_RESUME,
)
_ABORT_COMMITTED: Final = (
    "cut {attempt} is already committed (journal {state}); its seats were stopped and captured, "
    "so it cannot be aborted"
)
# Only a sealed checkpoint passes admission, and a cut's journal becomes a resume's only at
# `ready`: the journal forbids the begin-resume a cut under way has no transition for.
_RESTORE_MID_CUT: Final = _refusing(
    Code.ILLEGAL_TRANSITION,
    'maintenance journal state "{state}" does not allow event "begin-resume"',
    "finish the cut first (`cotal down --preserve-state`), then resume its sealed checkpoint",
)
_DISCARD_NEEDED: Final = (
    "this root's maintenance journal is at {state} for attempt {attempt}: the attempt still "
    "reads this checkpoint"
)
_DISCARD_MID_CUT: Final = _refusing(
    Code.JOURNAL_NEEDS_IT,
    _DISCARD_NEEDED,
    "a cut stopped part-way: finish it with `cotal down --preserve-state`, or abandon it, "
    "then discard",
)
_DISCARD_MID_RESUME: Final = _refusing(
    Code.JOURNAL_NEEDS_IT,
    _DISCARD_NEEDED,
    "a resume stopped part-way: finish it with `cotal up --restore DIR`, or abandon it, then "
    "discard",
)
# A resume under way: a rerun restarts a broker that died under it, and joins the manager
# still fenced to the attempt when one answers (else continues without one).
_RESUME_CONTINUES: Final = Action(kind="continue", revive_broker=True)

# Rows are the journal's state (or no journal), columns the command. For `restore`, a cell
# other than `fresh` holds for the checkpoint of the journal's own attempt: a journal at any
# other attempt that is not over is refused `journal-busy` before its state is consulted. For
# `discard`, the cell holds when the named checkpoint is the journal's own attempt; any other
# leaves the journal alone.
_OVER: dict[Command, Action] = {
    "cut": Action(kind="fresh", drops=True),
    "abort": _FRESH,
    "restore": Action(kind="fresh", drops=True),
    "discard": Action(kind="continue", drops=True),
    "up": _FRESH,
    "down": _FRESH,
}

RERUN: Final[dict[str, dict[Command, Action]]] = {
    ABSENT: {
        # `cut` mints a new attempt, unless the manager is fenced for one no journal names
        # (its coordinator died before journaling): then it finishes that one.
        "cut": _FRESH,
        # Nothing journaled: an orphaned fence is lifted if the manager holds one.
        "abort": _FRESH,
        "restore": _FRESH,
        "discard": _FRESH,
        "up": _FRESH,
        "down": _FRESH,
    },
    CUT_INTENT: {
        # Through the manager when it still holds the attempt, offline when it died.
        "cut": Action(kind="continue", revive_broker=True),
        # Before the commit began only (the manager's `commitStarted` decides at run time).
        "abort": Action(kind="continue", drops=True),
        "restore": _RESTORE_MID_CUT,
        "discard": _DISCARD_MID_CUT,
        "up": _UP_WARNS,
        "down": _FRESH,
    },
    CUT_COMMITTED: {
        "cut": _CONTINUE,
        "abort": _refusing(Code.COMMIT_BEGUN, _ABORT_COMMITTED, _CURE_RERUN_CUT),
        "restore": _RESTORE_MID_CUT,
        "discard": _DISCARD_MID_CUT,
        "up": _UP_WARNS,
        "down": _FRESH,
    },
    READY: {
        # Already sealed: reported, unless a manager now runs seats beside it, which the sealed
        # attempt does not hold (`sealed-cut-waiting`, decided at run time).
        "cut": Action(kind="continue", finished=True),
        "abort": _refusing(
            Code.COMMIT_BEGUN, _ABORT_COMMITTED, "resume it with `cotal up --restore`"
        ),
        # Same-root resume: the cut's journal goes on as the resume's.
        "restore": Action(kind="join"),
        "discard": Action(kind="continue", drops=True),
        "up": _UP_WARNS,
        "down": _FRESH,
    },
    RESUME_INTENT: {
        "cut": _CUT_BUSY,
        "abort": _ABORT_BUSY,
        # No manager ran the seats yet: the rerun admits, claims and restores again.
        "restore": _RESUME_CONTINUES,
        "discard": _DISCARD_MID_RESUME,
        "up": _UP_WARNS,
        "down": _FRESH,
    },
    RESUME_ACTIVE: {
        "cut": _CUT_BUSY,
        "abort": _ABORT_BUSY,
        # RESUME_ADOPTED: a manager is relaunched over the trees as the seats left them.
        "restore": _RESUME_CONTINUES,
        "discard": _DISCARD_MID_RESUME,
        "up": _UP_WARNS,
        "down": _FRESH,
    },
    RESUME_COMMITTED: {
        "cut": _CUT_BUSY,
        "abort": _ABORT_BUSY,
        "restore": _RESUME_CONTINUES,
        "discard": _DISCARD_MID_RESUME,
        "up": _UP_WARNS,
        "down": _FRESH,
    },
    # The resume is over: its record is cleared and a new attempt begins.
    RETIRED: _OVER,
    # The same, but the operator's recourse is shown until the attempt is discarded.
    DEGRADED: {**_OVER, "up": _UP_WARNS},
}


def rerun(state: str | None, command: Command) -> Action:
    """What `command` does with a journal at `state` (None: no journal)."""
    return RERUN[ABSENT if state is None else state][command]
