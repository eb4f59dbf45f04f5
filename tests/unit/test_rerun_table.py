"""The rerun table: what each command does with the journal it finds, read by the cut, the
restore, `cotal status` and `cotal checkpoint list`/`discard`; and no coordinator spelling a
journal state out for itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from manager.cli import status
from manager.coord import checkpoints
from manager.coord.records import Discarded
from manager.workspace.journal import Journal, write_resume_document
from manager.workspace.layout import Layout
from protocol.errors import Refusal
from protocol.inventory import parse_resume_args
from protocol.maintenance import (
    ABSENT,
    COMMANDS,
    CUT_UNDER_WAY,
    JOURNAL_STATES,
    NEEDS_CHECKPOINT,
    RERUN,
    RESUME_ADOPTED,
    RESUME_UNDER_WAY,
    TERMINAL_STATES,
    UNDER_WAY,
    Action,
    Command,
    Degraded,
    JournalState,
    rerun,
)
from protocol.refusals import CATALOGUE
from tests.unit.test_inventory import ATTEMPT, inventory_doc, raw

ROOT = Path(__file__).resolve().parents[2]
A = ATTEMPT
TOKEN = "f" * 64

# Each state reached for real through the journal, from nothing.
PATH: dict[JournalState, list[JournalState]] = {
    "cut-intent": ["cut-intent"],
    "cut-committed": ["cut-intent", "cut-committed"],
    "ready": ["cut-intent", "cut-committed", "ready"],
    "resume-intent": ["resume-intent"],
    "resume-active": ["resume-intent", "resume-active"],
    "resume-committed": ["resume-intent", "resume-active", "resume-committed"],
    "retired": ["resume-intent", "resume-active", "resume-committed", "retired"],
    "degraded": ["resume-intent", "degraded"],
}


def journal_at(layout: Layout, state: JournalState) -> None:
    journal = Journal(layout)
    desc = write_resume_document(layout, parse_resume_args(A, raw(inventory_doc())))
    for step in PATH[state]:
        journal.advance(
            A,
            step,
            resume=desc if step in ("cut-intent", "resume-intent") else None,
            durable_commit_token=TOKEN if step == "resume-committed" else None,
            degraded=Degraded(reason="broker gone", recourse="start it, then resume again")
            if step == "degraded"
            else None,
        )
    record = journal.load()
    assert record is not None and record.state == state


def kinds(command: Command) -> dict[str, str]:
    return {state: RERUN[state][command].kind for state in RERUN}


# -- the table itself ------------------------------------------------------------------------------


def test_the_table_covers_every_state_and_command() -> None:
    assert list(RERUN) == [ABSENT, *JOURNAL_STATES]
    assert set(COMMANDS) == {"cut", "abort", "restore", "discard", "up", "down"}
    for state, row in RERUN.items():
        assert list(row) == list(COMMANDS), state
        for command, action in row.items():
            assert rerun(None if state == ABSENT else state, command) is action
            refuses = action.kind == "refuse"
            assert (action.code is not None) == refuses == bool(action.what), (state, command)
            assert bool(action.cure) == refuses, (state, command)
            assert not (action.finished and action.kind != "continue"), (state, command)
    with pytest.raises(KeyError):
        rerun("sealed", "cut")


def test_every_refusal_is_catalogued_and_names_the_attempt() -> None:
    for state, row in RERUN.items():
        for command, action in row.items():
            if action.kind != "refuse":
                continue
            refusal = action.refusal(attempt=A, state=state)
            assert refusal.code in CATALOGUE and refusal.cure, (state, command)
            assert A in refusal.message or state in refusal.message, (state, command)


def test_the_refusal_code_shape_is_checked_when_a_cell_is_made() -> None:
    from protocol.maintenance import _refusing

    with pytest.raises(Exception, match="regex"):
        _refusing("Journal Busy", "what", "cure")
    with pytest.raises(AssertionError):
        Action(kind="continue").refusal(attempt=A, state="ready")


def test_each_command_by_state() -> None:
    assert kinds("cut") == {
        ABSENT: "fresh",
        "cut-intent": "continue",
        "cut-committed": "continue",
        "ready": "continue",
        "resume-intent": "refuse",
        "resume-active": "refuse",
        "resume-committed": "refuse",
        "retired": "fresh",
        "degraded": "fresh",
    }
    assert kinds("abort") == {
        ABSENT: "fresh",
        "cut-intent": "continue",
        "cut-committed": "refuse",
        "ready": "refuse",
        "resume-intent": "refuse",
        "resume-active": "refuse",
        "resume-committed": "refuse",
        "retired": "fresh",
        "degraded": "fresh",
    }
    assert kinds("restore") == {
        ABSENT: "fresh",
        "cut-intent": "refuse",
        "cut-committed": "refuse",
        "ready": "join",
        "resume-intent": "continue",
        "resume-active": "continue",
        "resume-committed": "continue",
        "retired": "fresh",
        "degraded": "fresh",
    }
    assert kinds("discard") == {
        ABSENT: "fresh",
        "cut-intent": "refuse",
        "cut-committed": "refuse",
        "ready": "continue",
        "resume-intent": "refuse",
        "resume-active": "refuse",
        "resume-committed": "refuse",
        "retired": "continue",
        "degraded": "continue",
    }
    # The plain commands never read the journal to decide: a fresh mesh, a plain stop.
    for command in ("up", "down"):
        assert set(kinds(command).values()) == {"fresh"}
        assert not any(RERUN[s][command].drops for s in RERUN)
    assert not any(RERUN[s]["down"].warns for s in RERUN)


def test_a_sealed_cut_is_reported_not_cut_again() -> None:
    action = rerun("ready", "cut")
    assert action == Action(kind="continue", finished=True)
    # A sealed cut cannot be aborted: its seats were stopped and captured.
    refusal = rerun("ready", "abort").refusal(attempt=A, state="ready")
    assert (refusal.code, refusal.message, refusal.cure) == (
        "commit-begun",
        f"cut {A} is already committed (journal ready); its seats were stopped and captured, so "
        "it cannot be aborted",
        "resume it with `cotal up --restore`",
    )
    # The same-root resume carries the cut's journal on.
    assert rerun("ready", "restore") == Action(kind="join")


def test_an_intent_is_aborted_before_its_commit_and_continued_by_a_cut() -> None:
    assert rerun("cut-intent", "abort") == Action(kind="continue", drops=True)
    assert rerun("cut-intent", "cut") == Action(kind="continue", revive_broker=True)
    assert rerun("cut-committed", "cut") == Action(kind="continue")
    refusal = rerun("cut-committed", "abort").refusal(attempt=A, state="cut-committed")
    assert (refusal.code, refusal.cure) == (
        "commit-begun",
        "rerun `cotal down --preserve-state` to finish the cut",
    )


def test_an_ended_attempt_is_cleared_before_a_new_one() -> None:
    for state in TERMINAL_STATES:
        assert rerun(state, "restore") == Action(kind="fresh", drops=True)
        assert rerun(state, "cut") == Action(kind="fresh", drops=True)
        # An abort has nothing to abort there and leaves the record as it is.
        assert rerun(state, "abort") == Action(kind="fresh")


def test_a_resume_under_way_refuses_a_cut_and_is_continued_by_a_restore() -> None:
    refusal = rerun("resume-active", "cut").refusal(attempt=A, state="resume-active")
    assert (refusal.code, refusal.message, refusal.cure) == (
        "journal-busy",
        f"the maintenance journal is at resume-active for attempt {A}",
        "finish that resume (cotal up --restore) first",
    )
    refusal = rerun("resume-intent", "abort").refusal(attempt=A, state="resume-intent")
    assert refusal.message == (
        f"the maintenance journal is at resume-intent for resume attempt {A}; there is no cut "
        "to abort"
    )
    for state in RESUME_UNDER_WAY:
        assert rerun(state, "restore") == Action(kind="continue", revive_broker=True)
    refusal = rerun("cut-committed", "restore").refusal(attempt=A, state="cut-committed")
    assert (refusal.code, refusal.message) == (
        "illegal-transition",
        'maintenance journal state "cut-committed" does not allow event "begin-resume"',
    )


def test_the_groups_are_the_tables_columns() -> None:
    states = set(JOURNAL_STATES)
    assert UNDER_WAY == {s for s in states if rerun(s, "discard").kind == "refuse"}
    assert RESUME_UNDER_WAY == {s for s in states if rerun(s, "restore").kind == "continue"}
    assert CUT_UNDER_WAY == {
        s for s in states if rerun(s, "cut").kind == "continue" and not rerun(s, "cut").finished
    }
    assert NEEDS_CHECKPOINT == UNDER_WAY | {"ready"}
    assert RESUME_ADOPTED == {"resume-active", "resume-committed"} < RESUME_UNDER_WAY
    # What a plain `up` warns of is everything not over, and a degraded attempt's recourse.
    assert {s for s in states if rerun(s, "up").warns} == states - {"retired"}


# -- the commands read it --------------------------------------------------------------------------


@pytest.mark.parametrize("state", JOURNAL_STATES)
def test_status_waits_on_exactly_what_a_plain_up_warns_of(
    tmp_path: Path, state: JournalState
) -> None:
    layout = Layout.at(tmp_path)
    journal_at(layout, state)
    items = status.waiting(layout)
    assert len(items) == (1 if rerun(state, "up").warns else 0)
    if items:
        assert items[0]["journalState"] == state and items[0]["attemptId"] == A


@pytest.mark.parametrize("state", JOURNAL_STATES)
def test_discard_follows_the_table(tmp_path: Path, state: JournalState) -> None:
    layout = Layout.at(tmp_path)
    journal_at(layout, state)
    (layout.checkpoints / A).mkdir(parents=True)
    listed = checkpoints.gather(tmp_path).checkpoints
    assert [(c.attempt_id, c.journal_needs_it) for c in listed] == [(A, state in NEEDS_CHECKPOINT)]
    action = rerun(state, "discard")
    if action.kind == "refuse":
        with pytest.raises(Refusal) as info:
            checkpoints.discard(tmp_path, A)
        assert info.value.code == "journal-needs-it"
        assert info.value.message == (
            f"this root's maintenance journal is at {state} for attempt {A}: the attempt still "
            "reads this checkpoint"
        )
        assert (layout.checkpoints / A).is_dir() and layout.journal.exists()
        return
    out = checkpoints.discard(tmp_path, A)
    assert out == Discarded(
        attempt_id=A, removed=str(layout.checkpoints / A), journal_discarded=state
    )
    assert not (layout.checkpoints / A).exists() and not layout.journal.exists()


# -- no coordinator spells a journal state out -----------------------------------------------------

STATE_LITERAL = re.compile(
    r'"(cut-intent|cut-committed|ready|resume-intent|resume-active|resume-committed|retired'
    r'|degraded)"'
)
# Words that only look like a journal state: a harness install's state in `cotal doctor`.
NOT_JOURNAL = {("manager/cli/doctor.py", 'return "ready"')}


def test_no_journal_state_literal_in_the_cli() -> None:
    found = [
        (path.relative_to(ROOT).as_posix(), line.strip())
        for path in sorted((ROOT / "manager" / "cli").rglob("*.py"))
        for line in path.read_text().splitlines()
        if STATE_LITERAL.search(line)
    ]
    assert [hit for hit in found if hit not in NOT_JOURNAL] == []
