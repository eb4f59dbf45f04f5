"""`cotal move`'s pre-copy through a real broker: the seat's history travels before the fence and
the cut carries only what is new on top of it; the destination's repository is the source's, and
neither root keeps the shipped bundle once the seat runs at the destination."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.e2e.test_move import two_roots  # noqa: F401  (the fixture)
from tests.gitrepo import git, init_repo, tree_digest, write
from tests.helpers import processes_mentioning, signer_key

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PHRASE = "heron-precopied-7"
BLOB_BYTES = 2 * 1024 * 1024


def history_repo(cli: Cli, name: str) -> Path:
    """Twenty commits and an incompressible 2 MiB blob: a history the cut should not carry."""
    repo = init_repo(cli.root / name)
    noise = b"".join(hashlib.sha256(f"blob-{k}".encode()).digest() for k in range(BLOB_BYTES // 32))
    write(repo / "data.bin", noise)
    for i in range(20):
        write(repo / "log.txt", f"entry {i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {i}")
    write(repo / "log.txt", "worked on, not committed\n")
    write(repo / "scratch.txt", "untracked\n")
    return repo


def precopied(cli: Cli) -> list[str]:
    store = cli.root / ".cotal/maintenance/v1/precopy"
    return sorted(p.name for p in store.iterdir()) if store.exists() else []


async def test_move_ships_the_history_before_the_fence(two_roots: tuple[Cli, Cli]) -> None:  # noqa: F811
    a, b = two_roots
    repo = history_repo(a, "heavy")
    seat = a.json(
        "spawn", "heavy", "--agent", "scribe", "--cwd", str(repo),
        "--prompt", f"Remember the phrase {PHRASE}.",
    )  # fmt: skip
    stay_b = b.json("spawn", "stay_b", "--agent", "scribe")
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    want = tree_digest(repo)
    refs = git(repo, "for-each-ref", "--format=%(objectname) %(refname)")

    moved = a.json("move", "heavy", "--to", stay_b["instanceId"])
    [row] = moved["seats"]
    # The whole history went ahead; the cut found nothing new to bundle on top of it.
    assert row["precopyBytes"] > BLOB_BYTES
    assert row["bundleBytes"] == 0
    at_b = {r["name"]: r for r in b.ps()}
    assert at_b["heavy"]["lifecycleUid"] == seat["lifecycleUid"]
    assert processes_mentioning(seat["lifecycleUid"]) == [at_b["heavy"]["pid"]]
    there = Path(at_b["heavy"]["cwd"])
    assert tree_digest(there) == want
    assert git(there, "for-each-ref", "--format=%(objectname) %(refname)") == refs
    reply = b.json("send", "heavy", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}.", reply
    # Neither root keeps the shipped bundle once the seat runs at B.
    assert precopied(a) == [] and precopied(b) == []

    # Back to A after a commit at B: B's pre-copy carries the new history too.
    write(there / "log.txt", "entry at b\n")
    git(there, "commit", "-q", "-am", "at b")
    a.run("trust", "add", signer_key(b.root), "--name", "host-b")
    back = b.json("move", "heavy", "--to", seat["instanceId"])
    [row] = back["seats"]
    assert row["precopyBytes"] > BLOB_BYTES and row["bundleBytes"] == 0
    home = {r["name"]: r for r in a.ps()}
    assert git(Path(home["heavy"]["cwd"]), "log", "-1", "--format=%s") == b"at b\n"
    assert precopied(a) == [] and precopied(b) == []
