"""A second cut in a root that still holds a sealed one: it captures what runs, or refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from tests.conftest import Cli
from tests.gitrepo import git, init_repo, write
from tests.helpers import pid_alive

pytestmark = pytest.mark.usefixtures("isolated_home")


def _committed_root(cli: Cli) -> None:
    init_repo(cli.root)
    write(cli.root / "f.txt", "x\n")
    git(cli.root, "add", "f.txt")
    git(cli.root, "commit", "-q", "-m", "one")


def _sealed_then_new_mesh(cli: Cli) -> tuple[str, dict[str, object]]:
    """A cut of seat `a`, then a plain `cotal up` that runs a new seat `b` beside it."""
    _committed_root(cli)
    cli.run("up", "--detach")
    cli.run("spawn", "a", "--agent", "scribe", "--prompt", "Remember the phrase first-cut-7.")
    first = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    up = cli.run("up", "--detach")
    assert (
        f"next cut: `cotal down --preserve-state` refuses (sealed-cut-waiting) while cut "
        f"{first['attemptId']} waits" in up.stderr
    )
    cli.run("spawn", "b", "--agent", "scribe", "--prompt", "Remember the phrase second-cut-9.")
    [row] = cli.ps()
    return str(first["attemptId"]), row


def test_a_second_cut_beside_a_sealed_one_refuses_and_leaves_the_seats_running(cli: Cli) -> None:
    attempt, before = _sealed_then_new_mesh(cli)
    try:
        refused = cli.run("down", "--preserve-state", "--json", check=False)
        assert refused.returncode == 2
        doc = json.loads(refused.stderr.strip().splitlines()[-1])
        assert doc["code"] == "sealed-cut-waiting"
        assert f"cut {attempt} is sealed and waiting" in doc["error"]
        assert "runs 1 seat(s) it does not hold" in doc["error"]
        assert f"cotal checkpoint discard {attempt}" in doc["error"]
        [after] = cli.ps()
        assert (after["name"], after["state"], after["pid"], after["lifecycleUid"]) == (
            "b",
            "running",
            before["pid"],
            before["lifecycleUid"],
        )
        assert pid_alive(int(str(before["pid"])))
        status = json.loads(cli.run("status", "--json").stdout)
        assert status["manager"]["state"] == "active"
        record = Journal(Layout.at(cli.root)).load()
        assert record is not None and (record.attempt_id, record.state) == (attempt, "ready")
    finally:
        cli.run("down", check=False)


def test_after_the_sealed_cut_is_discarded_the_second_cut_captures_the_new_seat(cli: Cli) -> None:
    attempt, before = _sealed_then_new_mesh(cli)
    cli.run("checkpoint", "discard", attempt)
    second = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert second["attemptId"] != attempt
    ckpt = Path(second["checkpointDir"])
    assert sorted(p.name for p in ckpt.iterdir() if p.is_dir()) == ["b"]
    assert not pid_alive(int(str(before["pid"])))
    record = Journal(Layout.at(cli.root)).load()
    assert record is not None and (record.attempt_id, record.state) == (
        second["attemptId"],
        "ready",
    )


def test_a_rerun_after_a_sealed_cut_with_no_manager_is_still_already_complete(cli: Cli) -> None:
    _committed_root(cli)
    cli.run("up", "--detach")
    cli.run("spawn", "a", "--agent", "scribe", "--prompt", "Remember the phrase only-cut-3.")
    first = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    again = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert again["attemptId"] == first["attemptId"]
    assert again["alreadyComplete"] is True
