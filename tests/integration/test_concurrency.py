"""Concurrency changes no outcome: 20 seats cut and resumed with one job and with several give
exactly the refusals, records and tables a sequential loop gives (real daemon, broker, git)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from manager.checkpoint.gitstate import preflight_repository
from manager.checkpoint.reader import read_manifest, verify_integrity
from manager.control.client import ControlClient
from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from protocol.errors import Refusal
from tests.conftest import Cli, SharedBroker
from tests.gitrepo import git, init_repo, write
from tests.helpers import carry_to_new_host, wait_gone

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SEATS = [f"s{i:02d}" for i in range(20)]
# Out of seat order on purpose: the refusal must name the first of them in seat order.
REFUSED_AT_PREFLIGHT = ["s13", "s07"]
FAILS_CAPTURE = "s11"


def committed_repo(path: Path, name: str) -> Path:
    repo = init_repo(path)
    write(repo / "a.txt", f"{name}\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", name)
    write(repo / "wip.txt", f"work in progress of {name}\n")
    return repo


def break_hooks(repo: Path) -> None:
    """A hooks directory that is a symlink: the capture cannot carry it, so git state refuses."""
    hooks = repo / ".git" / "hooks"
    shutil.rmtree(hooks)
    hooks.symlink_to(repo.parent)


def mend_hooks(repo: Path) -> None:
    hooks = repo / ".git" / "hooks"
    hooks.unlink()
    hooks.mkdir()


async def expected_refusal(repo: Path) -> Refusal:
    """What git state says of `repo` on its own: the oracle a cut's refusal must match."""
    with pytest.raises(Refusal) as caught:
        await preflight_repository(repo)
    return caught.value


def refusal_of(out: Any) -> dict[str, Any]:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    doc = json.loads(out.stderr.strip().splitlines()[-1])
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("jobs", ["1", "6"])
async def test_twenty_seats_cut_and_resume_as_a_loop_would(
    jobs: str, tmp_path: Path, cli: Cli, shared_broker: SharedBroker
) -> None:
    env = {"COTAL_JOBS": jobs}
    repos = {name: committed_repo(cli.root / "trees" / name, name) for name in SEATS}
    cli.run(
        "up", "--detach", "--server", shared_broker.url, "--creds", shared_broker.creds, env=env
    )
    rows = {
        name: cli.json(
            "spawn", name, "--cwd", str(repos[name]), "--prompt", f"Remember the phrase {name}-p"
        )
        for name in SEATS
    }

    # Two seats refuse at prepare: the cut names the first in seat order and stops nothing.
    for name in REFUSED_AT_PREFLIGHT:
        break_hooks(repos[name])
    first = min(REFUSED_AT_PREFLIGHT)
    oracle = await expected_refusal(repos[first])
    doc = refusal_of(cli.run("down", "--preserve-state", "--json", check=False, env=env))
    assert doc["code"] == oracle.code == "gitdir-unsupported"
    assert doc["error"] == f"seat {first}: {oracle.message}; {oracle.cure}; nothing was stopped"
    assert cli.json("status")["state"] == "active"
    assert {r["name"]: (r["pid"], r["state"]) for r in cli.ps()} == {
        name: (row["pid"], "running") for name, row in rows.items()
    }
    for name in REFUSED_AT_PREFLIGHT:
        mend_hooks(repos[name])

    # One seat's capture fails after every seat stopped: it alone is named, nothing is sealed.
    layout = Layout.at(cli.root)
    c = await ControlClient.connect(layout.socket, layout.control_token.read_text().strip())
    async with c:
        await c.call("prepare-preservation", {"attemptId": "conc-1"})
    break_hooks(repos[FAILS_CAPTURE])
    oracle = await expected_refusal(repos[FAILS_CAPTURE])
    doc = refusal_of(cli.run("down", "--preserve-state", "--json", check=False, env=env))
    assert doc["code"] == oracle.code
    assert doc["error"].startswith(f"cut conc-1 is incomplete: {FAILS_CAPTURE}: {oracle.text}; ")
    journal = Journal(layout).load()
    assert journal is not None and journal.state == "cut-intent"
    # The capture progress the coordinator read came one seat after another, in seat order; a
    # count the throttle held back is flushed, sorted, when the next phase begins. The failing
    # seat reports progress or not depending on how far its capture got before the broken
    # hook (on a busy host, far enough): its records are left out of the order.
    c = await ControlClient.connect(layout.socket, layout.control_token.read_text().strip())
    async with c:
        progress = await c.call("progress", {"attemptId": "conc-1", "after": 0})
    runs: list[str] = []
    for record in progress["records"]:
        if record["phase"] != "capture" or record["seat"] == FAILS_CAPTURE:
            continue
        if not runs or runs[-1] != record["seat"]:
            runs.append(record["seat"])
    captured = [name for name in SEATS if name != FAILS_CAPTURE]
    assert runs[: len(captured)] == captured, runs
    assert runs[len(captured) :] == sorted(runs[len(captured) :]), runs
    await wait_gone([row["pid"] for row in rows.values()])
    checkpoints = cli.root / ".cotal/maintenance/v1/checkpoints"
    assert not list(checkpoints.rglob("manifest.json"))
    [evidence] = [p for p in checkpoints.iterdir() if p.name.startswith("conc-1.failed-")]
    assert FAILS_CAPTURE not in {
        p.name for p in evidence.iterdir() if (p / "checkpoint.json").exists()
    }

    # Mended, the rerun seals all twenty, in seat order everywhere.
    mend_hooks(repos[FAILS_CAPTURE])
    result = json.loads(cli.run("down", "--preserve-state", "--json", env=env).stdout)
    assert result["attemptId"] == "conc-1" and result["journal"] == "ready"
    assert result["failures"] == []
    assert [s["name"] for s in result["seats"]] == SEATS
    attempt_dir = Path(result["checkpointDir"])
    assert [s.name for s in read_manifest(attempt_dir).seats] == SEATS
    records = {r.name: r for r in verify_integrity(attempt_dir)}
    assert sorted(records) == SEATS
    for name, row in rows.items():
        assert records[name].lifecycle_uid == row["lifecycleUid"]
        assert records[name].session.session_id == row["sessionId"]

    # The resume restores every tree and adopts every seat, still in seat order.
    copy = carry_to_new_host(cli.root, attempt_dir, tmp_path)
    assert not (cli.root / "trees").exists()
    out = cli.run(
        "up",
        "--restore",
        str(copy),
        "--server",
        shared_broker.url,
        "--creds",
        shared_broker.creds,
        "--jobs",
        jobs,
        "--json",
        timeout=300,
    )
    resumed = json.loads(out.stdout)
    assert [r["name"] for r in resumed["restored"]] == SEATS
    assert [r["cwd"] for r in resumed["restored"]] == [str(repos[n]) for n in SEATS]
    assert [s["name"] for s in resumed["seats"]] == SEATS
    assert all(s["sameUid"] and s["sameSession"] for s in resumed["seats"])
    restoring = [line for line in out.stderr.splitlines() if line.startswith("restoring ")]
    assert restoring == [f"restoring {n} into {repos[n]}" for n in SEATS]
    for name in SEATS:
        assert (repos[name] / "wip.txt").read_text() == f"work in progress of {name}\n"
    assert {r["name"]: (r["lifecycleUid"], r["state"]) for r in cli.ps()} == {
        name: (row["lifecycleUid"], "running") for name, row in rows.items()
    }
    for name in (SEATS[0], SEATS[-1]):
        reply = cli.json("send", name, "what was the phrase?", "--wait")["reply"]
        assert reply == f"The phrase is {name}-p."
    cli.run("down")


def test_a_jobs_flag_that_does_not_parse_is_a_usage_error_naming_it(cli: Cli) -> None:
    out = cli.run("up", "--jobs", "0x4", check=False)
    assert out.returncode == 64
    assert "argument --jobs: --jobs='0x4' is not a whole number of jobs from 1 to 256" in out.stderr
    assert not (cli.root / ".cotal/mesh.json").exists()


async def test_a_manager_with_a_bad_cotal_jobs_refuses_the_cut_before_stopping_anything(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    env = {"COTAL_JOBS": "many"}
    repo = committed_repo(cli.root / "repo", "one")
    cli.run(
        "up", "--detach", "--server", shared_broker.url, "--creds", shared_broker.creds, env=env
    )
    row = cli.json("spawn", "one", "--cwd", str(repo))
    doc = refusal_of(cli.run("down", "--preserve-state", "--json", check=False))
    assert doc["code"] == "bad-jobs"
    assert doc["error"].startswith(
        "COTAL_JOBS='many' is not a whole number of jobs from 1 to 256; "
    )
    assert cli.json("status")["state"] == "active"
    assert [(r["pid"], r["state"]) for r in cli.ps()] == [(row["pid"], "running")]
    cli.run("down")
