"""Incremental cuts through the real cut and resume: a full cut A, then B since A and C since B
on the same root (each resumed in place before the next), carried to a new host as three
directories side by side and restored there; a missing or tampered middle attempt is refused
before anything changes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from manager.checkpoint.reader import read_seat_checkpoint
from tests.conftest import Cli, SharedBroker
from tests.gitrepo import git, init_repo, stash_list, tree_digest, write
from tests.helpers import signer_key

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]


def broker(b: SharedBroker) -> tuple[str, ...]:
    return ("--server", b.url, "--creds", b.creds)


def refusal(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(proc.stderr.splitlines()[-1])
    return doc


def make_workspace(repo: Path) -> None:
    """A history worth not carrying twice (incompressible blobs) and a tree with every kind of
    change: staged, unstaged, untracked."""
    init_repo(repo)
    for i in range(3):
        noise = b"".join(hashlib.sha256(f"{i}-{k}".encode()).digest() for k in range(8192))
        write(repo / f"blob{i}.bin", noise)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {i}")
    write(repo / "README.md", "# demo\n")
    git(repo, "add", "README.md")
    write(repo / "notes/todo.txt", "untracked notes\n")


def observe(repo: Path) -> dict[str, object]:
    return {
        "refs": git(repo, "for-each-ref", "--format=%(objectname) %(refname)"),
        "head": git(repo, "symbolic-ref", "-q", "HEAD", check=False),
        "status": git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all"),
        "stash": stash_list(repo),
        "tree": tree_digest(repo),
    }


def down(cli: Cli, *extra: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(
        cli.run("down", "--preserve-state", "--json", *extra).stdout
    )
    assert result["journal"] == "ready" and result["failures"] == [], result
    return result


def resume_here(cli: Cli, b: SharedBroker, attempt: Path) -> None:
    out = json.loads(cli.run("up", "--restore", str(attempt), *broker(b), "--json").stdout)
    assert [s["sameUid"] for s in out["seats"]] == [True], out


async def test_three_incremental_cuts_restore_byte_identical_on_a_new_host(
    tmp_path: Path, cli: Cli, shared_broker: SharedBroker
) -> None:
    b = shared_broker
    proj = cli.root / "proj"
    make_workspace(proj)
    cli.run("up", "--detach", *broker(b))
    cli.json("spawn", "default", "--agent", "scribe", "--cwd", str(proj), "--prompt", "hello")
    first = down(cli)
    a_dir = Path(first["checkpointDir"])
    [seat_a] = first["seats"]
    assert seat_a["since"] is None and seat_a["bundleBytes"] > 700_000

    # B since A: a new commit, a changed file and a stash entry.
    resume_here(cli, b, a_dir)
    write(proj / "blob1.bin", b"changed in B\n")
    git(proj, "commit", "-q", "-am", "change blob1")
    write(proj / "README.md", "# demo, stashed\n")
    git(proj, "stash", "push", "-q", "-m", "wip at B")
    write(proj / "blob2.bin", b"unstaged at B\n")
    second = down(cli, "--since", first["attemptId"])
    b_dir = Path(second["checkpointDir"])
    [seat_b] = second["seats"]
    assert seat_b["since"] == first["attemptId"]
    assert 0 < seat_b["bundleBytes"] < seat_a["bundleBytes"] // 20
    record_b = read_seat_checkpoint(b_dir / "default").repository
    assert record_b.since is not None and record_b.since.attempt_id == first["attemptId"]

    # C since B: only the worktree moved, so no history travels at all.
    resume_here(cli, b, b_dir)
    write(proj / "blob0.bin", b"changed in C\n")
    write(proj / "more-notes.txt", "untracked at C\n")
    third = down(cli, "--since", second["attemptId"])
    c_dir = Path(third["checkpointDir"])
    [seat_c] = third["seats"]
    assert seat_c["since"] == second["attemptId"] and seat_c["bundleBytes"] == 0
    assert not (c_dir / "default" / "repo.bundle").exists()
    want = observe(proj)
    assert b"wip at B" in want["stash"]  # type: ignore[operator]

    # A packed file would travel without its predecessors: refused by name.
    proc = cli.run(
        "checkpoint", "pack", str(c_dir), "-o", str(tmp_path / "c.tar"), "--json", check=False
    )
    assert proc.returncode == 2 and refusal(proc)["code"] == "incremental-pack", proc.stderr
    assert not (tmp_path / "c.tar").exists()

    # The new host: the three attempts side by side, the source gone.
    key = signer_key(cli.root)
    carried = tmp_path / "carried"
    for d in (a_dir, b_dir, c_dir):
        shutil.copytree(d, carried / d.name, symlinks=True)
    shutil.rmtree(cli.root)
    cli.root.mkdir()
    cli.run("trust", "add", key, "--name", "host-a")
    c_copy, b_copy = carried / c_dir.name, carried / b_dir.name

    # The middle attempt missing: refused by name, nothing written.
    os.rename(b_copy, tmp_path / "b-aside")
    proc = cli.run("up", "--restore", str(c_copy), *broker(b), "--json", check=False)
    assert proc.returncode == 2, proc.stderr
    doc = refusal(proc)
    assert doc["code"] == "predecessor-missing", doc
    assert b_dir.name in doc["error"] and "seat default" in doc["error"], doc
    assert "copy the attempt directory" in doc["error"] and "--since" in doc["error"], doc
    assert not proj.exists()

    # The middle attempt's bundle altered: refused at the integrity gate.
    os.rename(tmp_path / "b-aside", b_copy)
    bundle = b_copy / "default" / "repo.bundle"
    original = bundle.read_bytes()
    os.chmod(bundle, 0o600)
    bundle.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
    proc = cli.run("up", "--restore", str(c_copy), *broker(b), "--json", check=False)
    assert proc.returncode == 2, proc.stderr
    doc = refusal(proc)
    assert doc["code"] == "integrity" and "integrity gate" in doc["error"], doc
    assert str(bundle) in doc["error"], doc
    assert not proj.exists()
    bundle.write_bytes(original)

    verified = cli.json("checkpoint", "verify", str(c_copy), *broker(b))
    [seat] = verified["seats"]
    assert [link["attemptId"] for link in seat["chain"]] == [a_dir.name, b_dir.name]

    out = json.loads(cli.run("up", "--restore", str(c_copy), *broker(b), "--json").stdout)
    assert [s["sameUid"] for s in out["seats"]] == [True], out
    assert observe(proj) == want
    cli.run("down")
