"""The Gemini CLI seat's store as the connector prepares it for a continuation
(connectors/gemini.py): the session's chat file renamed away from Gemini's minute stamp, the
empty files of earlier starts removed, the project re-keyed by the seat's new path; a session
that took no turn left for the driver to open anew, under the seat's id; and a session the
store never held refused by name, changing nothing. The files are written in the shape
Gemini CLI 0.61.0 writes them (measured; the real harness runs in
tests/e2e/test_gemini_seat.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from connectors.gemini import (
    canonical,
    chat_files,
    has_session,
    prepare_continuation,
    record_alias,
    session_alias,
)
from protocol.errors import Refusal

SID = "14f7c4ea-3ea7-4eab-ab20-54171123e090"
STRAY = "42287d3e-8499-4175-8e10-b6e762513764"
CONTEXT = {"id": "ctx", "type": "user", "content": [{"text": "<session_context>\nfolder"}]}


def chat(path: Path, sid: str, *records: dict[str, Any]) -> Path:
    """A chat file as Gemini CLI writes it: its header, then the records appended."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"sessionId": sid, "projectHash": "h", "startTime": "t", "lastUpdated": "t"}
    lines = [header, {"$set": {"messages": [CONTEXT]}}, *records]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def store_at(tmp_path: Path, old: Path) -> Path:
    store = tmp_path / "seat.home"
    top = store / ".gemini"
    for base in ("tmp", "history"):
        (top / base / "ws").mkdir(parents=True)
        (top / base / "ws" / ".project_root").write_text(str(old))
    (top / "projects.json").write_text(json.dumps({"projects": {str(old): "ws"}}))
    return store


def test_a_continuation_renames_the_session_cleans_the_starts_and_rekeys_the_project(
    tmp_path: Path,
) -> None:
    old, new = tmp_path / "a" / "ws", tmp_path / "b" / "ws2"
    store = store_at(tmp_path, old)
    chats = store / ".gemini" / "tmp" / "ws" / "chats"
    turn = {"id": "u1", "type": "user", "content": [{"text": "remember the phrase x"}]}
    session = chat(chats / f"session-2026-12-07T11-18-{SID[:8]}.jsonl", SID, turn)
    # What each start writes: the session it opened before the load (another id), and the
    # load's own file of this session, holding only Gemini's context.
    chat(chats / f"session-2026-12-07T11-19-{STRAY[:8]}.jsonl", STRAY)
    chat(chats / f"session-2026-12-07T11-19-{SID[:8]}.jsonl", SID)
    body = session.read_bytes()
    assert has_session(store, SID)

    assert prepare_continuation(store, SID, new) == SID
    target = canonical(chats, SID)
    assert target == chats / f"session-cotal-{SID[:8]}.jsonl"
    assert sorted(p.name for p in chats.iterdir()) == [target.name]
    assert target.read_bytes() == body
    top = store / ".gemini"
    assert json.loads((top / "projects.json").read_text()) == {"projects": {str(new): "ws"}}
    for base in ("tmp", "history"):
        assert (top / base / "ws" / ".project_root").read_text() == str(new)
    # Again, as at every later continuation: nothing moves.
    assert prepare_continuation(store, SID, new) == SID
    assert [c.path for c in chat_files(store, SID)] == [target]


def test_a_session_that_took_no_turn_is_opened_anew_and_one_never_stored_is_refused(
    tmp_path: Path,
) -> None:
    old, new = tmp_path / "a" / "ws", tmp_path / "b" / "ws2"
    store = store_at(tmp_path, old)
    chats = store / ".gemini" / "tmp" / "ws" / "chats"
    # A rewind back past the only turn, then Gemini's own context set again: nothing to load,
    # and nothing to continue either.
    turn = {"id": "u1", "type": "user", "content": "remember the phrase x"}
    chat(chats / f"session-2026-12-07T11-18-{SID[:8]}.jsonl", SID, turn, {"$rewindTo": "u1"})
    # Twice, as when the start that was to open its successor failed.
    assert prepare_continuation(store, SID, new) is None
    empty = chats / f"session-2026-12-07T11-18-{SID[:8]}.jsonl"
    assert prepare_continuation(store, SID, new) is None
    assert list(chats.iterdir()) == [empty]
    assert json.loads((store / ".gemini" / "projects.json").read_text()) == {
        "projects": {str(new): "ws"}
    }
    # The driver opens a new Gemini session for the seat's and records it: a later
    # continuation loads that one, under its own canonical name.
    record_alias(store, SID, STRAY)
    assert session_alias(store, SID) == STRAY and session_alias(store, STRAY) == STRAY
    said = {"id": "u2", "type": "user", "content": "hello"}
    chat(chats / f"session-2026-12-07T11-19-{STRAY[:8]}.jsonl", STRAY, said)
    assert prepare_continuation(store, SID, new) == STRAY
    assert [p.name for p in chats.iterdir()] == [f"session-cotal-{STRAY[:8]}.jsonl"]

    before = sorted((p, p.read_bytes()) for p in store.rglob("*") if p.is_file())
    other = "0b5e31c2-0000-4000-8000-000000000000"
    with pytest.raises(Refusal) as exc:
        prepare_continuation(store, other, new)
    assert exc.value.code == "no-session" and "no chat file" in exc.value.message
    assert sorted((p, p.read_bytes()) for p in store.rglob("*") if p.is_file()) == before
