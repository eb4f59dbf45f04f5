"""`cotal checkpoint list` and `cotal checkpoint discard` against real cuts (real processes)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from tests.conftest import Cli
from tests.gitrepo import git, init_repo, write

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

FIELDS = {
    "name",
    "attemptId",
    "path",
    "state",
    "detail",
    "seats",
    "bytes",
    "createdAt",
    "handedOff",
    "journalState",
    "journalNeedsIt",
}


def _repo(root: Path) -> None:
    init_repo(root)
    write(root / "f.txt", "x\n")
    git(root, "add", "f.txt")
    git(root, "commit", "-q", "-m", "one")


def _cut(cli: Cli) -> dict[str, Any]:
    cli.run("up", "--detach")
    cli.json("spawn", "alice")
    cut: dict[str, Any] = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    return cut


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def refusal(proc: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(proc.stderr.splitlines()[-1])
    return doc


def test_list_discard_and_the_journal(cli: Cli) -> None:
    _repo(cli.root)
    assert cli.json("checkpoint", "list")["checkpoints"] == []
    first = _cut(cli)
    # A second cut in the same root: the first attempt's journal is retired by the resume.
    cli.run("up", "--restore", first["checkpointDir"])
    second = cli.json("down", "--preserve-state")
    # Evidence a failed cut left aside.
    aside = Path(second["checkpointDir"]).with_name(
        f"{second['attemptId']}.partial-20261201T000000Z"
    )
    (aside / "alice").mkdir(parents=True)
    (aside / "alice" / "half.bin").write_bytes(b"x" * 10)

    doc = cli.json("checkpoint", "list")
    assert doc["root"] == str(cli.root) and doc["journalError"] is None
    by_name = {c["name"]: c for c in doc["checkpoints"]}
    assert sorted(by_name) == sorted([first["attemptId"], second["attemptId"], aside.name])
    assert all(set(c) == FIELDS for c in doc["checkpoints"])
    old, new, failed = (
        by_name[first["attemptId"]],
        by_name[second["attemptId"]],
        by_name[aside.name],
    )
    assert old == {
        "name": first["attemptId"],
        "attemptId": first["attemptId"],
        "path": first["checkpointDir"],
        "state": "sealed",
        "detail": None,
        "seats": ["alice"],
        "bytes": _bytes(Path(first["checkpointDir"])),
        "createdAt": old["createdAt"],
        "handedOff": None,
        "journalState": None,
        "journalNeedsIt": False,
    }
    assert new["state"] == "sealed" and new["journalState"] == "ready" and new["journalNeedsIt"]
    assert failed["state"] == "failed" and failed["attemptId"] == second["attemptId"]
    assert failed["seats"] == ["alice"] and failed["bytes"] == 10 and failed["journalState"] is None
    human = cli.run("checkpoint", "list").stdout
    assert f"{second['attemptId']}" in human and "journal ready" in human

    # A sealed attempt no journal needs, and failed evidence: removed.
    out = cli.json("checkpoint", "discard", first["attemptId"])
    assert out == {
        "attemptId": first["attemptId"],
        "removed": first["checkpointDir"],
        "journalDiscarded": None,
    }
    assert not Path(first["checkpointDir"]).exists()
    cli.json("checkpoint", "discard", aside.name)
    assert not aside.exists()
    gone = cli.run("checkpoint", "discard", first["attemptId"], "--json", check=False)
    assert gone.returncode == 2 and refusal(gone)["code"] == "no-such-checkpoint"

    # A resume stopped part-way still reads its checkpoint: refused, naming state and cure.
    layout = Layout.at(cli.root)
    journal = Journal(layout)
    ready = journal.load()
    assert ready is not None and ready.state == "ready"
    journal_bytes = journal.path.read_bytes()
    journal.advance(second["attemptId"], "resume-intent", resume=ready.resume)
    proc = cli.run("checkpoint", "discard", second["attemptId"], "--json", check=False)
    assert proc.returncode == 2
    doc = refusal(proc)
    assert doc["code"] == "journal-needs-it" and "resume-intent" in doc["error"], doc
    assert "cotal up --restore" in doc["error"] and "abandon" in doc["error"]
    assert Path(second["checkpointDir"]).is_dir()

    # Back at `ready`: the cure `cotal status` prints discards the cut and its journal.
    os.chmod(journal.path, 0o600)
    journal.path.write_bytes(journal_bytes)
    [waiting] = cli.json("status")["waiting"]
    assert f"cotal checkpoint discard {second['attemptId']}" in waiting["next"]
    out = cli.json("checkpoint", "discard", second["attemptId"])
    assert out == {
        "attemptId": second["attemptId"],
        "removed": second["checkpointDir"],
        "journalDiscarded": "ready",
    }
    assert cli.json("status")["waiting"] == []
    assert cli.json("checkpoint", "list")["checkpoints"] == []
    human = cli.run("up", "--detach")
    try:
        assert "warning" not in human.stderr
    finally:
        cli.run("down")
