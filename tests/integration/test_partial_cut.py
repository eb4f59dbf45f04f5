"""A cut of some seats: `cotal down --preserve-state --seat NAME` while the mesh runs.

Three seats; one is cut. The other two keep their processes and answer while the cut runs, a
seat spawned during it works, the manager and the broker stay up, and the cut seat resumes in
place (adopted back into the running mesh) under its uid and session. A coordinator killed after
the fence leaves the seat fenced alone: `--abort` lets it run on, a rerun finishes the cut.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import anyio
import pytest

from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from tests.conftest import Cli
from tests.gitrepo import committed_repo
from tests.helpers import refused, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PHRASE = "osprey-partial-17"


def mesh_of_three(cli: Cli) -> dict[str, dict[str, Any]]:
    shared = committed_repo(cli.root / "shared")
    own = committed_repo(cli.root / "own")
    cli.run("up", "--detach")
    seats = {}
    for name, cwd, prompt in (
        ("a", shared, "I am a."),
        ("b", own, f"Remember the phrase {PHRASE}."),
        ("c", shared, "I am c."),
    ):
        seats[name] = cli.json(
            "spawn", name, "--agent", "scribe", "--cwd", str(cwd), "--prompt", prompt
        )
    return seats


def pids(cli: Cli) -> dict[str, int]:
    return {r["name"]: r["pid"] for r in cli.ps()}


async def test_one_seat_is_cut_while_the_others_work_and_it_resumes_in_place(cli: Cli) -> None:
    seats = mesh_of_three(cli)
    before = pids(cli)
    # A slow turn holds b's drain, so the cut is still running while the mesh is used.
    cli.json("send", "b", "#slow:6000 take your time")
    done: list[subprocess.CompletedProcess[str]] = []

    async def run_cut() -> None:
        done.append(
            await anyio.to_thread.run_sync(
                lambda: cli.run(
                    "down", "--preserve-state", "--seat", "b", "--json", check=False, timeout=90
                )
            )
        )

    def fenced() -> bool:
        return bool(cli.json("status").get("partialCut"))

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_cut)
            await wait_until(fenced, timeout=30, every=0.1)
            # During the cut: b takes no lifecycle work, another seat answers, a new seat is
            # spawned (b's slow turn holds the cut's drain for six seconds).
            stop_b = cli.run("stop", "b", "--json", check=False)
            assert "is being cut" in refused(stop_b, "seat-fenced")
            answer = cli.json("send", "a", "are you there?", "--wait")
            assert answer["reply"] != "", answer
            spawned = cli.json("spawn", "d", "--agent", "scribe", "--cwd", str(cli.root / "shared"))
            assert cli.json("status")["partialCut"]["seats"] == ["b"]
    [cut] = done
    assert cut.returncode == 0, cut.stderr
    result = json.loads(cut.stdout)
    assert (result["partial"], result["journal"], result["sealed"]) == (True, "ready", True)
    assert [s["name"] for s in result["seats"]] == ["b"]
    assert result["seats"][0]["lifecycleUid"] == seats["b"]["lifecycleUid"]
    # The mesh ran on: the same processes, the new seat, the manager active, b gone from it.
    after = pids(cli)
    assert sorted(after) == ["a", "c", "d"]
    assert {n: after[n] for n in ("a", "c")} == {n: before[n] for n in ("a", "c")}
    assert after["d"] == spawned["pid"]
    assert cli.json("status")["manager"]["state"] == "active"
    assert {r["state"] for r in cli.ps()} == {"running"}

    # In place: the running mesh adopts b back from its own sealed cut.
    restored = cli.json("up", "--restore", result["checkpointDir"])
    assert restored["adopted"] is True and restored["journal"] == "retired", restored
    [seat] = restored["seats"]
    assert (seat["name"], seat["uidAfter"], seat["sessionAfter"]) == (
        "b",
        seats["b"]["lifecycleUid"],
        seats["b"]["sessionId"],
    )
    reply = cli.json("send", "b", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}.", reply
    final = pids(cli)
    assert {n: final[n] for n in ("a", "c", "d")} == {n: after[n] for n in ("a", "c", "d")}
    cli.run("down")


async def test_a_fence_left_by_a_dead_coordinator_is_lifted_by_abort(cli: Cli) -> None:
    mesh_of_three(cli)
    before = pids(cli)
    died = cli.run(
        "down", "--preserve-state", "--seat", "b", "--json", check=False,
        env={"COTAL_FAILPOINT": "cut.after-cut-intent"},
    )  # fmt: skip
    assert died.returncode != 0 and "Traceback" not in died.stderr
    status = cli.json("status")
    assert status["partialCut"]["seats"] == ["b"] and status["manager"]["state"] == "active"
    assert "is being cut" in refused(cli.run("stop", "b", "--json", check=False), "seat-fenced")
    assert cli.json("send", "c", "still here?", "--wait")["reply"] != ""
    aborted = cli.json("down", "--preserve-state", "--abort")
    assert aborted["aborted"] is True, aborted
    assert not (cli.root / ".cotal/maintenance/v1/journal.json").exists()
    reply = cli.json("send", "b", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}.", reply
    assert pids(cli) == before
    cli.run("down")


async def test_a_rerun_finishes_the_cut_a_dead_coordinator_began(cli: Cli) -> None:
    seats = mesh_of_three(cli)
    before = pids(cli)
    died = cli.run(
        "down", "--preserve-state", "--seat", "b", "--json", check=False,
        env={"COTAL_FAILPOINT": "cut.after-cut-intent"},
    )  # fmt: skip
    assert died.returncode != 0
    # The rerun names no seat: the journal says which attempt, the manager which seats.
    done = cli.json("down", "--preserve-state")
    assert (done["partial"], done["journal"]) == (True, "ready"), done
    assert [s["lifecycleUid"] for s in done["seats"]] == [seats["b"]["lifecycleUid"]]
    after = pids(cli)
    assert after == {n: before[n] for n in ("a", "c")}
    # The cut of b again reports the sealed cut, not a new one.
    again = cli.run("down", "--preserve-state", "--seat", "b", "--json")
    doc = json.loads(again.stdout)
    assert (doc["attemptId"], doc["alreadyComplete"]) == (done["attemptId"], True), doc
    # A whole cut now would capture neither a nor c: it refuses, naming the sealed cut, and
    # changes nothing (it never reports success over seats it did not capture).
    whole = cli.run("down", "--preserve-state", "--json", check=False)
    assert done["attemptId"] in refused(whole, "sealed-cut-waiting")
    assert pids(cli) == after
    # A cut of another seat meets the sealed one waiting in this root.
    other = cli.run("down", "--preserve-state", "--seat", "a", "--json", check=False)
    refused(other, "sealed-cut-waiting")
    assert pids(cli) == after
    cli.run("down")


async def test_a_cut_after_a_whole_cut_is_answered_only_for_the_seats_it_sealed(cli: Cli) -> None:
    """Whole, then some: the sealed whole cut answers a cut of seats it holds, and refuses, by
    name and changing nothing, one that names a seat it never captured."""
    seats = mesh_of_three(cli)
    whole = cli.json("down", "--preserve-state")
    assert (whole["journal"], sorted(s["name"] for s in whole["seats"])) == (
        "ready",
        ["a", "b", "c"],
    )
    again = cli.json("down", "--preserve-state", "--seat", "b")
    assert (again["attemptId"], again["alreadyComplete"]) == (whole["attemptId"], True)
    stranger = cli.run("down", "--preserve-state", "--seat", "zed", "--json", check=False)
    message = refused(stranger, "no-such-seat")
    assert f"cut {whole['attemptId']} is sealed here with seat(s) a, b, c; zed" in message
    record = Journal(Layout.at(cli.root)).load()
    assert record is not None
    assert (record.attempt_id, record.state) == (whole["attemptId"], "ready")
    assert seats["b"]["lifecycleUid"] in {s["lifecycleUid"] for s in whole["seats"]}
