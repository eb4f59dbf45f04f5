"""A seat that cannot be proven stopped makes the cut refuse, and seals nothing.

The stand-in for a process stuck in the kernel (`D` state) is the cgroup v1 freezer: a frozen
task does not die from SIGKILL until it is thawed, so the stop's escalation (SIGKILL of the group,
the deadline, SIGKILL again) ends without a reaped exit, exactly as for a harness blocked in an
uninterruptible read. Thawing it is the operator's `kill -9` finally taking effect.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from tests.conftest import Cli, cotal_env
from tests.gitrepo import git, init_repo, write
from tests.helpers import carry_to_new_host, pid_alive, wait_gone, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

FREEZER = Path("/sys/fs/cgroup/freezer")
PHRASE = "frozen-heron-7"


def _freezer_missing() -> str | None:
    if os.geteuid() != 0:
        return "freezing a seat needs root (writing a cgroup v1 freezer)"
    if not (FREEZER / "cgroup.procs").exists():
        return f"no cgroup v1 freezer mounted at {FREEZER}"
    if not os.access(FREEZER, os.W_OK):
        return f"{FREEZER} is not writable here"
    return None


def group_members(pgid: int) -> list[int]:
    """Every live process in the process group `pgid`: what the stop signals."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) == pgid:
                found.append(int(entry))
        except ProcessLookupError:
            continue
    return found


@contextmanager
def frozen(pids: list[int]) -> Iterator[Path]:
    """`pids` moved into a new freezer cgroup and FROZEN; always thawed, moved back and removed,
    so a failing test leaves no task that cannot die."""
    group = FREEZER / f"cotal-test-{uuid.uuid4().hex[:12]}"
    group.mkdir()
    try:
        for pid in pids:
            (group / "cgroup.procs").write_text(f"{pid}\n")
        (group / "freezer.state").write_text("FROZEN\n")
        yield group
    finally:
        thaw(group)
        for line in (group / "cgroup.procs").read_text().split():
            try:
                (FREEZER / "cgroup.procs").write_text(f"{line}\n")
            except OSError:
                pass
        group.rmdir()


def thaw(group: Path) -> None:
    if group.exists():
        (group / "freezer.state").write_text("THAWED\n")


def state(group: Path) -> str:
    return (group / "freezer.state").read_text().strip()


def committed_root(cli: Cli) -> None:
    init_repo(cli.root)
    write(cli.root / "f.txt", "x\n")
    git(cli.root, "add", "f.txt")
    git(cli.root, "commit", "-q", "-m", "one")


async def run_cli(cli: Cli, *args: str) -> subprocess.CompletedProcess[bytes]:
    return await anyio.run_process(
        [sys.executable, "-m", "manager.cli", *args, "--root", str(cli.root)],
        check=False,
        env=cotal_env(),
        cwd=cli.root,
    )


async def test_a_seat_that_cannot_die_makes_the_cut_refuse_and_seal_nothing(
    tmp_path: Path, cli: Cli
) -> None:
    missing = _freezer_missing()
    if missing is not None:
        pytest.skip(missing)
    committed_root(cli)
    cli.run("up", "--detach")
    stuck = cli.json("spawn", "stuck")
    other = cli.json("spawn", "other")
    for name in ("stuck", "other"):
        cli.run("send", name, f"remember the phrase {PHRASE}", "--wait")
    layout = Layout.at(cli.root)
    members = group_members(stuck["pid"])
    assert stuck["pid"] in members
    with frozen(members) as group:
        await wait_until(lambda: state(group) == "FROZEN", timeout=10)
        # The stop's own deadlines (SIGKILL, 10 s, SIGKILL, 2 s) bound the refusal; the bound
        # here only keeps a broken deadline from hanging the suite.
        with anyio.fail_after(90):
            out = await run_cli(cli, "down", "--preserve-state")
        err = out.stderr.decode()
        assert out.returncode != 0, err
        assert "Traceback" not in err and "internal error" not in err
        [line] = [x for x in err.splitlines() if x.startswith("cotal: ")]
        assert f"seat stuck (pid {stuck['pid']}) was not reaped within 12s of its stop" in line
        assert f"kill -9 {stuck['pid']}" in line
        # Named by its code: one seat failed, so the refusal is that seat's own code.
        out_json = await run_cli(cli, "down", "--preserve-state", "--json")
        assert out_json.returncode != 0
        assert '"code": "stop-unproven"' in out_json.stderr.decode()
        # Nothing sealed: every attempt directory is evidence, none carries a manifest, and the
        # refusal names where the evidence is.
        checkpoints = layout.maintenance / "checkpoints"
        attempts = sorted(checkpoints.iterdir())
        assert attempts and all(".failed-" in p.name for p in attempts)
        assert not any((p / "manifest.json").exists() for p in attempts)
        assert "evidence kept at " in line
        assert line.rsplit("evidence kept at ", 1)[1].strip() == str(attempts[0])
        record = Journal(layout).load()
        assert record is not None and record.state == "cut-intent"
        # The other seat is stopped, so the cut can only be finished, never aborted.
        abort = await run_cli(cli, "down", "--preserve-state", "--abort", "--json")
        assert abort.returncode == 2 and '"code": "commit-begun"' in abort.stderr.decode()
        # Still frozen, still alive: nothing pretended it was gone.
        assert pid_alive(stuck["pid"])
        thaw(group)
        # The SIGKILL queued while frozen lands now; the manager reaps it.
        await wait_gone([stuck["pid"]], timeout=30)
    with anyio.fail_after(120):
        done = await run_cli(cli, "down", "--preserve-state", "--json")
    assert done.returncode == 0, done.stderr.decode()
    result = json.loads(done.stdout)
    assert result["journal"] == "ready" and result["failures"] == []
    checkpoint = Path(result["checkpointDir"])
    assert (checkpoint / "manifest.json").exists()
    await wait_gone([other["pid"]], timeout=30)

    copy = carry_to_new_host(cli.root, checkpoint, tmp_path)
    cli.run("up", "--restore", str(copy))
    for name in ("stuck", "other"):
        reply = cli.json("send", name, "What was the phrase?", "--wait")["reply"]
        assert reply == f"The phrase is {PHRASE}."
    cli.run("down")
