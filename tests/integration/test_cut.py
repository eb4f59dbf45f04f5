"""The preservation cut: fence, drain, persist, stop-prove, capture, seal (real everything)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import anyio
import pytest

from manager.checkpoint.reader import (
    read_manifest,
    read_seat_checkpoint,
    verify_integrity,
    verify_seat_files,
)
from manager.control.client import ControlClient
from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from protocol.errors import Refusal
from tests.conftest import Cli, SharedBroker, cotal_env
from tests.gitrepo import AUTH_TOKEN, DOTENV_TOKEN, git, init_repo, make_rich_repo, write
from tests.helpers import broker_at, pid_alive, wait_gone, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]


def up_shared(cli: Cli, b: SharedBroker) -> None:
    cli.run("up", "--detach", "--server", b.url, "--creds", b.creds)


async def client(cli: Cli) -> ControlClient:
    layout = Layout.at(cli.root)
    return await ControlClient.connect(layout.socket, layout.control_token.read_text().strip())


async def consumer_state(b: SharedBroker, name: str, uid: str) -> tuple[int, int, int]:
    async with broker_at(b.url, b.creds) as js:
        info = await js.consumer_info("DM_main", f"dm_local-{name}-{uid}")
    return info.delivered.stream_seq, info.ack_floor.stream_seq, info.num_pending


def porcelain(repo: Path) -> bytes:
    return git(
        repo,
        "status",
        "--porcelain=v1",
        "-z",
        "--untracked-files=all",
        "--no-renames",
        "--",
        ".",
        ":(exclude).cotal",
    )


def all_bytes(directory: Path) -> bytes:
    out = b""
    for dirpath, _, files in os.walk(directory):
        for f in files:
            out += (Path(dirpath) / f).read_bytes()
    return out


async def test_cut_of_three_seats_seals_every_change_and_keeps_durables(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    repos = [make_rich_repo(cli.root / f"repo{i}") for i in range(3)]
    up_shared(cli, shared_broker)
    rows = [
        cli.json("spawn", f"s{i}", "--cwd", str(repos[i]), "--prompt", f"Remember the phrase p{i}")
        for i in range(3)
    ]
    for i in range(3):
        assert (
            cli.json("send", f"s{i}", "what was the phrase?", "--wait")["reply"]
            == f"The phrase is p{i}."
        )
    before = {
        r["name"]: await consumer_state(shared_broker, r["name"], r["lifecycleUid"]) for r in rows
    }
    status_before = {i: porcelain(repos[i]) for i in range(3)}
    out = cli.run("down", "--preserve-state", "--json")
    result = json.loads(out.stdout)
    attempt_dir = Path(result["checkpointDir"])
    assert result["journal"] == "ready" and result["failures"] == []
    assert sorted(s["name"] for s in result["seats"]) == ["s0", "s1", "s2"]
    assert all(s["continuity"] == "exact" for s in result["seats"])
    await wait_gone([r["pid"] for r in rows])

    seats = verify_integrity(attempt_dir)
    by_name = {s.name: s for s in seats}
    for i, row in enumerate(rows):
        record = by_name[f"s{i}"]
        assert record.lifecycle_uid == row["lifecycleUid"]
        assert record.session.session_id == row["sessionId"]
        assert record.session.continuity == "exact"
        assert record.repository.status.encode() == status_before[i]
        assert record.repository.intent_to_add == ["ita.txt", "ita_gone.txt"]
        assert record.repository.refs is not None
    manifest = read_manifest(attempt_dir)
    assert [s.name for s in manifest.seats] == ["s0", "s1", "s2"]
    journal = Journal(Layout.at(cli.root)).load()
    assert (
        journal is not None
        and journal.state == "ready"
        and journal.checkpoint_dir == str(attempt_dir)
    )
    # Cleanup was suppressed: every durable is still at the broker with its frontier unchanged.
    for r in rows:
        assert (
            await consumer_state(shared_broker, r["name"], r["lifecycleUid"]) == before[r["name"]]
        )
    # The source trees were only read.
    for i in range(3):
        assert porcelain(repos[i]) == status_before[i]
    # No secret in any checkpoint byte.
    blob = all_bytes(attempt_dir)
    for secret in (
        AUTH_TOKEN,
        DOTENV_TOKEN,
        (cli.root / ".cotal/auth/control.token").read_bytes().strip(),
        Path(shared_broker.creds).read_bytes().strip(),
    ):
        assert secret not in blob
    # Running the cut again reports the sealed attempt and changes nothing.
    again = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert again["alreadyComplete"] is True and again["checkpointDir"] == str(attempt_dir)


async def test_sigterm_ignoring_seat_is_still_proven_stopped(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    init_repo(cli.root)
    write(cli.root / "f.txt", "x\n")
    git(cli.root, "add", "f.txt")
    git(cli.root, "commit", "-q", "-m", "one")
    (cli.root / "cotal.toml").write_text("[agents.scribe]\nignore_sigterm = true\n")
    git(cli.root, "add", "cotal.toml")
    git(cli.root, "commit", "-q", "-m", "config")
    up_shared(cli, shared_broker)
    stubborn = cli.json("spawn", "stubborn")
    os.kill(stubborn["pid"], signal.SIGTERM)
    await anyio.sleep(0.3)
    assert pid_alive(stubborn["pid"])  # it really ignores SIGTERM
    # A graceful stop escalates to SIGKILL after the grace period and proves the exit.
    stopped = cli.json("rm", "stubborn")
    assert stopped["exitCode"] == -9
    assert not pid_alive(stubborn["pid"])
    # The cut hard-stops and proves it, too.
    second = cli.json("spawn", "stubborn2")
    result = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert [s["name"] for s in result["seats"]] == ["stubborn2"]
    assert not pid_alive(second["pid"])


async def test_spawn_racing_the_fence_is_refused_and_abort_returns_to_active(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    init_repo(cli.root)
    write(cli.root / "f.txt", "x\n")
    git(cli.root, "add", "f.txt")
    git(cli.root, "commit", "-q", "-m", "one")
    up_shared(cli, shared_broker)
    keeper = cli.json("spawn", "keeper")
    c = await client(cli)
    async with c:
        # Race a spawn against the fence: either the spawn got in first and is in the plan, or
        # it was refused by the fence. Nothing else is allowed.
        spawn_result: dict[str, Any] = {}

        async def racing_spawn() -> None:
            c2 = await client(cli)
            async with c2:
                try:
                    spawn_result["row"] = await c2.call("spawn", {"name": "racer"})
                except Refusal as exc:
                    spawn_result["refusal"] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(racing_spawn)
            plan = await c.call("prepare-preservation", {"attemptId": "race-1"})
        planned = sorted(a["name"] for a in plan["inventory"]["agents"])
        # The prepare's steps are typed records the coordinator can poll, in order.
        progress = await c.call("progress", {"attemptId": "race-1"})
        assert [r["phase"] for r in progress["records"]] == ["fenced", "drained", "planned"]
        assert [r["seq"] for r in progress["records"]] == [1, 2, 3] and not progress["done"]
        later = await c.call("progress", {"attemptId": "race-1", "after": 2})
        assert [r["phase"] for r in later["records"]] == ["planned"]
        with pytest.raises(Refusal) as err:
            await c.call("progress", {"attemptId": "race-2"})
        assert err.value.code == "not-this-attempt" and "race-2" in err.value.message
        if "refusal" in spawn_result:
            assert spawn_result["refusal"].code == "fenced"
            assert (
                "spawn refused" in spawn_result["refusal"].message
                and "preserving" in spawn_result["refusal"].message
            )
            assert planned == ["keeper"]
        else:
            assert planned == ["keeper", "racer"]
        # While fenced, every new lifecycle operation is refused by name.
        with pytest.raises(Refusal) as err:
            await c.call("spawn", {"name": "late"})
        assert err.value.code == "fenced" and "preserving" in err.value.message
        with pytest.raises(Refusal) as err:
            await c.call("stop-seat", {"name": "keeper"})
        assert err.value.code == "fenced"
        # Abort before commit: back to active, seats untouched.
        assert await c.call("abort-preservation", {"attemptId": "race-1"}) == {
            "attemptId": "race-1",
            "state": "active",
        }
        assert (await c.call("status"))["state"] == "active"
        [row] = [r for r in await c.call("ps") if r["name"] == "keeper"]
        assert row["pid"] == keeper["pid"] and row["state"] == "running"
    assert (
        cli.json("send", "keeper", "remember the phrase still-here", "--wait")["reply"]
        == "Noted: still-here."
    )
    assert cli.json("spawn", "after")["state"] == "running"


async def test_prepare_refuses_mid_merge_and_non_repository_without_stopping(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    repo = init_repo(cli.root / "repo")
    write(repo / "a.txt", "base\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "checkout", "-q", "-b", "other")
    write(repo / "a.txt", "other\n")
    git(repo, "commit", "-q", "-am", "other")
    git(repo, "checkout", "-q", "main")
    write(repo / "a.txt", "main\n")
    git(repo, "commit", "-q", "-am", "main")
    git(repo, "merge", "other", check=False)
    plain = cli.root / "plain"
    plain.mkdir()
    up_shared(cli, shared_broker)
    merging = cli.json("spawn", "merging", "--cwd", str(repo))
    out = cli.run("down", "--preserve-state", check=False)
    assert out.returncode == 2
    assert "seat merging" in out.stderr and "nothing was stopped" in out.stderr
    assert "merge" in out.stderr
    assert cli.json("status")["state"] == "active"
    [row] = cli.ps()
    assert row["pid"] == merging["pid"] and row["state"] == "running"
    cli.run("rm", "merging")
    loose = cli.json("spawn", "loose", "--cwd", str(plain))
    out = cli.run("down", "--preserve-state", check=False)
    assert out.returncode == 2 and "seat loose" in out.stderr and "git init" in out.stderr
    [row] = cli.ps()
    assert row["pid"] == loose["pid"]
    assert not (cli.root / ".cotal/maintenance/v1/checkpoints").exists() or not any(
        (cli.root / ".cotal/maintenance/v1/checkpoints").iterdir()
    )


def _big_repo(path: Path) -> Path:
    # Incompressible untracked bytes keep the capture busy long enough to be interrupted.
    return _big_repo_sized(path, 200 * 1024 * 1024)


async def test_daemon_killed_between_prepare_and_commit_is_completed_offline(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    repo = init_repo(cli.root / "repo")
    write(repo / "a.txt", "a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "a")
    up_shared(cli, shared_broker)
    seat = cli.json(
        "spawn", "kept", "--cwd", str(repo), "--prompt", "remember the phrase offline-7"
    )
    daemon = cli.json("status")["pid"]
    # Play the coordinator up to the journal's cut-intent, then lose the daemon.
    c = await client(cli)
    async with c:
        plan = await c.call("prepare-preservation", {"attemptId": "killed-1"})
    from protocol.codec import convert
    from protocol.maintenance import ResumeDescriptor

    Journal(Layout.at(cli.root)).advance(
        "killed-1", "cut-intent", resume=convert(plan["resume"], ResumeDescriptor, what="plan")
    )
    os.kill(daemon, signal.SIGKILL)
    await wait_gone([daemon, seat["pid"]])
    result = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert (
        result["attemptId"] == "killed-1"
        and result["journal"] == "ready"
        and result["offline"] is True
    )
    [record] = verify_integrity(Path(result["checkpointDir"]))
    assert (
        record.lifecycle_uid == seat["lifecycleUid"]
        and record.session.session_id == seat["sessionId"]
    )
    assert record.session.continuity == "exact"


async def test_daemon_killed_during_capture_never_leaves_a_sealed_partial(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    repos = [_big_repo(cli.root / "big"), init_repo(cli.root / "small")]
    write(repos[1] / "s.txt", "s\n")
    git(repos[1], "add", "s.txt")
    git(repos[1], "commit", "-q", "-m", "s")
    up_shared(cli, shared_broker)
    seats = [
        cli.json("spawn", "a_big", "--cwd", str(repos[0])),
        cli.json("spawn", "b_small", "--cwd", str(repos[1])),
    ]
    daemon = cli.json("status")["pid"]
    log = cli.root / ".cotal/logs/manager.log"
    argv = [
        sys.executable,
        "-m",
        "manager.cli",
        "down",
        "--preserve-state",
        "--root",
        str(cli.root),
    ]
    async with await anyio.open_process(
        argv, env=cotal_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    ) as cut:
        # Killed once the capture has begun: the attempt directory holds a seat's directory
        # (`cut.stopped` is logged just before the attempt directory is made).
        checkpoints = cli.root / ".cotal/maintenance/v1/checkpoints"
        await wait_until(
            lambda: (
                '"event": "cut.stopped"' in log.read_text()
                and any(p.is_dir() for p in checkpoints.glob("*/*"))
            ),
            timeout=60,
        )
        os.kill(daemon, signal.SIGKILL)
        with anyio.fail_after(60):
            assert await cut.wait() != 0
    await wait_gone([daemon] + [s["pid"] for s in seats])
    journal = Journal(Layout.at(cli.root)).load()
    assert journal is not None and journal.state == "cut-intent"
    attempt = journal.attempt_id
    partial = cli.root / ".cotal/maintenance/v1/checkpoints" / attempt
    assert partial.is_dir() and not (partial / "manifest.json").exists()
    out = cli.run("down", "--preserve-state", "--json", timeout=300)
    result = json.loads(out.stdout)
    assert result["journal"] == "ready" and result["attemptId"] == attempt
    records = verify_integrity(Path(result["checkpointDir"]))
    assert sorted(r.name for r in records) == ["a_big", "b_small"]
    # The interrupted directory was kept as evidence, and nothing in it looks sealed.
    [aside] = [p for p in partial.parent.iterdir() if p.name.startswith(f"{attempt}.partial-")]
    assert not (aside / "manifest.json").exists()
    for seat_dir in aside.iterdir():
        if (seat_dir / "checkpoint.json").exists():
            verify_seat_files(seat_dir, read_seat_checkpoint(seat_dir))


async def test_inbox_survives_the_cut_at_the_broker(cli: Cli, shared_broker: SharedBroker) -> None:
    init_repo(cli.root)
    write(cli.root / "f.txt", "x\n")
    git(cli.root, "add", "f.txt")
    git(cli.root, "commit", "-q", "-m", "one")
    up_shared(cli, shared_broker)
    row = cli.json("spawn", "inbox")
    cli.run("down", "--preserve-state")
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        info = await js.consumer_info("DM_main", f"dm_local-inbox-{row['lifecycleUid']}")
    assert info.config.filter_subject == "cotal.main.inst.local.inbox.>"


async def test_capture_of_a_large_repository_shows_progress(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    repo = _big_repo_sized(cli.root / "big", 40 * 1024 * 1024)
    up_shared(cli, shared_broker)
    cli.json("spawn", "big", "--cwd", str(repo))
    out = cli.run("down", "--preserve-state")
    lines = [line for line in out.stderr.splitlines() if "capture.progress" in line]
    phases = [line.split("phase=")[1].split()[0] for line in lines]
    assert phases[0] == "bundle" and "untracked" in phases, out.stderr
    [summary] = [line for line in out.stdout.splitlines() if line.strip().startswith("big ")]
    assert int(summary.split()[2]) >= 40 * 1024 * 1024


def _big_repo_sized(path: Path, size: int) -> Path:
    repo = init_repo(path)
    write(repo / "a.txt", "a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "a")
    write(repo / "big.bin", os.urandom(size))
    return repo


async def test_include_carries_a_declared_ignored_file_and_refuses_a_bad_pattern(
    cli: Cli, shared_broker: SharedBroker
) -> None:
    repo = init_repo(cli.root / "app")
    write(repo / ".gitignore", ".env\nbuild/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore")
    write(repo / ".env", "API_URL=http://127.0.0.1:9\n")
    write(repo / "build" / "out.bin", "not carried\n")
    up_shared(cli, shared_broker)
    cli.json("spawn", "app", "--cwd", str(repo))
    # A pattern that climbs out of the repository is refused before anything is fenced.
    bad = cli.run("down", "--preserve-state", "--include", "../secret", "--json", check=False)
    assert bad.returncode == 2
    assert json.loads(bad.stderr.splitlines()[-1])["code"] == "bad-include"
    assert [r["state"] for r in cli.ps()] == ["running"]
    out = json.loads(cli.run("down", "--preserve-state", "--include", ".env", "--json").stdout)
    [record] = verify_integrity(Path(out["checkpointDir"]))
    assert record.repository.include == [".env"]
    assert record.repository.untracked_selection.endswith("; plus declared ignored: .env")
    seat_dir = Path(out["checkpointDir"]) / "app"
    with tarfile.open(seat_dir / record.repository.untracked.file) as archive:
        names = archive.getnames()
    assert ".env" in names and "build/out.bin" not in names
