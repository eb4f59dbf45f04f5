"""What `cotal up --restore` prints for people: a tree it moved aside is named, once per tree."""

from __future__ import annotations

import msgspec
import pytest

from manager.cli import results
from manager.coord.records import RestoreResult


def _seat(name: str) -> dict[str, object]:
    return {
        "name": name,
        "continuity": "exact",
        "observation": "reopened",
        "sessionBefore": "s1",
        "sessionAfter": "s1",
        "sameSession": True,
        "uidBefore": "u1",
        "uidAfter": "u1",
        "sameUid": True,
    }


def _result(doc: dict[str, object]) -> RestoreResult:
    """The record a restore returns, from the JSON document it prints: the same strict decode a
    move's source applies to its destination's answer."""
    signer = {
        "instanceId": "i1",
        "publicKey": "k",
        "fingerprint": "f",
        "pinned": False,
        "trustedAs": "own",
    }
    full = {
        "continued": False,
        "claims": [],
        "consents": [],
        "evictionEvidence": [],
        "signer": signer,
        **doc,
    }
    return msgspec.convert(full, RestoreResult)


def test_a_superseded_tree_is_named_in_the_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    out = {
        "attemptId": "a1",
        "state": "active",
        "journal": "resumed",
        "wallMs": 12,
        "seats": [_seat("w1"), _seat("w2")],
        "restored": [
            {"name": "w1", "cwd": "/r", "superseded": "/r.superseded.x", "sessionFiles": 1},
            {"name": "w2", "cwd": "/r", "superseded": "/r.superseded.x", "sessionFiles": 1},
        ],
    }
    results.restored(False, _result(out))
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines.count(
            "  kept the tree that stood there before at /r.superseded.x (remove it once not needed)"
        )
        == 1
    )


def test_no_line_when_nothing_was_moved_aside(capsys: pytest.CaptureFixture[str]) -> None:
    out = {
        "attemptId": "a1",
        "state": "active",
        "journal": "resumed",
        "wallMs": 12,
        "seats": [_seat("w1")],
        "restored": [{"name": "w1", "cwd": "/r", "superseded": None, "sessionFiles": 1}],
    }
    results.restored(False, _result(out))
    assert "kept the tree" not in capsys.readouterr().out
