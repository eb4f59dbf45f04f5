"""The maintenance tables driven directly, without a daemon: every legal transition, a sample of
illegal ones, and the guards a table cannot express."""

from __future__ import annotations

from typing import get_args

import pytest

from protocol.errors import Refusal
from protocol.maintenance import (
    ABSENT,
    ATTEMPT_TRANSITIONS,
    CUT_EVENTS,
    CUT_SCOPES,
    DISCARDABLE_STATES,
    EVENT_FOR,
    JOURNAL_TRANSITIONS,
    MACHINE,
    OPEN_STATES,
    RESUME_WORK,
    Attempt,
    AttemptEvent,
    AttemptState,
    Consent,
    Degraded,
    IllegalTransition,
    JournalRecord,
    JournalState,
    Maintenance,
    ResumeDescriptor,
    Scope,
    decode_journal,
    encode_journal,
    next_record,
)

A = "attempt-a"
B = "attempt-b"
TOKEN = "f" * 64
DESC = ResumeDescriptor(
    version="cotal-manager-resume/v2", file="resume.json", bytes=10, sha256="0" * 64
)
NOW = "2025-01-01T00:00:00Z"

# -- the daemon's attempt machine -----------------------------------------------------------------

SEATS = frozenset({"w1", "w2"})

# A path of events from a fresh manager to each (scope, state), so every table cell is set up for
# real: (started for a restore, events).
PATHS: dict[tuple[Scope, AttemptState], tuple[bool, list[AttemptEvent]]] = {
    ("whole", "idle"): (False, []),
    ("whole", "preserving"): (False, ["prepare"]),
    ("whole", "preserved"): (False, ["prepare", "commit", "stopped"]),
    ("seats", "idle"): (False, []),
    ("seats", "preserving"): (False, ["prepare"]),
    ("seats", "preserved"): (False, ["prepare", "commit", "stopped"]),
    ("restore", "resume-required"): (True, []),
    ("restore", "adopting"): (True, ["resume"]),
    ("restore", "adopted"): (True, ["resume", "activated"]),
    ("restore", "committed"): (True, ["resume", "activated", "commit-resume"]),
    ("adopt", "idle"): (False, []),
    ("adopt", "adopting"): (False, ["resume"]),
    ("adopt", "adopted"): (False, ["resume", "activated"]),
    ("adopt", "committed"): (False, ["resume", "activated", "commit-resume"]),
}


def machine_in(scope: Scope, state: AttemptState) -> tuple[Maintenance, Attempt]:
    restore, events = PATHS[(scope, state)]
    m = Maintenance(resume_attempt_id=A if restore else None)
    for event in events:
        m.apply(event, A, seats=SEATS if scope == "seats" else frozenset())
    held = m.cut if scope in CUT_SCOPES else m.resume
    if state != "idle":
        assert (held.scope, held.state) == (scope, state)
    return m, held


REACHABLE = [(scope, state) for scope, state in PATHS if state in ATTEMPT_TRANSITIONS[scope]]


def test_every_scope_and_state_is_reachable() -> None:
    assert set(ATTEMPT_TRANSITIONS) == set(get_args(Scope))
    cells = {(scope, state) for scope, rows in ATTEMPT_TRANSITIONS.items() for state in rows}
    # A finalized restore leaves an idle adoption, never an idle restore.
    assert cells - {("restore", "idle")} == set(PATHS)


@pytest.mark.parametrize(
    ("scope", "state", "event", "target"),
    [
        (scope, s, e, t)
        for scope, rows in ATTEMPT_TRANSITIONS.items()
        for s, row in rows.items()
        for e, t in row.items()
    ],
)
def test_every_legal_transition(
    scope: Scope, state: AttemptState, event: AttemptEvent, target: AttemptState
) -> None:
    m, _ = machine_in(scope, state)
    seats = SEATS if scope == "seats" else frozenset()
    assert m.apply(event, A, seats=seats) == target
    held = m.cut if scope in CUT_SCOPES else m.resume
    assert held.state == target


@pytest.mark.parametrize(
    ("scope", "state", "event"),
    [
        (scope, s, e)
        for scope, s in REACHABLE
        for e in get_args(AttemptEvent)
        if e not in ATTEMPT_TRANSITIONS[scope][s]
        and (e in CUT_EVENTS) == (scope in CUT_SCOPES)
        and s not in OPEN_STATES[scope]
    ],
)
def test_every_illegal_transition_names_state_and_event(
    scope: Scope, state: AttemptState, event: AttemptEvent
) -> None:
    m, held = machine_in(scope, state)
    with pytest.raises(IllegalTransition) as info:
        m.apply(event, A)
    err = info.value
    assert (err.machine, err.state, err.event) == (MACHINE[scope], held.shown, event)
    assert f'state "{held.shown}"' in err.message and f'event "{event}"' in err.message
    assert err.code == "illegal-transition"
    assert held.state == state  # an illegal event changes nothing


def test_the_manager_state_is_its_fencing_attempt_under_the_daemon_names() -> None:
    shown = {cell: machine_in(*cell)[0].state for cell in PATHS}
    assert shown == {
        ("whole", "idle"): "active",
        ("whole", "preserving"): "preserving",
        ("whole", "preserved"): "preserved",
        ("seats", "idle"): "active",
        ("seats", "preserving"): "active",
        ("seats", "preserved"): "active",
        ("restore", "resume-required"): "resume-required",
        ("restore", "adopting"): "resuming",
        ("restore", "adopted"): "resuming",
        ("restore", "committed"): "awaiting-finalize",
        ("adopt", "idle"): "active",
        ("adopt", "adopting"): "active",
        ("adopt", "adopted"): "active",
        ("adopt", "committed"): "active",
    }


def test_abort_before_commit_returns_to_active_and_advances_generation() -> None:
    m = Maintenance()
    m.apply("prepare", A)
    assert m.generation == 1 and m.attempt_id == A
    m.apply("abort", A)
    assert m.state == "active"
    assert m.generation == 2
    assert m.attempt_id is None
    m.check_lifecycle()  # the fence is down again
    m.apply("prepare", B)
    assert m.attempt_id == B and m.generation == 3


@pytest.mark.parametrize("seats", [frozenset(), SEATS])
def test_no_way_back_after_commit_began(seats: frozenset[str]) -> None:
    m = Maintenance()
    m.apply("prepare", A, seats=seats)
    m.apply("commit", A)
    assert m.cut.commit_started and m.commit_started == (not seats)
    with pytest.raises(IllegalTransition, match="has begun stopping its seats and cannot be"):
        m.apply("abort", A)
    assert m.cut.state == "preserving"
    m.apply("stopped", A)
    with pytest.raises(IllegalTransition, match="cannot be aborted"):
        m.apply("abort", A)


def test_abort_refused_while_draining() -> None:
    m, _ = machine_in("whole", "preserving")
    with pytest.raises(IllegalTransition, match="still preparing or draining"):
        m.apply("abort", A, draining=True)
    assert m.state == "preserving"


def test_attempt_binding_texts() -> None:
    m, _ = machine_in("whole", "preserving")
    with pytest.raises(
        Refusal, match=f"fenced for preservation attempt {A}; refusing different attempt {B}"
    ):
        m.apply("prepare", B)
    for event in ("commit", "abort"):
        with pytest.raises(Refusal, match=f"attempt {B} is not the cut this manager holds"):
            m.apply(event, B)
    r, _ = machine_in("restore", "resume-required")
    with pytest.raises(Refusal, match=f"manager expects resume attempt {A}, not {B}"):
        r.apply("resume", B)


def test_one_cut_at_a_time_and_none_while_an_adoption_is_under_way() -> None:
    m, _ = machine_in("seats", "preserving")
    for seats in (frozenset(), frozenset({"w3"})):
        with pytest.raises(Refusal, match="is under way; one cut at a time") as info:
            m.apply("prepare", B, seats=seats)
        assert info.value.code == "cut-under-way"
    m.apply("commit", A)
    m.apply("stopped", A)
    # Sealed, the mesh runs on without them: the next cut begins, of any scope.
    m.apply("prepare", B)
    assert (m.cut.scope, m.state) == ("whole", "preserving")

    a, _ = machine_in("adopt", "adopted")
    for seats in (frozenset(), SEATS):
        with pytest.raises(Refusal) as info:
            a.apply("prepare", B, seats=seats)
        assert info.value.code == "adoption-under-way"
    with pytest.raises(Refusal) as info:
        a.apply("resume", B)
    assert info.value.code == "adoption-busy"
    a.apply("commit-resume", A)
    a.apply("finalize", A)
    a.apply("prepare", B)
    assert a.state == "preserving"


def test_a_cut_of_some_seats_fences_only_them() -> None:
    m, _ = machine_in("seats", "preserving")
    m.check_lifecycle(seat="other")
    m.check_lifecycle()
    with pytest.raises(Refusal, match="seat w1 is being cut") as info:
        m.check_lifecycle(seat="w1")
    assert info.value.code == "seat-fenced"
    assert (m.seat_cut.attempt_id, m.seat_cut.seats) == (A, SEATS)
    assert m.adoption.state == "idle" and m.attempt_id is None


def test_a_restore_binds_its_attempt_through_a_failed_try() -> None:
    m = Maintenance(resume_attempt_id=A)
    m.apply("resume", A)
    with pytest.raises(
        IllegalTransition, match=f"resume attempt {A} has no successful activation to commit"
    ):
        m.apply("commit-resume", A)
    m.apply("rollback", A)
    assert (m.state, m.attempt_id) == ("resuming", A)
    m.apply("resume", A)
    m.apply("activated", A)
    assert m.activated
    assert m.apply("commit-resume", A) == "committed"
    assert m.apply("commit-resume", A) == "committed"  # idempotent barrier
    assert m.state == "awaiting-finalize"
    assert m.apply("finalize", A) == "idle"
    assert (m.state, m.resume.scope) == ("active", "adopt")
    m.check_lifecycle()
    with pytest.raises(IllegalTransition, match=f"waiting for resume attempt {B}"):
        Maintenance(resume_attempt_id=B).apply("prepare", A)


def test_a_failed_adoption_lets_go_of_its_attempt() -> None:
    m = Maintenance()
    m.apply("resume", A)
    assert m.adoption.attempt_id == A and m.state == "active"
    m.apply("rollback", A)
    assert m.adoption.state == "idle"
    m.apply("resume", B)
    assert m.adoption.attempt_id == B


def test_fence_admits_only_what_the_state_allows() -> None:
    m = Maintenance()
    m.check_lifecycle()
    m.apply("prepare", A)
    with pytest.raises(
        Refusal, match="manager is in preserving mode; new lifecycle/control work is fenced"
    ):
        m.check_lifecycle()
    with pytest.raises(Refusal, match="fenced"):
        m.apply("resume", B)  # no adoption begins under a fence
    r = Maintenance(resume_attempt_id=A)
    r.check_lifecycle(resume_operation=True)
    r.check_lifecycle(work=RESUME_WORK)
    with pytest.raises(
        Refusal, match=f"waiting for resume attempt {A}; ordinary lifecycle/control work is fenced"
    ):
        r.check_lifecycle()
    r.apply("resume", A)
    r.apply("activated", A)
    r.apply("commit-resume", A)
    with pytest.raises(Refusal, match="fenced"):
        r.check_lifecycle(resume_operation=True)


# -- the journal table -----------------------------------------------------------------------------

JOURNAL_PATH: list[JournalState] = [
    "cut-intent",
    "cut-committed",
    "ready",
    "resume-intent",
    "resume-active",
    "resume-committed",
    "retired",
]


def extra(to_state: JournalState) -> dict[str, object]:
    if to_state in ("cut-intent", "resume-intent"):
        return {"resume": DESC}
    if to_state == "resume-committed":
        return {"durable_commit_token": TOKEN}
    if to_state == "degraded":
        return {
            "degraded": Degraded(
                reason="broker gone", recourse="start the broker, then cotal up --restore again"
            )
        }
    return {}


def record_in(state: JournalState) -> JournalRecord | None:
    rec: JournalRecord | None = None
    if state == "degraded":
        rec = next_record(None, A, "cut-intent", now=NOW, resume=DESC)
        return next_record(rec, A, "degraded", now=NOW, **extra("degraded"))  # type: ignore[arg-type]
    for step in JOURNAL_PATH:
        rec = next_record(rec, A, step, now=NOW, **extra(step))  # type: ignore[arg-type]
        if step == state:
            return rec
    raise AssertionError(state)


def test_journal_table_covers_every_state_and_events_are_unique_per_target() -> None:
    assert set(JOURNAL_TRANSITIONS) == set(get_args(JournalState)) | {ABSENT}
    assert set(EVENT_FOR) == set(get_args(JournalState))


@pytest.mark.parametrize(
    ("state", "target"),
    [(s, t) for s, row in JOURNAL_TRANSITIONS.items() for t in row.values()],
)
def test_every_legal_journal_transition(state: str, target: JournalState) -> None:
    prev = None if state == ABSENT else record_in(state)  # type: ignore[arg-type]
    rec = next_record(prev, A, target, now=NOW, **extra(target))  # type: ignore[arg-type]
    assert rec.state == target
    assert rec.revision == (prev.revision + 1 if prev else 1)
    assert decode_journal(encode_journal(rec)) == rec


ILLEGAL_JOURNAL = [
    (ABSENT, "ready"),
    (ABSENT, "retired"),
    (ABSENT, "degraded"),
    ("cut-intent", "ready"),
    ("cut-intent", "resume-intent"),
    ("cut-committed", "cut-intent"),
    ("ready", "cut-committed"),
    ("resume-intent", "resume-committed"),
    ("resume-active", "retired"),
    ("retired", "resume-intent"),
    ("retired", "degraded"),
    ("degraded", "cut-intent"),
    ("degraded", "resume-active"),
]


@pytest.mark.parametrize(("state", "target"), ILLEGAL_JOURNAL)
def test_illegal_journal_transitions_name_state_and_event(state: str, target: JournalState) -> None:
    prev = None if state == ABSENT else record_in(state)  # type: ignore[arg-type]
    with pytest.raises(IllegalTransition) as info:
        next_record(prev, A, target, now=NOW, **extra(target))  # type: ignore[arg-type]
    assert info.value.state == state
    assert info.value.event == EVENT_FOR[target]
    assert (
        f'state "{state}"' in info.value.message
        and f'event "{EVENT_FOR[target]}"' in info.value.message
    )


def test_identical_retry_is_a_no_op_and_a_changed_fact_is_refused() -> None:
    rec = record_in("resume-committed")
    assert rec is not None
    assert next_record(rec, A, "resume-committed", now="later", durable_commit_token=TOKEN) is rec
    with pytest.raises(Refusal, match="different durableCommitToken"):
        next_record(rec, A, "resume-committed", now=NOW, durable_commit_token="e" * 64)
    with pytest.raises(Refusal, match="already records its durableCommitToken"):
        next_record(rec, A, "retired", now=NOW, durable_commit_token="e" * 64)
    retired = next_record(rec, A, "retired", now=NOW, durable_commit_token=TOKEN)
    assert retired.durable_commit_token == TOKEN and retired.state == "retired"


def test_journal_attempt_binding() -> None:
    rec = record_in("cut-intent")
    with pytest.raises(Refusal, match=f"belongs to attempt {A}"):
        next_record(rec, B, "cut-committed", now=NOW)
    # A resume on the same root may run under its own attempt id.
    ready = record_in("ready")
    resumed = next_record(ready, B, "resume-intent", now=NOW)
    assert (resumed.attempt_id, resumed.kind, resumed.resume) == (B, "resume", DESC)


def test_required_facts_per_state() -> None:
    with pytest.raises(IllegalTransition, match="resume document descriptor"):
        next_record(None, A, "cut-intent", now=NOW)
    active = record_in("resume-active")
    with pytest.raises(IllegalTransition, match="durableCommitToken"):
        next_record(active, A, "resume-committed", now=NOW)
    with pytest.raises(IllegalTransition, match="exactly when degrading"):
        next_record(active, A, "degraded", now=NOW)
    with pytest.raises(IllegalTransition, match="only at resume-committed"):
        next_record(
            record_in("cut-intent"), A, "cut-committed", now=NOW, durable_commit_token=TOKEN
        )
    with pytest.raises(Refusal, match="already records its resume"):
        other = ResumeDescriptor(
            version="cotal-manager-resume/v2", file="resume.json", bytes=11, sha256="1" * 64
        )
        next_record(record_in("cut-intent"), A, "cut-committed", now=NOW, resume=other)


def test_consents_and_degraded_are_recorded() -> None:
    consent = Consent(
        seat="w", captured_at="2024-01-01T00:00:00Z", age_ms=90_000_000, horizon_ms=86_400_000
    )
    rec = next_record(None, A, "resume-intent", now=NOW, resume=DESC, consents=[consent])
    rec = next_record(rec, A, "resume-active", now=NOW)
    assert rec.consents == [consent]
    degraded = next_record(rec, A, "degraded", now=NOW, **extra("degraded"))  # type: ignore[arg-type]
    assert degraded.degraded is not None and degraded.degraded.recourse.startswith(
        "start the broker"
    )
    assert "degraded" in DISCARDABLE_STATES and "ready" not in DISCARDABLE_STATES


def test_revisions_are_monotonic_along_the_whole_path() -> None:
    rec: JournalRecord | None = None
    seen = []
    for step in JOURNAL_PATH:
        rec = next_record(rec, A, step, now=NOW, **extra(step))  # type: ignore[arg-type]
        seen.append(rec.revision)
    assert seen == list(range(1, len(JOURNAL_PATH) + 1))
