"""A fork-class seat resumes as a fork: a new session that carries the recorded history, the
recorded one left as it was (record 5.2). `scribe-fork` is the built-in harness that can only
resume that way."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import Cli, SharedBroker
from tests.e2e.test_relocation import _carry, _hosts, _restore, _spawn_and_cut
from tests.e2e.test_resume import PHRASE, make_workspace

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]


def _digests(top: Path) -> dict[str, str]:
    return {
        str(p.relative_to(top)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(top.rglob("*"))
        if p.is_file()
    }


async def test_a_fork_class_seat_resumes_as_a_fork_with_its_history(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    a, dest = _hosts(tmp_path)
    make_workspace(a.root)
    row, attempt_dir = _spawn_and_cut(a, shared_broker, a.root, agent="scribe-fork")
    checkpoint = json.loads((attempt_dir / "default" / "checkpoint.json").read_text())
    assert checkpoint["session"]["continuity"] == "fork", checkpoint["session"]
    copy = _carry(a, dest, attempt_dir, tmp_path)
    carried = _digests(copy)

    result = _restore(dest, copy, shared_broker)
    [seat] = result["seats"]
    assert seat["continuity"] == "fork"
    assert seat["observation"] == "forked: a new session carrying the recorded history"
    assert seat["sessionBefore"] == row["sessionId"]
    assert seat["sessionAfter"] and seat["sessionAfter"] != seat["sessionBefore"]
    assert seat["sameSession"] is False and seat["sameUid"] is True
    # The fork carries the history: the phrase the seat was told before the cut is answered.
    reply = dest.json("send", "default", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}."
    [after] = dest.ps()
    assert after["sessionId"] == seat["sessionAfter"]
    # What was carried is the recorded session, untouched by the fork.
    assert _digests(copy) == carried
    dest.run("down")


def test_scribe_fork_declares_the_fork_class(cli: Cli) -> None:
    from connectors.base import continuity_class
    from manager.registry import load_connector

    assert continuity_class(load_connector("scribe-fork").capabilities) == "fork"
    assert continuity_class(load_connector("scribe").capabilities) == "exact"
