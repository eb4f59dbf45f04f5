"""A cut whose commit failed may be abandoned (issue 42): the attempt machine's `failed` event,
driven directly. `abort` is legal before the commit and after a failed one, never while a
commit runs nor once the cut is sealed."""

from __future__ import annotations

import pytest

from protocol.maintenance import ATTEMPT_TRANSITIONS, IllegalTransition, Maintenance

A = "attempt-a"
SEATS = frozenset({"b"})


@pytest.mark.parametrize("seats", [frozenset(), SEATS], ids=["whole", "seats"])
def test_abort_after_a_failed_commit_lifts_the_fence(seats: frozenset[str]) -> None:
    m = Maintenance()
    m.apply("prepare", A, seats=seats)
    m.apply("commit", A)
    assert not m.cut.abandonable
    with pytest.raises(IllegalTransition, match="has begun stopping its seats"):
        m.apply("abort", A)
    assert m.apply("failed", A) == "preserving"
    assert m.cut.abandonable and m.cut.commit_started
    generation = m.generation
    assert m.apply("abort", A) == "idle"
    assert m.generation == generation + 1
    assert (m.cut.attempt_id, m.cut.commit_started, m.cut.commit_failed) == (None, False, False)
    assert m.state == "active"
    m.check_lifecycle(seat="b")


def test_a_new_commit_after_a_failed_one_closes_the_abort_again() -> None:
    m = Maintenance()
    m.apply("prepare", A)
    m.apply("commit", A)
    m.apply("failed", A)
    m.apply("commit", A)
    assert not m.cut.abandonable
    with pytest.raises(IllegalTransition):
        m.apply("abort", A)
    assert m.state == "preserving"


def test_a_sealed_cut_is_never_aborted() -> None:
    m = Maintenance()
    m.apply("prepare", A)
    m.apply("commit", A)
    m.apply("failed", A)
    m.apply("commit", A)
    assert m.apply("stopped", A) == "preserved"
    assert not m.cut.abandonable
    with pytest.raises(IllegalTransition, match="has begun stopping its seats"):
        m.apply("abort", A)
    assert m.state == "preserved"


def test_failed_is_a_cut_event_of_preserving_only() -> None:
    for scope in ("whole", "seats"):
        rows = ATTEMPT_TRANSITIONS[scope]
        assert [s for s, row in rows.items() if "failed" in row] == ["preserving"]
    for scope in ("restore", "adopt"):
        assert not any("failed" in row for row in ATTEMPT_TRANSITIONS[scope].values())
