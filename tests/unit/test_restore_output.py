"""What `cotal up --restore` prints for people: a tree it moved aside is named, once per tree."""

from __future__ import annotations

import argparse

import pytest

from manager.cli import restore


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
    restore._print(argparse.Namespace(json=False), out)
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
    restore._print(argparse.Namespace(json=False), out)
    assert "kept the tree" not in capsys.readouterr().out
