"""The maintenance tables driven directly, without a daemon: every legal transition, a sample of
illegal ones, and the guards a table cannot express."""

from __future__ import annotations

from typing import get_args

import pytest

from protocol.errors import Refusal
from protocol.maintenance import (
    ABSENT,
    DISCARDABLE_STATES,
    EVENT_FOR,
    JOURNAL_TRANSITIONS,
    MAINTENANCE_TRANSITIONS,
    Consent,
    Degraded,
    IllegalTransition,
    JournalRecord,
    JournalState,
    Maintenance,
    MaintenanceEvent,
    MaintenanceState,
    ResumeDescriptor,
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

# -- the daemon machine ----------------------------------------------------------------------------

# A path of events from a fresh machine to each state, so every table row can be set up for real.
PATHS: dict[MaintenanceState, tuple[bool, list[MaintenanceEvent]]] = {
    "active": (False, []),
    "preserving": (False, ["prepare"]),
    "preserved": (False, ["prepare", "commit", "stopped"]),
    "resume-required": (True, []),
    "resuming": (True, ["resume", "activated"]),
    "awaiting-finalize": (True, ["resume", "activated", "commit-resume"]),
}


def machine_in(state: MaintenanceState) -> Maintenance:
    resume, events = PATHS[state]
    m = Maintenance(resume_attempt_id=A if resume else None)
    for event in events:
        m.apply(event, A)
    assert m.state == state
    return m


def test_every_state_is_in_the_table() -> None:
    assert set(MAINTENANCE_TRANSITIONS) == set(get_args(MaintenanceState))


@pytest.mark.parametrize(
    ("state", "event", "target"),
    [(s, e, t) for s, row in MAINTENANCE_TRANSITIONS.items() for e, t in row.items()],
)
def test_every_legal_maintenance_transition(
    state: MaintenanceState, event: MaintenanceEvent, target: str
) -> None:
    m = machine_in(state)
    assert m.apply(event, A) == target
    assert m.state == target


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (s, e)
        for s in get_args(MaintenanceState)
        for e in get_args(MaintenanceEvent)
        if e not in MAINTENANCE_TRANSITIONS[s]
    ],
)
def test_every_illegal_maintenance_transition_names_state_and_event(
    state: MaintenanceState, event: MaintenanceEvent
) -> None:
    m = machine_in(state)
    with pytest.raises(IllegalTransition) as info:
        m.apply(event, A)
    err = info.value
    assert (err.state, err.event) == (state, event)
    assert f'state "{state}"' in err.message and f'event "{event}"' in err.message
    assert err.code == "illegal-transition"
    assert m.state == state  # an illegal event changes nothing


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


def test_no_way_back_after_commit_began() -> None:
    m = machine_in("preserving")
    m.apply("commit", A)
    assert m.commit_started
    with pytest.raises(
        IllegalTransition, match="has begun stopping children and cannot return to active mode"
    ):
        m.apply("abort", A)
    assert m.state == "preserving"
    m.apply("stopped", A)
    with pytest.raises(IllegalTransition, match="cannot return to active mode"):
        m.apply("abort", A)


def test_abort_refused_while_draining() -> None:
    m = machine_in("preserving")
    with pytest.raises(IllegalTransition, match="still preparing or draining"):
        m.apply("abort", A, draining=True)
    assert m.state == "preserving"


def test_attempt_binding_texts() -> None:
    m = machine_in("preserving")
    with pytest.raises(
        Refusal, match=f"fenced for preservation attempt {A}; refusing different attempt {B}"
    ):
        m.apply("prepare", B)
    with pytest.raises(Refusal, match=f"preservation attempt {B} was not prepared by this manager"):
        m.apply("commit", B)
    with pytest.raises(
        Refusal, match=f"preservation attempt {B} is not the active manager attempt"
    ):
        m.apply("abort", B)
    r = machine_in("resume-required")
    with pytest.raises(Refusal, match=f"manager expects resume attempt {A}, not {B}"):
        r.apply("resume", B)


def test_commit_resume_needs_a_successful_activation() -> None:
    m = Maintenance(resume_attempt_id=A)
    m.apply("resume", A)
    with pytest.raises(
        IllegalTransition, match=f"resume attempt {A} has no successful activation to commit"
    ):
        m.apply("commit-resume", A)
    m.apply("activated", A)
    assert m.apply("commit-resume", A) == "awaiting-finalize"
    assert m.apply("commit-resume", A) == "awaiting-finalize"  # idempotent barrier
    assert m.apply("finalize", A) == "active"
    m.check_lifecycle()


def test_fence_admits_only_what_the_state_allows() -> None:
    m = Maintenance()
    m.check_lifecycle()
    m.apply("prepare", A)
    with pytest.raises(
        Refusal, match="manager is in preserving mode; new lifecycle/control work is fenced"
    ):
        m.check_lifecycle()
    r = Maintenance(resume_attempt_id=A)
    r.check_lifecycle(resume_operation=True)
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
