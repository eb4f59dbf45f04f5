"""Maintenance states: the daemon's attempts and the coordinator's journal, as tables.

Two rules, borrowed from h11. Everything that decides whether a maintenance step is legal lives
in this module; the daemon and the CLI only perform the effects around a transition (stopping a
child, fsyncing a file). And nothing here performs I/O: callers feed events in and read the new
state out, so the tables can be driven directly by tests without a daemon.

Theory of operation
-------------------

The daemon runs one attempt machine, keyed by scope (h11 keys one table by role instead of
writing a machine per role). A cut is always "cut this set of seats": some seats (`seats`, and
the manager stays `active`) or every seat (`whole`, after which the daemon exits). A resume is
always "adopt these seats": into a running mesh (`adopt`), or by a manager started for the
attempt and fenced to it until finalize (`restore`). The scopes share their rows and differ
only in the cells `ATTEMPT_TRANSITIONS` gives each:

    cut      idle --prepare--> preserving --commit--> preserving --stopped--> preserved
               ^                   |   ^                 |
               |                   |   +----failed-------+   (the commit ended unsealed)
               +------abort--------+   (before the commit, or after a failed one)
    resume   idle | resume-required --resume--> adopting --activated--> adopted
               --commit-resume--> committed --finalize--> idle

A manager holds one cut and one resume at a time (`Maintenance.cut`, `Maintenance.resume`).
What `status` reports as the manager's state is the attempt of a fencing scope (`whole`,
`restore`) under its daemon name (`DAEMON_STATE`: preserving, preserved, resume-required,
resuming, awaiting-finalize), or `active` when none is held.

`prepare` is the fence. The daemon applies it before its first await, which is what makes the
in-flight counter sound: lifecycle work (spawn, stop-seat, a crash restart, a detached teardown)
is admitted only by `check_lifecycle`, and the daemon increments its in-flight counter in the
same synchronous step as that check. So by the time `prepare` has fenced the manager (a whole
cut) or its seats (a cut of some seats: `seat-fenced`, every other seat carries on), every
piece of work that got in has already counted itself, nothing new can get in, and the drain
sees all of it. The counter lives in the daemon, because only the daemon knows when a piece of
work ends; this machine only answers "may work start now?".

`commit` marks the point of no return for a commit that runs: while the daemon is hard-stopping
children and capturing them, `abort` is illegal, because a half-stopped set of seats cannot be
handed back as if nothing happened. A commit that ends without a seal (`failed`: every seat is
stopped and proven, nothing runs, the evidence is kept) makes `abort` legal again: the daemon
starts the stopped seats again under their uids, in their own sessions and trees (the capture
only read them), and only then applies it. A new `commit` of the attempt closes that door again,
and a sealed cut (`preserved`) is never aborted. A whole cut's abort is also refused while
accepted work is still draining, because the plan being abandoned would race work that is still
finishing. Each cut that begins and each `abort`
advances `generation`, so a preparation task that wakes up after its attempt was abandoned can
tell and stop.

A restore begins in `resume-required`, bound to its attempt. Only the resume operations of that
attempt are admitted until its commit; ordinary work is fenced until `finalize`. An adoption
counts as lifecycle work in a running mesh. Either way `commit-resume` needs a successful
activation (`adopted`) and is idempotent once committed. Tokens and inventories are the
daemon's to compare; the machine binds the attempt.

The rules between the two attempts are guards, each written once: a cut does not begin while
an adoption is under way (its plan would catch seats the adoption has not committed), nor
while another cut is; a cut or an adoption begins only where the fence admits work.

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

from typing import Annotated, Final, Literal, NamedTuple, TypeVar, get_args

import msgspec

from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError, Refusal
from protocol.inventory import INVENTORY_CAP, AbsPath, AttemptId, Digest, Instant, SeatName
from protocol.names import CommitTokenField, check_attempt_id
from protocol.refusals import Code

_T = TypeVar("_T")

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


# -- the daemon's attempt machine -----------------------------------------------------------------

Scope = Literal["whole", "seats", "restore", "adopt"]
AttemptState = Literal[
    "idle", "preserving", "preserved", "resume-required", "adopting", "adopted", "committed"
]
CutEvent = Literal["prepare", "commit", "stopped", "failed", "abort"]
ResumeEvent = Literal["resume", "activated", "rollback", "commit-resume", "finalize"]
AttemptEvent = Literal[CutEvent, ResumeEvent]
# The manager's own state, as `status` reports it.
MaintenanceState = Literal[
    "active", "preserving", "preserved", "resume-required", "resuming", "awaiting-finalize"
]

Row = dict[AttemptEvent, AttemptState]

_CUT_ROWS: Final[dict[AttemptState, Row]] = {
    "idle": {"prepare": "preserving"},
    "preserving": {
        # A repeated prepare by the same attempt joins the one in flight.
        "prepare": "preserving",
        # Commit has begun: seats are being hard-stopped; the state changes only once every
        # exit is proven (`stopped`), and a failed stop leaves the attempt fenced here.
        "commit": "preserving",
        "stopped": "preserved",
        # The commit ended without a seal: its seats are stopped and proven, no capture runs,
        # and the next commit of the attempt captures again (or an abort restarts them).
        "failed": "preserving",
        # Before the commit began (`commit_started`), or after it failed (`commit_failed`) once
        # the daemon has started the stopped seats again.
        "abort": "idle",
    },
}
_RESUME_ROWS: Final[dict[AttemptState, Row]] = {
    # Repeats of an op already answered keep the state (the daemon answers them from its
    # record); a coordinator that died between two ops continues from here.
    "adopted": {"resume": "adopted", "commit-resume": "committed"},
    "committed": {"resume": "committed", "commit-resume": "committed", "finalize": "idle"},
}

ATTEMPT_TRANSITIONS: Final[dict[Scope, dict[AttemptState, Row]]] = {
    # Sealed, the whole mesh is done and the daemon exits: repeats are answered as done.
    "whole": {**_CUT_ROWS, "preserved": {"prepare": "preserved", "commit": "preserved"}},
    # Sealed, the mesh runs on without the seats; the next cut begins afresh (`OPEN_STATES`).
    "seats": {**_CUT_ROWS, "preserved": {"commit": "preserved"}},
    # Bound from the start and through a failed try, which stops what it launched; the rerun
    # tries again as the same attempt.
    "restore": {
        "idle": {},
        "resume-required": {"resume": "adopting"},
        "adopting": {"resume": "adopting", "activated": "adopted", "rollback": "adopting"},
        **_RESUME_ROWS,
    },
    # A failed adoption stops what it launched and lets go of the attempt; a rerun starts over.
    "adopt": {
        "idle": {"resume": "adopting"},
        "adopting": {"activated": "adopted", "rollback": "idle"},
        **_RESUME_ROWS,
    },
}

# -- named groups (supervisor's states.py): callers ask these, never list states of their own --

CUT_SCOPES: Final[frozenset[Scope]] = frozenset({"whole", "seats"})
# An attempt of these scopes fences the whole manager; its state is the manager's.
FENCING_SCOPES: Final[frozenset[Scope]] = frozenset({"whole", "restore"})
CUT_EVENTS: Final[frozenset[AttemptEvent]] = frozenset(get_args(CutEvent))
# Where a new attempt may take the place of the one held: none held, or a sealed cut of some
# seats (the mesh it left runs on).
OPEN_STATES: Final[dict[Scope, frozenset[AttemptState]]] = {
    "whole": frozenset({"idle"}),
    "seats": frozenset({"idle", "preserved"}),
    "restore": frozenset({"idle"}),
    "adopt": frozenset({"idle"}),
}
# A restore admits its own ops until its commit; after it, only finalize releases it.
ADMITS_RESUME_OPS: Final[frozenset[AttemptState]] = frozenset(
    {"resume-required", "adopting", "adopted"}
)
# Every seat of the resume is live under its uid: there is an activation to commit.
ACTIVATED: Final[frozenset[AttemptState]] = frozenset({"adopted", "committed"})
# The manager's state while an attempt of a fencing scope is at each state.
DAEMON_STATE: Final[dict[AttemptState, MaintenanceState]] = {
    "idle": "active",
    "preserving": "preserving",
    "preserved": "preserved",
    "resume-required": "resume-required",
    "adopting": "resuming",
    "adopted": "resuming",
    "committed": "awaiting-finalize",
}
# The name an `IllegalTransition` gives the machine, as each scope's caller knows it.
MACHINE: Final[dict[Scope, str]] = {
    "whole": "maintenance",
    "restore": "maintenance",
    "seats": "seat cut",
    "adopt": "adoption",
}
# The lifecycle work a resume op does (`Manager.lifecycle`): the one work a manager fenced for
# its restore admits.
RESUME_WORK: Final = "adopt"

_CURE_FINISH_CUT = "finish the cut (cotal down --preserve-state) or abort it before commit"
_CURE_RESUME = "finish the resume (cotal up --restore) with the attempt the daemon was started for"
_CURE_FINISH_IT = "finish it (cotal down --preserve-state); its seats resume from the checkpoint"


class Attempt:
    """One attempt of one scope: applies `ATTEMPT_TRANSITIONS[scope]`, binds the attempt, and
    raises `IllegalTransition` for an event its state does not allow."""

    def __init__(
        self,
        scope: Scope,
        attempt_id: str | None = None,
        *,
        seats: frozenset[str] = frozenset(),
        state: AttemptState = "idle",
    ) -> None:
        self.scope: Scope = scope
        self.attempt_id = attempt_id
        # The seats a cut of some seats fences; empty for every other scope.
        self.seats = seats
        self.state: AttemptState = state
        self.commit_started = False
        # The last commit ended unsealed and none runs now: an abort may start the seats again.
        self.commit_failed = False

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES[self.scope]

    @property
    def shown(self) -> str:
        """The state as this scope's callers name it."""
        return DAEMON_STATE[self.state] if self.scope in FENCING_SCOPES else self.state

    def holds(self, attempt_id: str) -> bool:
        return self.state != "idle" and self.attempt_id == attempt_id

    def fences(self, seat: str) -> bool:
        return self.scope == "seats" and self.state == "preserving" and seat in self.seats

    def apply(
        self, event: AttemptEvent, attempt_id: str, *, draining: bool = False
    ) -> AttemptState:
        if self.attempt_id is not None and attempt_id != self.attempt_id:
            raise self._other_attempt(event, attempt_id)
        target = ATTEMPT_TRANSITIONS[self.scope].get(self.state, {}).get(event)
        if target is None:
            raise self._illegal(event, attempt_id)
        if event == "abort":
            self._check_abort(attempt_id, draining)
        if event in ("commit", "failed"):
            self.commit_started, self.commit_failed = True, event == "failed"
        self.state = target
        if target == "idle":
            self.attempt_id, self.seats = None, frozenset()
            self.commit_started = self.commit_failed = False
        return target

    @property
    def abandonable(self) -> bool:
        """A cut whose commit ended unsealed: its seats are stopped, none is being captured,
        and an abort that starts them again first is legal."""
        return self.state == "preserving" and self.commit_started and self.commit_failed

    def _check_abort(self, attempt_id: str, draining: bool) -> None:
        """A cut is abandoned only before its commit began, and not under work still draining."""
        if draining:
            raise IllegalTransition(
                MACHINE[self.scope],
                self.shown,
                "abort",
                f"preservation attempt {attempt_id} is still preparing or draining accepted "
                "lifecycle work and cannot be aborted",
                "retry the abort once the drain has finished",
            )
        if self.commit_started and not self.commit_failed:
            raise IllegalTransition(
                MACHINE[self.scope], self.shown, "abort", _begun(attempt_id), _CURE_FINISH_IT
            )

    def _other_attempt(self, event: AttemptEvent, attempt_id: str) -> Refusal:
        """One attempt per slot: an event for another is refused, naming the one held."""
        bound = self.attempt_id
        if self.scope == "adopt":
            return Refusal(
                Code.ADOPTION_BUSY,
                f"this manager is adopting attempt {bound}; refusing attempt {attempt_id} until "
                "it is finalized",
                f"finish that adoption first (`cotal up --restore` of attempt {bound})",
            )
        if self.scope == "seats" and event == "prepare":
            return Refusal(
                Code.CUT_UNDER_WAY,
                f"a cut of seat(s) {', '.join(sorted(self.seats))} (attempt {bound}) is under "
                "way; one cut at a time",
                "let it finish (or `cotal down --preserve-state --abort` it before its "
                "commit), then cut again; nothing was fenced",
            )
        if self.scope == "restore":
            message = f"manager expects resume attempt {bound}, not {attempt_id}"
        elif event == "prepare":
            message = (
                f"manager is fenced for preservation attempt {bound}; "
                f"refusing different attempt {attempt_id}"
            )
        else:
            message = (
                f"preservation attempt {attempt_id} is not the cut this manager holds ({bound})"
            )
        return Refusal(Code.ATTEMPT_MISMATCH, message, f"use attempt {bound}")

    def _illegal(self, event: AttemptEvent, attempt_id: str) -> IllegalTransition:
        reason, cure = "", ""
        if event == "abort" and self.state == "preserved":
            reason, cure = _begun(attempt_id), _CURE_FINISH_IT
        elif self.scope == "adopt":
            reason = f"adoption of attempt {attempt_id} is {self.state}"
            cure = "rerun `cotal up --restore` for the attempt; it continues from its journal"
        elif event == "commit-resume" and self.state not in ACTIVATED:
            reason = f"resume attempt {attempt_id} has no successful activation to commit"
            cure = "retry resume-preserved until every retained seat is live"
        return IllegalTransition(MACHINE[self.scope], self.shown, event, reason, cure)


def _begun(attempt_id: str) -> str:
    return f"cut {attempt_id} has begun stopping its seats and cannot be aborted"


class Maintenance:
    """The manager's cut and resume attempts, and the rules between them."""

    def __init__(self, *, resume_attempt_id: str | None = None) -> None:
        self.cut = Attempt("whole")
        self.resume = (
            Attempt("restore", resume_attempt_id, state="resume-required")
            if resume_attempt_id
            else Attempt("adopt")
        )
        self.generation = 0

    # -- what callers read ----------------------------------------------------------------------

    @property
    def fencing(self) -> Attempt | None:
        """The attempt that fences the whole manager, if one is held."""
        for held in (self.cut, self.resume):
            if held.scope in FENCING_SCOPES and held.state != "idle":
                return held
        return None

    @property
    def state(self) -> MaintenanceState:
        held = self.fencing
        return "active" if held is None else DAEMON_STATE[held.state]

    @property
    def attempt_id(self) -> str | None:
        held = self.fencing
        return None if held is None else held.attempt_id

    @property
    def commit_started(self) -> bool:
        return self.cut.scope == "whole" and self.cut.commit_started

    @property
    def activated(self) -> bool:
        return self.resume.scope == "restore" and self.resume.state in ACTIVATED

    @property
    def adoption(self) -> Attempt:
        """The adoption into this running mesh; an idle one when none is under way."""
        return self.resume if self.resume.scope == "adopt" else Attempt("adopt")

    @property
    def seat_cut(self) -> Attempt:
        """The cut of some seats; an idle one when none is held."""
        return self.cut if self.cut.scope == "seats" else Attempt("seats")

    # -- the fence ------------------------------------------------------------------------------

    def check_lifecycle(
        self, *, resume_operation: bool = False, seat: str | None = None, work: str = ""
    ) -> None:
        """The fence. Admits work, or raises; the caller counts admitted work synchronously.
        `seat`: the one seat the work touches, which a cut of some seats may fence alone.
        `resume_operation` (or `work` named `RESUME_WORK`): a resume op, which a manager fenced
        for its restore admits until the commit."""
        held = self.fencing
        if held is not None and held.scope == "restore":
            if (resume_operation or work == RESUME_WORK) and held.state in ADMITS_RESUME_OPS:
                return
            raise Refusal(
                Code.FENCED,
                f"manager is waiting for resume attempt {held.attempt_id}; ordinary "
                "lifecycle/control work is fenced",
                _CURE_RESUME,
            )
        if held is not None:
            raise Refusal(
                Code.FENCED,
                f"manager is in {held.shown} mode; new lifecycle/control work is fenced",
                _CURE_FINISH_CUT,
            )
        if seat is not None and self.cut.fences(seat):
            raise Refusal(
                Code.SEAT_FENCED,
                f"seat {seat} is being cut (attempt {self.cut.attempt_id}); it takes no "
                "lifecycle work until the cut is sealed or aborted",
                "wait for `cotal down --preserve-state --seat` to finish, or abort it",
            )

    # -- events ---------------------------------------------------------------------------------

    def apply(
        self,
        event: AttemptEvent,
        attempt_id: str,
        *,
        seats: frozenset[str] = frozenset(),
        draining: bool = False,
    ) -> AttemptState:
        """Apply `event` for `attempt_id` to the attempt it concerns. A `prepare` that begins a
        cut names its `seats` (none: every seat). `draining` says accepted work is still in
        flight, which only a cut's `abort` consults."""
        check_attempt_id(attempt_id)
        if event in CUT_EVENTS:
            return self._cut_event(event, attempt_id, seats, draining)
        if event == "resume" and self.resume.open:
            self._admit_new()
            self.resume = Attempt("adopt", attempt_id)
        state = self.resume.apply(event, attempt_id)
        if state == "idle":
            # A finalized restore leaves an ordinary manager: its next resume is an adoption.
            self.resume = Attempt("adopt")
        return state

    def _cut_event(
        self, event: AttemptEvent, attempt_id: str, seats: frozenset[str], draining: bool
    ) -> AttemptState:
        self._not_during_restore(event)
        if event == "prepare" and self.cut.open:
            self._admit_new()
            self._no_adoption_under_way()
            self.cut = Attempt("seats" if seats else "whole", attempt_id, seats=seats)
            self.generation += 1
        state = self.cut.apply(event, attempt_id, draining=draining)
        if event == "abort":
            self.generation += 1
        return state

    def _admit_new(self) -> None:
        """A new attempt begins only where the fence admits work."""
        self.check_lifecycle()

    def _not_during_restore(self, event: AttemptEvent) -> None:
        """A manager started for a resume takes no cut until it is finalized."""
        held = self.fencing
        if held is not None and held.scope == "restore":
            raise IllegalTransition(
                "maintenance",
                held.shown,
                event,
                f"manager is waiting for resume attempt {held.attempt_id}",
            )

    def _no_adoption_under_way(self) -> None:
        """A cut's plan would catch seats an adoption has not committed yet."""
        held = self.resume
        if held.scope == "adopt" and held.state != "idle":
            raise Refusal(
                Code.ADOPTION_UNDER_WAY,
                f"preservation refused: this manager is adopting attempt {held.attempt_id}, "
                "whose seats are not committed yet",
                "let that `cotal up --restore` finish (or rerun it), then cut; nothing was fenced",
            )


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


class ClockNote(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """Who vouched for the destination's clock when its recency gate admitted an attempt, kept
    as evidence when it was not the kernel: the operator's declaration or the test hook."""

    source: Annotated[str, msgspec.Meta(max_length=128)]
    detail: Annotated[str, msgspec.Meta(max_length=2048)]


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
    # Recorded at resume-intent when the recency gate trusted something other than the kernel.
    clock: ClockNote | None = None

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
    clock: ClockNote | None = None,
) -> JournalRecord:
    """The record after advancing `prev` to `to_state`, or `prev` itself for an identical retry.

    A keyword left as None carries the previous value forward. A fact already recorded may be
    repeated but never replaced: a journal that changed its mind mid-attempt is not evidence.
    """
    state = prev.state if prev is not None else ABSENT
    event = EVENT_FOR[to_state]
    _check_journal_attempt(prev, attempt_id, state, event)
    given = _Facts(resume, checkpoint_dir, durable_commit_token, consents, degraded, clock)
    if prev is not None and prev.state == to_state:
        return _retried(prev, attempt_id, given)
    if event not in JOURNAL_TRANSITIONS[state]:
        raise IllegalTransition("maintenance journal", state, event)
    _check_facts(prev, attempt_id, to_state, given)
    return _advanced(prev, attempt_id, to_state, now, given)


class _Facts(NamedTuple):
    """What a step may record beside its state; None carries the recorded value forward."""

    resume: ResumeDescriptor | None
    checkpoint_dir: str | None
    durable_commit_token: str | None
    consents: list[Consent] | None
    degraded: Degraded | None
    clock: ClockNote | None

    def named(self) -> dict[str, object]:
        """By the name the record spells on disk, which is the one a refusal names."""
        return {_CAMEL.get(field, field): value for field, value in self._asdict().items()}


_CAMEL: Final = {"checkpoint_dir": "checkpointDir", "durable_commit_token": "durableCommitToken"}
_NONE: Final = _Facts(None, None, None, None, None, None)


def _recorded(record: JournalRecord | None) -> _Facts:
    if record is None:
        return _NONE
    return _Facts(
        record.resume,
        record.checkpoint_dir,
        record.durable_commit_token,
        record.consents,
        record.degraded,
        record.clock,
    )


def _check_journal_attempt(
    prev: JournalRecord | None, attempt_id: str, state: str, event: JournalEvent
) -> None:
    # A same-root resume of a sealed cut may run under its own attempt id.
    if prev is None or prev.attempt_id == attempt_id:
        return
    if event == "begin-resume" and state == READY:
        return
    raise Refusal(
        Code.ATTEMPT_MISMATCH,
        f"maintenance journal belongs to attempt {prev.attempt_id} (state {prev.state}); "
        f"refusing attempt {attempt_id}",
        _CURE_JOURNAL,
    )


def _retried(prev: JournalRecord, attempt_id: str, given: _Facts) -> JournalRecord:
    """A step already recorded: a no-op when every fact given is the one recorded."""
    current = _recorded(prev).named()
    for name, value in given.named().items():
        if value is not None and value != current[name]:
            raise Refusal(
                Code.JOURNAL_MISMATCH,
                f"maintenance journal already records {prev.state} for attempt {attempt_id} "
                f"with a different {name}",
                _CURE_JOURNAL,
            )
    return prev


def _check_facts(
    prev: JournalRecord | None, attempt_id: str, to_state: JournalState, given: _Facts
) -> None:
    """No recorded fact is replaced, and each fact is given only at the state that holds it."""
    state, event = (prev.state if prev else ABSENT), EVENT_FOR[to_state]
    current, new = _recorded(prev).named(), given.named()
    for name in ("resume", "checkpointDir", "durableCommitToken", "consents", "clock"):
        if current[name] not in (None, []) and new[name] is not None and new[name] != current[name]:
            raise Refusal(
                Code.JOURNAL_MISMATCH,
                f"maintenance journal for attempt {attempt_id} already records its {name}; "
                "refusing to replace it",
                _CURE_JOURNAL,
            )
    if given.durable_commit_token is not None and to_state not in (RESUME_COMMITTED, RETIRED):
        raise IllegalTransition(
            "maintenance journal",
            state,
            event,
            "a durable commit token is recorded only at resume-committed",
        )
    if (given.degraded is not None) != (to_state == DEGRADED):
        raise IllegalTransition(
            "maintenance journal",
            state,
            event,
            "a reason and a recourse are recorded exactly when degrading",
        )


def _advanced(
    prev: JournalRecord | None, attempt_id: str, to_state: JournalState, now: str, given: _Facts
) -> JournalRecord:
    """The next record, each fact not given carried forward, checked as a reader will check it."""
    state, event = (prev.state if prev else ABSENT), EVENT_FOR[to_state]
    if prev is None or to_state in (CUT_INTENT, RESUME_INTENT):
        kind: Literal["cut", "resume"] = "cut" if to_state == CUT_INTENT else "resume"
    else:
        kind = prev.kind
    old = _recorded(prev)
    try:
        record = JournalRecord(
            version=1,
            revision=(prev.revision + 1) if prev is not None else 1,
            attempt_id=attempt_id,
            kind=kind,
            state=to_state,
            updated_at=now,
            resume=_or(given.resume, old.resume),
            consents=list(given.consents if given.consents is not None else old.consents or []),
            checkpoint_dir=_or(given.checkpoint_dir, old.checkpoint_dir),
            durable_commit_token=_or(given.durable_commit_token, old.durable_commit_token),
            degraded=given.degraded,
            clock=_or(given.clock, old.clock),
        )
    except ValueError as exc:  # the record's own consistency rules (__post_init__)
        raise IllegalTransition("maintenance journal", state, event, str(exc)) from None
    # Constructing a Struct does not run its field constraints; a round trip does, so a record
    # this function returns is one `decode_journal` will accept after a crash.
    try:
        return decode_journal(encode_journal(record), what="new maintenance journal record")
    except DecodeError as exc:
        raise IllegalTransition("maintenance journal", state, event, exc.message) from None


def _or(new: _T, old: _T) -> _T:
    return new if new is not None else old


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
        # Before the commit began, or after a commit that failed to seal: the manager's
        # attempt machine decides at run time, and starts the stopped seats again first.
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
