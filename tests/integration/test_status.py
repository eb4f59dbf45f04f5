"""`cotal status` as a report (nothing up, a mesh up, a sealed cut waiting), the warnings a
plain `up` and a spawn outside a git work tree give, and `.cotal/.gitignore` (real processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from manager.workspace import trust
from tests.conftest import Cli
from tests.gitrepo import git, init_repo, write
from tests.helpers import pid_alive

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]


def _committed_repo(root: Path) -> None:
    init_repo(root)
    write(root / "f.txt", "x\n")
    git(root, "add", "f.txt")
    git(root, "commit", "-q", "-m", "one")


def _public_key(root: Path) -> str:
    [identity] = (root / ".cotal" / "auth").glob("manager-instance.*.json")
    key: str = json.loads(identity.read_text())["publicKey"]
    return key


def test_status_with_nothing_up_is_a_report_not_a_refusal(cli: Cli) -> None:
    out = cli.run("status")
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.splitlines() == [
        f"root      {cli.root}",
        "manager   not running",
        # The suite's clock hook stands in for the kernel's reading, and status names it.
        "clock     synchronized, by COTAL_TEST_CLOCK_STATUS: COTAL_TEST_CLOCK_STATUS=synchronized",
        "broker    none recorded",
        "seats     0 recorded (taken back by `cotal up`)",
        "waiting   nothing",
        f"nothing is up in {cli.root}",
    ]
    doc = cli.json("status")
    assert doc["up"] is False and doc["root"] == str(cli.root)
    assert doc["manager"]["state"] == doc["state"] == "down" and doc["pid"] is None
    assert doc["manager"]["publicKey"] is None and doc["waiting"] == []
    # Nothing was created by asking.
    assert not (cli.root / ".cotal").exists()


async def test_status_with_a_mesh_up(mesh: Cli) -> None:
    kept = mesh.json("spawn", "alice")
    mesh.json("spawn", "bob")
    mesh.run("stop", "alice")
    doc = mesh.json("status")
    record = json.loads((mesh.root / ".cotal" / "mesh.json").read_text())
    manager = doc["manager"]
    assert doc["up"] is True and manager["state"] == doc["state"] == "active"
    assert manager["pid"] == doc["pid"] == record["manager"]["pid"] and pid_alive(doc["pid"])
    assert manager["instanceId"] == doc["instanceId"] == kept["instanceId"]
    assert manager["publicKey"] == _public_key(mesh.root)
    # The fingerprint an untrusted-signer refusal elsewhere asks the operator to compare.
    assert manager["fingerprint"] == trust.fingerprint(manager["publicKey"])
    assert manager["fingerprint"].startswith("SHA256:") and len(manager["fingerprint"]) == 50
    human = mesh.run("status").stdout.splitlines()
    assert f"          fingerprint {manager['fingerprint']}" in human
    assert manager["space"] == doc["space"] == "main"
    assert doc["broker"] == {
        "url": record["server"],
        "embedded": True,
        "pid": record["embeddedBroker"]["pid"],
        "alive": True,
    }
    assert doc["server"] == record["server"] and doc["startedAt"] == manager["startedAt"]
    assert doc["seats"] == {
        "count": 2,
        "byState": {"running": 1, "stopped": 1},
        "source": "manager",
    }
    assert doc["custody"] == {"holder": kept["instanceId"]}
    assert doc["waiting"] == []
    human = mesh.run("status").stdout.splitlines()
    assert human[1].startswith(f"manager   active  pid {doc['pid']}  since ")
    assert f"signer    {manager['publicKey']}  (carry it: cotal trust add KEY)" in human
    assert f"broker    {record['server']}  embedded, pid {record['embeddedBroker']['pid']}" in human
    assert "seats     2: 1 running, 1 stopped" in human
    assert "waiting   nothing" in human


async def test_a_sealed_cut_is_shown_waiting_and_a_plain_up_warns(cli: Cli) -> None:
    _committed_repo(cli.root)
    cli.run("up", "--detach")
    cli.json("spawn", "alice")
    cut = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    ckpt, attempt = cut["checkpointDir"], cut["attemptId"]
    restore = f"cotal up --restore {ckpt}"
    discard = f"cotal checkpoint discard {attempt}"

    out = cli.run("status")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[1] == "manager   not running"
    assert f"waiting   cut {attempt} is sealed and not restored" in lines
    assert f"          restore:  {restore}" in lines
    assert f"          discard:  {discard}" in lines
    assert "seats     0 recorded (taken back by `cotal up`)" in lines
    doc = cli.json("status")
    [waiting] = doc["waiting"]
    assert waiting["what"] == "sealed-cut" and waiting["journalState"] == "ready"
    assert waiting["checkpointDir"] == ckpt and waiting["next"] == [restore, discard]
    assert doc["manager"]["publicKey"] == _public_key(cli.root)

    up = cli.run("up", "--detach")
    try:
        assert (
            f"warning: cut {attempt} is sealed and not restored; a plain `cotal up` starts a "
            "fresh mesh beside it\n"
            f"  restore:  {restore}\n"
            f"  discard:  {discard}\n"
        ) in up.stderr
        assert "cotal is up" in up.stdout
        assert cli.json("status")["waiting"] == [waiting]
    finally:
        cli.run("down")


async def test_cotal_gitignore_keeps_git_status_clean(cli: Cli) -> None:
    _committed_repo(cli.root)
    ignore = cli.root / ".cotal" / ".gitignore"
    for _ in range(2):
        cli.run("up", "--detach")
        try:
            assert ignore.read_text() == "*\n"
            porcelain = git(cli.root, "status", "--porcelain", "--untracked-files=all").decode()
            assert ".cotal" not in porcelain, porcelain
            assert porcelain == ""
        finally:
            cli.run("down")
    assert ignore.read_text() == "*\n"


async def test_spawn_outside_a_git_work_tree_warns_and_proceeds(mesh: Cli, tmp_path: Path) -> None:
    loose = mesh.run("spawn", "loose")
    assert loose.stdout.startswith("spawned loose (scribe) pid ")
    assert loose.stderr == (
        f"warning: {mesh.root} is not a git repository: this seat cannot be cut (cotal down "
        "--preserve-state refuses it); use a git work tree or accept that it cannot move\n"
    )
    repo = tmp_path / "repo"
    _committed_repo(repo)
    inside = mesh.run("spawn", "tidy", "--cwd", str(repo))
    assert inside.stderr == ""
    (repo / "sub").mkdir()
    nested = mesh.run("spawn", "nested", "--cwd", str(repo / "sub"))
    assert nested.stderr.startswith(
        f"warning: {repo / 'sub'} is inside the git repository at {repo} but not its top level"
    )
    assert [r["state"] for r in mesh.ps()] == ["running"] * 3
