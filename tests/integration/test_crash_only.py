"""Crash-only cuts and resumes: every death between two steps is finished or abandoned by a
command, with a named refusal and never a traceback (real daemons, brokers, files)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from manager.checkpoint.reader import verify_integrity
from manager.control.client import ControlClient
from manager.workspace.generation import (
    claim_successor,
    current_generation,
    generation_dir,
    withdraw_claim,
)
from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from protocol.codec import convert, encode_json
from protocol.maintenance import ResumeDescriptor
from tests.conftest import Cli, SharedBroker, cotal_env
from tests.gitrepo import git, init_repo, write
from tests.helpers import pid_alive, trusting, wait_gone, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

UID_A = "a" * 26
UID_B = "c" * 26
INSTANCE = "b" * 26


def up_shared(cli: Cli, b: SharedBroker) -> None:
    cli.run("up", "--detach", "--server", b.url, "--creds", b.creds)


async def client(cli: Cli) -> ControlClient:
    layout = Layout.at(cli.root)
    return await ControlClient.connect(layout.socket, layout.control_token.read_text().strip())


def committed_repo(path: Path) -> Path:
    repo = init_repo(path)
    write(repo / "a.txt", "a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "a")
    return repo


def refused(out: subprocess.CompletedProcess[str], code: str) -> None:
    """Exit 2, the code named on stderr, and no traceback anywhere."""
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert json.loads(out.stderr.strip().splitlines()[-1])["code"] == code, out.stderr
    assert "Traceback" not in out.stderr + out.stdout and "internal error" not in out.stderr


def attempts_dir(cli: Cli) -> Path:
    return cli.root / ".cotal/maintenance/v1/checkpoints"


async def prepare_and_lose_coordinator(cli: Cli, attempt: str, *, journal: bool) -> None:
    """Play a coordinator up to prepare (and, if asked, its `cut-intent`), then die."""
    c = await client(cli)
    async with c:
        plan = await c.call("prepare-preservation", {"attemptId": attempt})
    if journal:
        Journal(Layout.at(cli.root)).advance(
            attempt, "cut-intent", resume=convert(plan["resume"], ResumeDescriptor, what="plan")
        )


# -- a coordinator that died after prepare ---------------------------------------------------------


async def test_rerun_joins_the_attempt_a_dead_coordinator_prepared(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    repo = committed_repo(cli.root / "repo")
    up_shared(cli, shared_broker)
    seat = cli.json("spawn", "kept", "--cwd", str(repo))
    await prepare_and_lose_coordinator(cli, "orphan-1", journal=False)
    status = cli.json("status")["manager"]
    assert (status["state"], status["attemptId"], status["commitStarted"]) == (
        "preserving",
        "orphan-1",
        False,
    )
    refused(cli.run("spawn", "late", "--json", check=False), "fenced")
    out = cli.run("down", "--preserve-state", "--json")
    result = json.loads(out.stdout)
    assert result["attemptId"] == "orphan-1" and result["journal"] == "ready"
    assert "joining cut orphan-1" in out.stderr
    [record] = verify_integrity(Path(result["checkpointDir"]))
    assert record.lifecycle_uid == seat["lifecycleUid"]
    assert not pid_alive(seat["pid"])


async def test_abort_lifts_a_dead_coordinators_fence_and_keeps_every_seat(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    repo = committed_repo(cli.root / "repo")
    up_shared(cli, shared_broker)
    seat = cli.json("spawn", "kept", "--cwd", str(repo))
    nothing = cli.json("down", "--preserve-state", "--abort")
    assert nothing["aborted"] is False
    await prepare_and_lose_coordinator(cli, "orphan-2", journal=True)
    refused(cli.run("down", "--json", check=False), "fenced")
    result = cli.json("down", "--preserve-state", "--abort")
    assert result == {
        "attemptId": "orphan-2",
        "aborted": True,
        "fenceLifted": True,
        "journalDiscarded": True,
        "state": "active",
    }
    assert not (cli.root / ".cotal/maintenance/v1/journal.json").exists()
    assert cli.json("status")["manager"]["state"] == "active"
    [row] = cli.ps()
    assert row["pid"] == seat["pid"] and row["state"] == "running"
    assert cli.json("spawn", "after", "--cwd", str(repo))["state"] == "running"
    # A journaled cut-intent whose fence is already gone (the abort died before the discard)
    # is discarded only because every planned seat still runs here.
    await prepare_and_lose_coordinator(cli, "orphan-3", journal=True)
    c = await client(cli)
    async with c:
        await c.call("abort-preservation", {"attemptId": "orphan-3"})
    again = cli.json("down", "--preserve-state", "--abort")
    assert again["journalDiscarded"] is True and again["fenceLifted"] is False
    cli.run("down")


# -- a failed capture is released, not cached -----------------------------------------------------


async def test_failed_capture_keeps_evidence_and_a_rerun_captures_again(
    cli: Cli, shared_broker: SharedBroker, isolated_home: Path
) -> None:
    repo = committed_repo(cli.root / "repo")
    store = isolated_home / "extra-store"
    store.mkdir()
    write(store / "real.jsonl", "{}\n")
    os.symlink(store / "real.jsonl", store / "link.jsonl")
    up_shared(cli, shared_broker)
    seat = cli.json("spawn", "kept", "--cwd", str(repo))
    out = cli.run("down", "--preserve-state", "--session-store", str(store), "--json", check=False)
    refused(out, "unsafe-store")
    assert "link.jsonl" in out.stderr and "evidence kept at" in out.stderr
    journal = Journal(Layout.at(cli.root)).load()
    assert journal is not None and journal.state == "cut-intent"
    attempt = journal.attempt_id
    [evidence] = [p for p in attempts_dir(cli).iterdir() if p.name.startswith(f"{attempt}.failed-")]
    assert str(evidence) in out.stderr and not (evidence / "manifest.json").exists()
    assert not (attempts_dir(cli) / attempt).exists()
    # The seats were stopped; the operator finishes the cut (or aborts it, which starts them
    # again: tests/integration/test_cut_never_wedges.py).
    status = cli.json("status")["manager"]
    assert status["state"] == "preserving" and status["commitStarted"] is True
    [row] = cli.ps()
    assert row["state"] == "stopped" and row["lifecycleUid"] == seat["lifecycleUid"]
    # The cause fixed, the rerun captures afresh from the stopped seats and seals.
    os.unlink(store / "link.jsonl")
    result = json.loads(
        cli.run("down", "--preserve-state", "--session-store", str(store), "--json").stdout
    )
    assert result["attemptId"] == attempt and result["journal"] == "ready"
    [record] = verify_integrity(Path(result["checkpointDir"]))
    assert record.lifecycle_uid == seat["lifecycleUid"]
    assert any(f.relpath.endswith("real.jsonl") for f in record.session.store)


async def test_capture_of_a_session_prepare_did_not_plan_is_refused_by_name(
    cli: Cli, shared_broker: SharedBroker, tmp_path: Path
) -> None:
    repo = committed_repo(cli.root / "repo")
    up_shared(cli, shared_broker)
    row = cli.json("spawn", "kept", "--cwd", str(repo))
    store = cli.root / f".cotal/sessions/scribe/kept-{row['lifecycleUid']}.store"
    assert any(store.iterdir())
    # The store is empty while prepare plans, so the plan records no session; by the capture
    # it holds one again.
    held = tmp_path / "held"
    os.rename(store, held)
    store.mkdir()
    await prepare_and_lose_coordinator(cli, "unplanned-1", journal=False)
    store.rmdir()
    os.rename(held, store)
    out = cli.run("down", "--preserve-state", "--json", check=False)
    refused(out, "session-unplanned")
    assert "seat kept" in out.stderr and "evidence kept at" in out.stderr
    shutil.rmtree(store)
    result = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert result["attemptId"] == "unplanned-1" and result["journal"] == "ready"
    assert [s["continuity"] for s in result["seats"]] == ["fresh"]


def test_a_full_disk_refuses_by_name_and_a_rerun_after_freeing_it_seals(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    if os.geteuid() != 0:
        pytest.skip("a private mount namespace needs root")
    repo = committed_repo(cli.root / "repo")
    write(repo / "big.bin", os.urandom(4 * 1024 * 1024))
    git(repo, "add", "big.bin")
    git(repo, "commit", "-q", "-m", "big")
    checkpoints = attempts_dir(cli)
    # The checkpoint store is a 2 MiB tmpfs that only this namespace (the manager started in it,
    # and the coordinators run in it) sees; the bundle alone does not fit.
    holder = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'mkdir -p "{checkpoints}" && chmod -R 700 "{cli.root / ".cotal"}" && '
            f'mount -t tmpfs -o size=2m,mode=0700 tmpfs "{checkpoints}" && echo ready && '
            "exec sleep 600",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        ns = ["nsenter", "-t", str(holder.pid), "-m", "--", sys.executable, "-m", "manager.cli"]

        def in_ns(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*ns, *args, "--root", str(cli.root)],
                capture_output=True,
                text=True,
                timeout=300,
                env=cotal_env(),
                cwd=cli.root,
            )

        up = in_ns("up", "--detach", "--server", shared_broker.url, "--creds", shared_broker.creds)
        assert up.returncode == 0, up.stderr
        seat = cli.json("spawn", "big", "--cwd", str(repo))
        out = in_ns("down", "--preserve-state", "--json")
        refused(out, "capture-failed")
        assert "(ENOSPC)" in out.stderr and "no space left on device" in out.stderr
        journal = Journal(Layout.at(cli.root)).load()
        assert journal is not None and journal.state == "cut-intent"
        evidence = f"{checkpoints / journal.attempt_id}.failed-"
        assert f"evidence kept at {evidence}" in out.stderr
        remount = subprocess.run(
            ["nsenter", "-t", str(holder.pid), "-m", "--"]
            + ["mount", "-o", "remount,size=64m", str(checkpoints)],
            capture_output=True,
            text=True,
        )
        assert remount.returncode == 0, remount.stderr
        again = in_ns("down", "--preserve-state", "--json")
        assert again.returncode == 0, again.stderr
        result = json.loads(again.stdout)
        assert result["attemptId"] == journal.attempt_id and result["journal"] == "ready"
        check = subprocess.run(
            [
                *ns[:-2],
                "-c",
                "import sys; from manager.checkpoint.reader import verify_integrity; "
                "print(len(verify_integrity(__import__('pathlib').Path(sys.argv[1]))))",
                result["checkpointDir"],
            ],
            capture_output=True,
            text=True,
            env=cotal_env(),
        )
        assert check.stdout.strip() == "1", check.stderr
        assert not pid_alive(seat["pid"])
    finally:
        holder.kill()
        holder.wait()


# -- a rerun while the commit is in flight, a daemon that died mid-commit -------------------------


def _cut_argv(cli: Cli) -> list[str]:
    return [
        sys.executable,
        "-m",
        "manager.cli",
        "down",
        "--preserve-state",
        "--root",
        str(cli.root),
    ]


async def test_rerun_while_the_commit_runs_joins_it(cli: Cli, shared_broker: SharedBroker) -> None:
    repo = committed_repo(cli.root / "big")
    write(repo / "big.bin", os.urandom(120 * 1024 * 1024))
    up_shared(cli, shared_broker)
    cli.json("spawn", "big", "--cwd", str(repo))
    log = cli.root / ".cotal/logs/manager.log"
    async with await anyio.open_process(
        _cut_argv(cli), env=cotal_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    ) as first:
        await wait_until(lambda: '"event": "cut.stopped"' in log.read_text(), timeout=60)
        first.kill()
        await first.wait()
    # The commit the dead coordinator began still runs (or has sealed): no abort now.
    abort = cli.run("down", "--preserve-state", "--abort", "--json", check=False)
    refused(abort, "commit-begun")
    assert "can no longer be aborted" in abort.stderr or "while it runs" in abort.stderr
    out = cli.run("down", "--preserve-state", "--json", timeout=300)
    result = json.loads(out.stdout)
    assert result["journal"] == "ready"
    verify_integrity(Path(result["checkpointDir"]))
    # One commit ran: nothing was stopped twice and no directory was moved aside.
    assert log.read_text().count('"event": "cut.stopped"') == 1
    assert [p.name for p in attempts_dir(cli).iterdir()] == [result["attemptId"]]


async def test_coordinator_whose_daemon_dies_mid_commit_refuses_by_name(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    repo = committed_repo(cli.root / "big")
    write(repo / "big.bin", os.urandom(120 * 1024 * 1024))
    up_shared(cli, shared_broker)
    seat = cli.json("spawn", "big", "--cwd", str(repo))
    daemon = cli.json("status")["pid"]
    log = cli.root / ".cotal/logs/manager.log"
    async with await anyio.open_process(
        [*_cut_argv(cli), "--json"], env=cotal_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as first:
        await wait_until(lambda: '"event": "cut.stopped"' in log.read_text(), timeout=60)
        os.kill(daemon, signal.SIGKILL)
        with anyio.fail_after(60):
            await first.wait()
        assert first.stderr is not None
        err = (await first.stderr.receive()).decode()
    assert first.returncode == 2, err
    assert json.loads(err.strip().splitlines()[-1])["code"] == "daemon-lost", err
    assert "Traceback" not in err
    await wait_gone([daemon, seat["pid"]])
    result = json.loads(cli.run("down", "--preserve-state", "--json", timeout=300).stdout)
    assert result["journal"] == "ready" and result["offline"] is True


# -- checkpoint verify on a file ------------------------------------------------------------------


def test_verify_of_a_regular_file_is_refused_by_name(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "manifest.json"
    f.write_text("{}")
    refused(cli.run("checkpoint", "verify", str(f), "--json", check=False), "not-a-checkpoint")


# -- writer generation per lifecycle -------------------------------------------------------------


def test_generation_is_per_lifecycle_and_reads_legacy_claims(tmp_path: Path) -> None:
    layout = Layout.at(tmp_path)
    assert claim_successor(layout, "main", "w", UID_A, 0, INSTANCE, "resume-1") == 1
    # A new incarnation under the same name starts its custody from nothing.
    assert current_generation(layout, "main", "w", UID_B) == 0
    assert claim_successor(layout, "main", "w", UID_B, 0, INSTANCE, "resume-2") == 1
    assert sorted(os.listdir(generation_dir(layout, "main", "w", UID_A))) == ["1"]
    assert withdraw_claim(layout, "main", "w", UID_B, 1, INSTANCE, "resume-2")
    assert current_generation(layout, "main", "w", UID_A) == 1
    # A root written before the key was the uid: its name-keyed claim belongs to the uid it
    # records, and only to it.
    legacy = layout.seat_generation_dir("main", "v")
    legacy.mkdir(parents=True, mode=0o700)
    record = {
        "seat": "v",
        "lifecycleUid": UID_A,
        "generation": 3,
        "holder": INSTANCE,
        "attemptId": "old",
        "claimedAt": "2025-01-01T00:00:00Z",
    }
    (legacy / "3").write_bytes(encode_json(record))
    os.chmod(legacy / "3", 0o600)
    assert current_generation(layout, "main", "v", UID_A) == 3
    assert current_generation(layout, "main", "v", UID_B) == 0
    with pytest.raises(Exception, match="already records generation 3"):
        claim_successor(layout, "main", "v", UID_A, 0, INSTANCE, "resume-3")
    assert claim_successor(layout, "main", "v", UID_A, 3, INSTANCE, "resume-3") == 4
    assert current_generation(layout, "main", "v", UID_A) == 4


async def test_a_name_reused_after_a_resume_cuts_and_is_claimed(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    repo = committed_repo(cli.root / "repo")
    b = ["--server", shared_broker.url, "--creds", shared_broker.creds]
    up_shared(cli, shared_broker)
    first = cli.json("spawn", "default", "--cwd", str(repo))
    cut1 = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    cli.run("up", "--restore", cut1["checkpointDir"], *b)
    cli.run("rm", "default")
    second = cli.json("spawn", "default", "--cwd", str(repo))
    assert second["lifecycleUid"] != first["lifecycleUid"]
    cut2 = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert cut2["journal"] == "ready"
    resumed = json.loads(cli.run("up", "--restore", cut2["checkpointDir"], *b, "--json").stdout)
    [seat] = resumed["seats"]
    assert seat["uidAfter"] == second["lifecycleUid"]
    layout = Layout.at(cli.root)
    assert current_generation(layout, "main", "default", first["lifecycleUid"]) == 1
    assert current_generation(layout, "main", "default", second["lifecycleUid"]) == 1
    cli.run("down")


# -- a resume whose coordinator died after resume-preserved -------------------------------------


async def test_restore_rerun_after_its_coordinator_died_finishes_the_resume(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    repo = committed_repo(cli.root / "repo")
    b = ["--server", shared_broker.url, "--creds", shared_broker.creds]
    up_shared(cli, shared_broker)
    row = cli.json("spawn", "default", "--cwd", str(repo), "--prompt", "remember the phrase r-7")
    cut1 = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    layout = Layout.at(cli.root)
    resume_doc = layout.maintenance / "resume.json"
    good = resume_doc.read_bytes()
    argv = [
        sys.executable,
        "-m",
        "manager.cli",
        "up",
        "--restore",
        cut1["checkpointDir"],
        *b,
        "--root",
        str(cli.root),
    ]

    def journal_state() -> str | None:
        try:
            record = Journal(layout).load()
        except Exception:
            return None
        return record.state if record is not None else None

    async with await anyio.open_process(
        argv, env=cotal_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    ) as coordinator:
        # Between resume-intent and resume-active the coordinator claims, restores, starts the
        # manager and runs resume-preserved; a resume document damaged now stops it exactly at
        # its next journal step, after resume-preserved, with the manager left running.
        await wait_until(lambda: journal_state() == "resume-intent", timeout=60)
        damaged = bytearray(good)
        damaged[-2:-1] = b" " if damaged[-2:-1] != b" " else b"\t"
        resume_doc.write_bytes(bytes(damaged))
        with anyio.fail_after(120):
            assert await coordinator.wait() == 2
    resume_doc.write_bytes(good)
    status = cli.json("status")["manager"]
    assert status["state"] == "resuming" and status["activated"] is True
    out = cli.run("up", "--restore", cut1["checkpointDir"], *b, "--json")
    result = json.loads(out.stdout)
    assert result["continued"] is True and result["journal"] == "retired"
    [seat] = result["seats"]
    assert seat["uidAfter"] == row["lifecycleUid"]
    assert cli.json("status")["manager"]["state"] == "active"
    assert cli.json("send", "default", "what was the phrase?", "--wait")["reply"] == (
        "The phrase is r-7."
    )
    cli.run("down")


# -- cotal down with the broker dead --------------------------------------------------------------


async def test_down_with_the_broker_dead_says_the_durable_was_not_deleted(cli: Cli) -> None:
    # The whole election budget (25 s a call, several calls a seat) would outlast the timeout
    # below: a broker that does not answer a ping is not waited for.
    repo = committed_repo(cli.root / "repo")
    cli.run("up", "--detach")
    seat = cli.json("spawn", "kept", "--cwd", str(repo))
    broker = json.loads((cli.root / ".cotal/mesh.json").read_text())["embeddedBroker"]["pid"]
    os.kill(broker, signal.SIGKILL)
    await wait_gone([broker])
    out = cli.run("down", timeout=45)
    assert (
        "durable NOT deleted (the broker did not answer the manager within 2s, so nothing at the "
        "broker was deleted)"
    ) in out.stdout, out.stdout
    assert "once the broker is back, run cotal up and then cotal down again" in out.stdout
    assert "durable deleted" not in out.stdout
    # The record outlives the manager, so the next one takes the seat back and deletes it.
    assert (cli.root / f".cotal/seats/kept-{seat['lifecycleUid']}.json").exists()


# -- checkpoint verify with the root's broker dead ----------------------------------------------


async def test_verify_with_the_meshs_broker_dead_refuses_promptly_by_name(
    cli: Cli, tmp_path: Path
) -> None:
    committed_repo(cli.root / "repo")
    cli.run("up", "--detach")
    cli.json("spawn", "w", "--cwd", str(cli.root / "repo"))
    checkpoint = json.loads(cli.run("down", "--preserve-state", "--json").stdout)["checkpointDir"]
    dest = Cli(tmp_path / "dest")
    dest.root.mkdir()
    dest.run("up", "--detach")
    try:
        broker = json.loads((dest.root / ".cotal/mesh.json").read_text())["embeddedBroker"]["pid"]
        os.kill(broker, signal.SIGKILL)
        await wait_gone([broker])
        # It once waited for the broker forever: nats-py retries a first connect without end
        # when reconnects are unlimited. The bound is the connection's own deadline.
        with anyio.fail_after(60):
            out = await anyio.to_thread.run_sync(
                lambda: dest.run(
                    "checkpoint",
                    "verify",
                    checkpoint,
                    *trusting(Path(checkpoint)),
                    "--json",
                    check=False,
                )
            )
        refused(out, "broker-unreachable")
        assert "within 15s" in out.stderr
    finally:
        dest.run("down", check=False, timeout=180)
