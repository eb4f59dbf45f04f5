"""A cut that cannot finish never wedges a root (issue 42, item 0).

A repository shape the capture would refuse is refused by the preflight, before any seat stops
(a linked worktree of a bare repository); and a committed cut whose capture failed
can be abandoned: `--abort` starts the stopped seats again in their own sessions and trees under
their uids, lifts the fence, keeps the evidence, and the root works normally after it (real
daemon, broker, git and scribe seats).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from tests.conftest import Cli
from tests.gitrepo import committed_repo, git, write
from tests.helpers import refused

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PHRASE = "heron-wedge-42"


def attempts_dir(cli: Cli) -> Path:
    return cli.root / ".cotal/maintenance/v1/checkpoints"


def journal_path(cli: Cli) -> Path:
    return cli.root / ".cotal/maintenance/v1/journal.json"


def spawn(cli: Cli, name: str, cwd: Path) -> dict[str, Any]:
    seat: dict[str, Any] = cli.json(
        "spawn", name, "--agent", "scribe", "--cwd", str(cwd),
        "--prompt", f"Remember the phrase {PHRASE}.",
    )  # fmt: skip
    return seat


def answers(cli: Cli, name: str) -> None:
    reply = cli.json("send", name, "what was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}.", reply


def untouched(cli: Cli, seat: dict[str, Any]) -> None:
    """The seat never stopped: the same process, running, and nothing of a cut left behind."""
    [row] = [r for r in cli.ps() if r["name"] == seat["name"]]
    assert (row["pid"], row["lifecycleUid"], row["state"]) == (
        seat["pid"],
        seat["lifecycleUid"],
        "running",
    )
    assert not journal_path(cli).exists()
    assert not attempts_dir(cli).exists() or list(attempts_dir(cli).iterdir()) == []
    assert cli.json("status")["manager"]["state"] == "active"


async def test_seats_in_linked_worktrees_are_cut_whatever_their_repository(cli: Cli) -> None:
    # A linked worktree of an ordinary repository, that repository's main checkout with the
    # worktree attached, and a linked worktree of a bare repository each travel as a
    # repository of its own (the capture of the first once failed `bundle-refs` after the
    # stop, wedging the root; the last was refused `linked-worktree`).
    origin = committed_repo(cli.root / "origin")
    bare = cli.root / "bare.git"
    git(cli.root, "clone", "-q", "--bare", str(origin), str(bare))
    linked = cli.root / "linked"
    git(bare, "worktree", "add", "-q", str(linked), "-b", "side")
    main = committed_repo(cli.root / "main")
    side = cli.root / "side"
    git(main, "worktree", "add", "-q", str(side), "-b", "side")
    cli.run("up", "--detach")
    spawn(cli, "wt", linked)
    spawn(cli, "main", main)
    spawn(cli, "side", side)
    answers(cli, "wt")
    result = cli.json("down", "--preserve-state")
    assert result["journal"] == "ready" and result["failures"] == []
    assert sorted(seat["name"] for seat in result["seats"]) == ["main", "side", "wt"]


def _answering_seat(cli: Cli, home: Path) -> tuple[dict[str, Any], Path]:
    """A mesh running seat `kept` in a repository, answering its phrase, and a session store
    no capture carries: the seat's `ps` row and the store."""
    repo = committed_repo(cli.root / "repo")
    store = _unsafe_store(home)
    cli.run("up", "--detach")
    seat = spawn(cli, "kept", repo)
    answers(cli, "kept")
    return seat, store


async def _failed_cut(cli: Cli, store: Path) -> tuple[str, Path]:
    """A cut whose capture fails deterministically after its commit stopped the seat: a
    `--session-store` holding a symlink, which no capture carries. The attempt and its
    evidence directory."""
    out = cli.run("down", "--preserve-state", "--session-store", str(store), "--json", check=False)
    assert "link.jsonl" in refused(out, "unsafe-store")
    journal = Journal(Layout.at(cli.root)).load()
    assert journal is not None and journal.state == "cut-intent"
    attempt = journal.attempt_id
    [evidence] = [p for p in attempts_dir(cli).iterdir() if p.name.startswith(f"{attempt}.failed-")]
    assert f"evidence kept at {evidence}" in out.stderr
    status = cli.json("status")["manager"]
    assert (status["state"], status["commitStarted"]) == ("preserving", True)
    return attempt, evidence


def _unsafe_store(home: Path) -> Path:
    store = home / "extra-store"
    store.mkdir()
    write(store / "real.jsonl", "{}\n")
    os.symlink(store / "real.jsonl", store / "link.jsonl")
    return store


async def test_abort_after_a_failed_capture_starts_the_seat_again_and_keeps_the_evidence(
    cli: Cli, isolated_home: Path
) -> None:
    seat, store = _answering_seat(cli, isolated_home)
    [before] = cli.ps()
    attempt, evidence = await _failed_cut(cli, store)
    [stopped] = cli.ps()
    assert stopped["state"] == "stopped"
    # The same failure again on a rerun: the operator may choose the abort.
    again = cli.run(
        "down", "--preserve-state", "--session-store", str(store), "--json", check=False
    )
    refused(again, "unsafe-store")
    out = cli.run("down", "--preserve-state", "--abort", "--json")
    assert json.loads(out.stdout) == {
        "attemptId": attempt,
        "aborted": True,
        "fenceLifted": True,
        "journalDiscarded": True,
        "state": "active",
    }
    assert f"cut {attempt}: its commit began" in out.stderr
    [row] = cli.ps()
    assert row["state"] == "running" and row["pid"] != seat["pid"]
    assert (row["lifecycleUid"], row["sessionId"], row["cwd"]) == (
        before["lifecycleUid"],
        before["sessionId"],
        before["cwd"],
    )
    answers(cli, "kept")
    assert evidence.is_dir() and not (evidence / "manifest.json").exists()
    assert not journal_path(cli).exists()
    assert cli.json("status")["manager"]["state"] == "active"
    # Nothing is left to abort, and the root works normally: a plain `cotal down`.
    assert cli.json("down", "--preserve-state", "--abort")["aborted"] is False
    cli.run("down")


async def test_a_new_cut_after_the_abort_seals_and_resumes_the_seat(
    cli: Cli, isolated_home: Path
) -> None:
    seat, store = _answering_seat(cli, isolated_home)
    attempt, _ = await _failed_cut(cli, store)
    # Killed after the manager lifted the fence, before the journal was discarded: the rerun
    # finds every planned seat running under its uid and finishes the abort.
    killed = cli.run(
        "down", "--preserve-state", "--abort", "--json", check=False,
        env={"COTAL_FAILPOINT": "cut.abort.after-fence-lifted"},
    )  # fmt: skip
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    assert journal_path(cli).exists()
    rerun = cli.json("down", "--preserve-state", "--abort")
    assert (rerun["attemptId"], rerun["fenceLifted"], rerun["journalDiscarded"]) == (
        attempt,
        False,
        True,
    )
    [row] = cli.ps()
    assert row["lifecycleUid"] == seat["lifecycleUid"] and row["state"] == "running"
    result = cli.json("down", "--preserve-state")
    assert result["attemptId"] != attempt and result["journal"] == "ready"
    assert [s["lifecycleUid"] for s in result["seats"]] == [seat["lifecycleUid"]]
    cli.run("up", "--restore", result["checkpointDir"])
    answers(cli, "kept")
    cli.run("down")


async def test_abort_is_refused_while_a_seat_of_the_failed_cut_cannot_start(
    cli: Cli, isolated_home: Path
) -> None:
    seat, store = _answering_seat(cli, isolated_home)
    attempt, evidence = await _failed_cut(cli, store)
    # The session pointer gone, the seat cannot be started into its session: the abort names
    # the seat and the cause, and the cut stays fenced with the seat stopped.
    pointer = Layout.at(cli.root).session_pointer("scribe", "kept", seat["lifecycleUid"])
    away = pointer.rename(pointer.with_name(pointer.name + ".away"))
    out = cli.run("down", "--preserve-state", "--abort", "--json", check=False)
    message = refused(out, "session-unknown")
    assert f"cut {attempt} cannot be aborted: seat kept did not start again" in message
    [row] = cli.ps()
    assert row["state"] == "stopped"
    status = cli.json("status")["manager"]
    assert (status["state"], status["commitStarted"]) == ("preserving", True)
    away.rename(pointer)
    # The cause put back, the rerun of the abort finishes it.
    done = cli.json("down", "--preserve-state", "--abort")
    assert done["aborted"] is True and done["journalDiscarded"] is True
    answers(cli, "kept")
    assert evidence.is_dir()
    cli.run("down")


async def test_a_declared_ignored_path_the_capture_refuses_is_refused_before_the_stop(
    cli: Cli,
) -> None:
    repo = committed_repo(cli.root / "repo")
    write(repo / ".gitignore", "vendor/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore vendor")
    # A repository of its own under a path the root declares to carry: its history cannot
    # travel in the untracked archive, which the capture refused only after the stop.
    committed_repo(repo / "vendor" / "lib")
    (cli.root / "cotal.toml").write_text('[carry]\ninclude = ["vendor/*"]\n')
    cli.run("up", "--detach")
    seat = spawn(cli, "kept", repo)
    out = cli.run("down", "--preserve-state", "--json", check=False)
    message = refused(out, "untracked-unsupported")
    assert f"seat kept: {repo} holds nested repositories (vendor/lib/)" in message
    assert "nothing was stopped" in message
    untouched(cli, seat)
    answers(cli, "kept")
    cli.run("down")
