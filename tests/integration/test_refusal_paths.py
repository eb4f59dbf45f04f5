"""Each refusal path the issue named as untested, forced through real parts and named by code.

A real daemon, a real broker, real harness processes: scribe where scribe can be made to get
there, and where only a harness that misbehaves can, a tiny stand-in for pi's RPC mode written
into the test's own directory (`_fake_pi`), launched by the real pi connector because
`cotal.toml` points `agents.pi.binary` at it. Every test asserts the refusal's code, the words
that name what was wrong, and that nothing changed that should not have.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from manager.control.client import ControlClient, ControlError
from manager.procs import processes_with_env
from protocol import names
from tests.conftest import REPO, Cli, cotal_env
from tests.gitrepo import git, init_repo
from tests.helpers import (
    carry_to_new_host,
    pid_alive,
    processes_mentioning,
    trusting,
    wait_gone,
    wait_until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

# pi's RPC mode as far as readiness needs it: it answers `get_state` with the session it opened
# (the header id of the file `--session` names); with `FAKEPI_MODE=misreport` it answers with
# another session id.
FAKE_PI = """
import json, os, sys, uuid

mode = os.environ.get("FAKEPI_MODE", "")
argv = sys.argv[1:]
session_file = argv[argv.index("--session") + 1]
with open(session_file) as f:
    session = json.loads(f.readline())["id"]
if mode == "misreport":
    session = str(uuid.uuid4())
for line in sys.stdin:
    request = json.loads(line)
    if request.get("type") == "get_state":
        data = {"sessionId": session, "sessionFile": session_file}
        reply = {"type": "response", "id": request["id"], "command": "get_state",
                 "success": True, "data": data}
        sys.stdout.write(json.dumps(reply) + "\\n")
        sys.stdout.flush()
"""


def _fake_pi(tmp_path: Path) -> Path:
    binary = tmp_path / "bin" / "fakepi"
    binary.parent.mkdir(exist_ok=True)
    binary.write_text(f"#!{sys.executable}\n{FAKE_PI}")
    binary.chmod(0o755)
    return binary


def _pi_config(tmp_path: Path) -> str:
    # The base URL is never dialled: the stand-in makes no model call.
    return (
        "[agents.pi]\n"
        f'binary = "{_fake_pi(tmp_path)}"\n'
        'base_url = "http://127.0.0.1:9/v1"\n'
        'model = "fake-model"\n'
        'extra_env = ["FAKEPI_MODE"]\n'
    )


def _committed(root: Path, files: dict[str, str] | None = None) -> None:
    """A git work tree with one commit (a cut needs one), `files` tracked in it."""
    init_repo(root)
    for name, text in (files or {}).items():
        (root / name).write_text(text)
        git(root, "add", name)
    git(root, "commit", "-q", "--allow-empty", "-m", "one")


def _refusal(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one JSON refusal a `--json` command printed on stderr, after its exit code 2."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if x.startswith('{"code"')]
    found: dict[str, Any] = json.loads(line)
    assert found["ok"] is False
    return found


def _journal(root: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        (root / ".cotal" / "maintenance" / "v1" / "journal.json").read_text()
    )
    return found


async def _control(root: Path) -> ControlClient:
    token = (root / ".cotal" / "auth" / "control.token").read_text().strip()
    return await ControlClient.connect(root / ".cotal" / "manager.sock", token)


def _cut(cli: Cli) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert result["journal"] == "ready" and result["failures"] == [], result
    return result


def _reported(error: str, expected: str) -> str:
    """The session a `session-mismatch` says the harness reported, the rest of it exact."""
    found = re.fullmatch(
        r"replacement reported session ([0-9a-f-]{36}), expected (\S+); the harness did not "
        r"reopen the recorded session; inspect its store",
        error,
    )
    assert found is not None, error
    assert found.group(2) == expected
    return found.group(1)


# -- 1. gate 1's re-stat: tests/unit/test_refusal_paths_unit.py (a file changed mid-read) -------


# -- 2. a session mismatch ------------------------------------------------------------------------


def test_a_spawn_whose_harness_reports_another_session_is_refused(tmp_path: Path, cli: Cli) -> None:
    (cli.root / "cotal.toml").write_text(_pi_config(tmp_path))
    cli.run("up", "--detach", env={"FAKEPI_MODE": "misreport"})
    refused = _refusal(cli.run("spawn", "p1", "--agent", "pi", "--json", check=False))
    assert refused["code"] == "session-mismatch"
    # The connector seeded the session it expected; the harness named another.
    [seeded] = (cli.root / ".cotal" / "sessions" / "pi").glob("p1-*.store/*.jsonl")
    expected = json.loads(seeded.read_text().splitlines()[0])["id"]
    reported = _reported(refused["error"], expected)
    assert reported != expected
    # Nothing was admitted: no seat is left in the table.
    assert cli.ps() == []


def test_a_resume_whose_harness_reports_another_session_is_refused(
    tmp_path: Path, cli: Cli
) -> None:
    config = _pi_config(tmp_path)
    _committed(cli.root, {"cotal.toml": config})
    cli.run("up", "--detach")
    row = cli.json("spawn", "p1", "--agent", "pi")
    recorded = row["sessionId"]
    cut = _cut(cli)
    [seat] = cut["seats"]
    assert (seat["name"], seat["continuity"], seat["sessionId"]) == ("p1", "exact", recorded)
    copy = carry_to_new_host(cli.root, Path(cut["checkpointDir"]), tmp_path, trust=False)
    # The destination binds pi as the source did (the launch profile must match).
    (cli.root / "cotal.toml").write_text(config)

    out = cli.run(
        "up",
        "--restore",
        str(copy),
        *trusting(copy),
        "--json",
        check=False,
        env={"FAKEPI_MODE": "misreport"},
    )
    refused = _refusal(out)
    assert refused["code"] == "session-mismatch"
    assert _reported(refused["error"], recorded) != recorded
    # The attempt stays where it was: journaled as begun, the manager fenced to it with no
    # seat adopted, and no process of the seat's lifecycle left running.
    journal = _journal(cli.root)
    assert (journal["attemptId"], journal["state"]) == (cut["attemptId"], "resume-intent")
    status = cli.json("status")
    assert status["manager"]["state"] == "resuming" and status["manager"]["seats"] == 0
    assert processes_with_env("COTAL_LIFECYCLE_UID", row["lifecycleUid"]) == []


# -- 3. a deliberate quit -------------------------------------------------------------------------


def test_a_harness_that_exits_0_before_it_is_ready_fails_the_spawn(
    tmp_path: Path, cli: Cli
) -> None:
    # A jcode binary that quits at once, cleanly, before it says a word: the generic JSON-lines
    # driver sees its output end and the daemon names how it ended.
    binary = tmp_path / "bin" / "jcode-quits"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    (cli.root / "cotal.toml").write_text(f'[agents.jcode]\nbinary = "{binary}"\n')
    cli.run("up", "--detach")
    refused = _refusal(cli.run("spawn", "j1", "--agent", "jcode", "--json", check=False))
    assert refused["code"] == "seat-failed"
    assert refused["error"].startswith("seat j1 exited before it was ready (code 0); read ")
    assert refused["error"].endswith(".log")
    assert cli.ps() == []


async def test_a_harness_silent_past_the_roots_readiness_window_is_refused_and_reaped(
    tmp_path: Path, cli: Cli
) -> None:
    # A jcode binary that never says a word: the root gives it one second (`[launch]`), the
    # spawn refuses by that window and names the log, and no process of it is left.
    binary = tmp_path / "bin" / "jcode-silent"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexec sleep 613.25\n")
    binary.chmod(0o755)
    (cli.root / "cotal.toml").write_text(
        f'[launch]\nready_timeout_s = 1\n[agents.jcode]\nbinary = "{binary}"\n'
    )
    cli.run("up", "--detach")
    refused = _refusal(cli.run("spawn", "j1", "--agent", "jcode", "--json", check=False))
    assert refused["code"] == "seat-not-ready"
    [log] = (cli.root / ".cotal" / "logs").glob("seat-j1-*.log")
    assert refused["error"] == (
        f"seat j1 was not ready within 1s; read {log}, or on a busy host raise `[launch] "
        "ready_timeout_s` in cotal.toml"
    )
    assert cli.ps() == []
    await wait_until(lambda: processes_mentioning("sleep\0" + "613.25") == [])


def test_a_readiness_window_out_of_bounds_is_bad_config(cli: Cli) -> None:
    (cli.root / "cotal.toml").write_text("[launch]\nready_timeout_s = 121\n")
    refused = _refusal(cli.run("up", "--detach", "--json", check=False))
    assert refused["code"] == "bad-config"
    assert "Expected `float` <= 120.0 - at `$.launch.ready_timeout_s`" in refused["error"]
    assert not (cli.root / ".cotal" / "manager.sock").exists()


def test_a_seat_whose_harness_quit_its_session_is_not_started_again(cli: Cli) -> None:
    cli.run("up", "--detach")
    row = cli.json("spawn", "s1")
    sessions = cli.root / ".cotal" / "sessions" / "scribe"
    pointer = sessions / f"s1-{row['lifecycleUid']}.json"
    store = sessions / f"s1-{row['lifecycleUid']}.store"
    assert json.loads(pointer.read_text())["status"] == "running"
    assert cli.json("stop", "s1")["state"] == "stopped"
    # The harness itself quits its session, as its driver's quit makes it: it says so in the
    # pointer and exits 0.
    quit_ = subprocess.run(
        [sys.executable, "-m", "connectors.scribe", "--store", str(store)]
        + ["--session-id", row["sessionId"], "--pointer", str(pointer)],
        input=b'{"type": "quit"}\n',
        capture_output=True,
        timeout=30,
        env=cotal_env(),
        cwd=REPO,
    )
    assert quit_.returncode == 0, quit_.stderr
    assert json.loads(pointer.read_text())["status"] == "quit"

    refused = _refusal(cli.run("start", "s1", "--json", check=False))
    assert refused["code"] == "deliberate-quit"
    assert refused["error"] == (
        "s1's harness quit its session deliberately; there is no session to reopen; "
        "`cotal rm s1`, then spawn it again"
    )
    [seat] = cli.ps()
    assert (seat["name"], seat["state"], seat["pid"]) == ("s1", "stopped", None)


# -- 4. a failed lifecycle proof ------------------------------------------------------------------


async def test_a_stop_with_a_survivor_of_the_lifecycle_is_unproven(cli: Cli) -> None:
    cli.run("up", "--detach")
    row = cli.json("spawn", "s1")
    # A process that carries the seat's lifecycle mark but left its process group: the stop
    # kills the group, reaps the harness, and must still refuse to call the seat stopped.
    # Popen returns at once; the child must outlive this call, so no async process API.
    survivor = subprocess.Popen(  # noqa: ASYNC220
        ["sleep", "60"], env={**os.environ, "COTAL_LIFECYCLE_UID": row["lifecycleUid"]}
    )
    try:
        refused = _refusal(cli.run("stop", "s1", "--json", check=False))
        assert refused["code"] == "stop-unproven"
        assert refused["error"] == (
            f"seat s1 (pid {row['pid']}) exited but processes of its lifecycle are still "
            f"alive: [{survivor.pid}]; kill {survivor.pid}, then retry"
        )
        assert not pid_alive(row["pid"]) and pid_alive(survivor.pid)
        # The seat task's own reap of the harness, whenever it lands, is no proof while the
        # survivor lives: the seat stays unproven and cannot be started beside it.
        log = cli.root / ".cotal" / "logs" / "manager.log"
        exited = f'"event": "seat.exited", "level": "info", "pid": {row["pid"]}'
        await wait_until(lambda: exited in log.read_text(), timeout=20)
        [after] = cli.ps()
        assert after["state"] == "unproven", after
        start = _refusal(cli.run("start", "s1", "--json", check=False))
        assert start["code"] == "not-stopped", start
        assert pid_alive(survivor.pid) and [r["state"] for r in cli.ps()] == ["unproven"]
        # The cure the refusal names: kill it, then stop again, which proves the seat stopped.
        survivor.kill()
        survivor.wait(timeout=10)
        assert cli.json("stop", "s1")["state"] == "stopped"
    finally:
        if survivor.poll() is None:
            survivor.kill()
            survivor.wait(timeout=10)


# -- 5. a fork-class resume: tests/e2e/test_fork_resume.py (the built-in `scribe-fork`) ----------


# -- 6. finalize-resume with a wrong token --------------------------------------------------------


async def test_finalize_with_a_wrong_token_is_refused_and_changes_nothing(
    tmp_path: Path, cli: Cli
) -> None:
    _committed(cli.root)
    cli.run("up", "--detach")
    row = cli.json("spawn", "s1")
    cut = _cut(cli)
    copy = carry_to_new_host(cli.root, Path(cut["checkpointDir"]), tmp_path, trust=False)
    # The coordinator dies right after it journaled the commit token, before finalize: the
    # manager waits in awaiting-finalize for the one token that releases it.
    died = cli.run(
        "up",
        "--restore",
        str(copy),
        *trusting(copy),
        check=False,
        env={"COTAL_FAILPOINT": "resume.after-resume-committed"},
    )
    assert died.returncode == -signal.SIGKILL, died.stderr
    attempt = cut["attemptId"]
    before = _journal(cli.root)
    assert (before["attemptId"], before["state"]) == (attempt, "resume-committed")
    token = before["durableCommitToken"]
    wrong = ("0" if token[0] != "0" else "1") + token[1:]

    client = await _control(cli.root)
    async with client:
        status = await client.call("status")
        assert status["state"] == "awaiting-finalize"
        for bad in (wrong, "0" * 64):
            with pytest.raises(ControlError) as caught:
                await client.call(
                    "finalize-resume", {"attemptId": attempt, "durableCommitToken": bad}
                )
            assert caught.value.code == "bad-token"
            assert caught.value.message == (
                f"finalize-resume for {attempt}: the durable commit token does not match; "
                "pass the token commit-resume returned (the journal records it)"
            )
        # Nothing moved: still fenced to the attempt, the seat still running, journal as it was.
        after = await client.call("status")
        assert after["state"] == "awaiting-finalize" and after["attemptId"] == attempt
        assert after["seatStates"] == {"running": 1}
        assert _journal(cli.root) == before
        # The journaled token still releases it.
        final = await client.call(
            "finalize-resume", {"attemptId": attempt, "durableCommitToken": token}
        )
        assert final == {"attemptId": attempt, "state": "active"}
    [seat] = cli.ps()
    assert (seat["name"], seat["lifecycleUid"], seat["state"]) == (
        "s1",
        row["lifecycleUid"],
        "running",
    )


# -- 7. spawn capacity ----------------------------------------------------------------------------


async def test_the_spawn_past_capacity_is_refused_and_the_seats_keep_running(cli: Cli) -> None:
    cli.run("up", "--detach")
    cap = names.MAX_SEATS
    assert cap == 50
    spawned: dict[str, int] = {}

    async def spawn_some(which: range) -> None:
        # One connection each: the daemon answers one request at a time per connection.
        client = await _control(cli.root)
        async with client:
            for i in which:
                row = await client.call("spawn", {"name": f"s{i}"}, timeout=120)
                spawned[row["name"]] = row["pid"]

    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:
            for k in range(4):
                tg.start_soon(spawn_some, range(k, cap, 4))
    assert len(spawned) == cap

    refused = _refusal(cli.run("spawn", "extra", "--json", check=False))
    assert refused["code"] == "capacity"
    assert refused["error"] == (
        f"this manager already runs {cap} seats; "
        "remove a seat first (`cotal rm NAME`; a stopped seat still counts)"
    )
    rows = cli.ps()
    assert len(rows) == cap and "extra" not in {r["name"] for r in rows}
    assert {r["name"]: r["pid"] for r in rows} == spawned
    assert {r["state"] for r in rows} == {"running"}
    assert all(pid_alive(pid) for pid in spawned.values())
    # A stopped seat still counts.
    assert cli.json("stop", "s0")["state"] == "stopped"
    assert _refusal(cli.run("spawn", "extra", "--json", check=False))["code"] == "capacity"
    cli.run("down")
    await wait_gone(list(spawned.values()), timeout=60)


def test_a_cut_with_a_survivor_of_a_seat_seals_nothing(cli: Cli) -> None:
    _committed(cli.root)
    cli.run("up", "--detach")
    row = cli.json("spawn", "s1")
    survivor = subprocess.Popen(
        ["sleep", "60"], env={**os.environ, "COTAL_LIFECYCLE_UID": row["lifecycleUid"]}
    )
    try:
        refused = _refusal(cli.run("down", "--preserve-state", "--json", check=False))
        assert refused["code"] == "stop-unproven"
        journal = _journal(cli.root)
        attempt = journal["attemptId"]
        assert refused["error"].startswith(
            f"cut {attempt} is incomplete: s1: seat s1 (pid {row['pid']}) exited but processes "
            f"of its lifecycle are still alive: [{survivor.pid}]; kill {survivor.pid}, then retry; "
        )
        # Nothing sealed: the attempt's directory is evidence, named, with no manifest.
        checkpoints = cli.root / ".cotal" / "maintenance" / "v1" / "checkpoints"
        [evidence] = checkpoints.iterdir()
        assert evidence.name.startswith(f"{attempt}.failed-")
        assert not (evidence / "manifest.json").exists()
        assert refused["error"].endswith(f"evidence kept at {evidence}")
        assert journal["state"] == "cut-intent"
        assert pid_alive(survivor.pid)
    finally:
        if survivor.poll() is None:
            survivor.kill()
            survivor.wait(timeout=10)
