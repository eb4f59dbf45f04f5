"""`cotal move`'s pre-copy through a real broker: the seat's history travels before the fence and
the cut carries only what is new on top of it; the destination's repository is the source's, and
neither root keeps the shipped bundle once the seat runs at the destination."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from anyio.streams.text import TextReceiveStream
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol import move, names
from tests.ckpt import source_identity
from tests.conftest import Cli, SharedBroker, cotal_env
from tests.e2e.test_move import failing_destination, server_of, two_roots  # noqa: F401  (the fixture)
from tests.gitrepo import git, init_repo, tree_digest, write
from tests.helpers import processes_mentioning, refused, signer_key

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


def spawn_heavy(cli: Cli) -> tuple[Path, dict[str, Any]]:
    repo = history_repo(cli, "heavy")
    seat = cli.json(
        "spawn", "heavy", "--agent", "scribe", "--cwd", str(repo),
        "--prompt", f"Remember the phrase {PHRASE}.",
    )  # fmt: skip
    return repo, seat


def precopied(cli: Cli) -> list[str]:
    store = cli.root / ".cotal/maintenance/v1/precopy"
    return sorted(p.name for p in store.iterdir()) if store.exists() else []


async def test_move_ships_the_history_before_the_fence(two_roots: tuple[Cli, Cli]) -> None:  # noqa: F811
    a, b = two_roots
    repo, seat = spawn_heavy(a)
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


async def test_a_destination_indexes_only_history_a_trusted_source_signed(
    two_roots: tuple[Cli, Cli],  # noqa: F811
    shared_broker: SharedBroker,
) -> None:
    """Anyone who can publish on the broker can ask B to keep a pre-copy; B unbundles nothing
    that a signer in its trust store did not sign, and says which refusal it was."""
    import nats

    a, b = two_roots
    status = b.json("status")
    space, to_b = status["space"], status["instanceId"]
    stranger = Ed25519PrivateKey.generate()
    stranger_pub = base64.b64encode(stranger.public_key().public_bytes_raw()).decode()
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    pre = move.MovePrecopy(
        source="forged",
        seat="heavy",
        uid="0" * 26,
        object="precopy-" + "a" * 64,
        sha256="a" * 64,
        bytes=10,
        signer=stranger_pub,
        signature="",
    )
    signed = base64.b64encode(stranger.sign(move.precopy_payload(space, pre))).decode()
    untrusted = msgspec.structs.replace(pre, signature=signed)
    # A's key, which B trusts, named without A's signature.
    forged = msgspec.structs.replace(pre, signer=signer_key(a.root), signature=signed)
    # Signed by A, naming an object the move bucket does not hold: B's fetch child says so.
    ident = source_identity(a.root)
    unsigned = msgspec.structs.replace(pre, signer=ident.public_key_b64)
    missing = msgspec.structs.replace(
        unsigned,
        signature=base64.b64encode(ident.sign(move.precopy_payload(space, unsigned))).decode(),
    )
    nc = await nats.connect(shared_broker.url, nkeys_seed=shared_broker.creds)
    try:
        answers = {}
        for label, record in (("untrusted", untrusted), ("forged", forged), ("missing", missing)):
            msg = await nc.request(
                names.move_subject(space, to_b, "precopy"), move.encode(record), timeout=10
            )
            answers[label] = move.decode_answer(msg.data)
    finally:
        await nc.close()
    assert (answers["untrusted"].ok, answers["untrusted"].code) == (False, "untrusted-signer")
    assert (answers["forged"].ok, answers["forged"].code) == (False, "bad-signature")
    assert (answers["missing"].ok, answers["missing"].code) == (False, "move-failed")
    assert answers["missing"].message is not None
    assert answers["missing"].message.startswith(
        f"the pre-copied history {pre.object} could not be fetched from the move bucket: "
    )
    assert precopied(b) == []


async def move_editing_between_probe_and_offer(
    a: Cli, to: str, name: str, edit: Callable[[], None]
) -> subprocess.CompletedProcess[str]:
    """`cotal move` at A, with `edit` made once its probe passed and its pre-copy was shipped,
    before its offer: A's command is held (SIGSTOP) from the line that says the history went
    until the edit is made, so whatever B's admission reads after the offer is the edited
    state, which no probe could have seen."""
    argv = [sys.executable, "-m", "manager.cli", "move", name, "--to", to, "--json"]
    shipped = f"pre-copied {name}'s history"
    async with await anyio.open_process(
        [*argv, "--root", str(a.root)], env=cotal_env(a.env), cwd=a.root
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        err = TextReceiveStream(proc.stderr)
        said = ""
        with anyio.fail_after(180):
            while shipped not in said:
                try:
                    said += await err.receive()
                except anyio.EndOfStream:
                    raise AssertionError(f"cotal move ended before its pre-copy: {said}") from None
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                edit()
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            out = "".join([chunk async for chunk in TextReceiveStream(proc.stdout)])
            said += "".join([chunk async for chunk in err])
            code = await proc.wait()
    return subprocess.CompletedProcess(argv, code, out, said)


async def test_a_refusal_after_the_precopy_takes_the_seat_back_on_its_own_bundle(
    two_roots: tuple[Cli, Cli],  # noqa: F811
) -> None:
    """B's admission of the offer refuses before its custody claim (its launch profile for the
    harness changed after the probe, which checked it, and before the offer): A takes the seat
    back, restored on the bundle it pre-copied, in its own session; the next move, once B's
    profile is back, goes."""
    a, b = two_roots
    repo, seat = spawn_heavy(a)
    want = tree_digest(repo)
    to_b = b.json("status")["instanceId"]
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")

    def edit_b() -> None:
        # Read by B's restore coordinator at admission, in B's manager: the identity gate
        # refuses.
        write(b.root / "cotal.toml", '[agents.scribe]\nmodel = "other"\n')

    refused_move = await move_editing_between_probe_and_offer(a, to_b, "heavy", edit_b)
    assert "pre-copied heavy's history" in refused_move.stderr
    message = refused(refused_move, "profile-drift")
    assert "launch profile for scribe" in message and "the seats run here again" in message
    home = {r["name"]: r for r in a.ps()}
    assert (home["heavy"]["lifecycleUid"], home["heavy"]["sessionId"]) == (
        seat["lifecycleUid"],
        seat["sessionId"],
    )
    assert home["heavy"]["state"] == "running"
    assert processes_mentioning(seat["lifecycleUid"]) == [home["heavy"]["pid"]]
    assert tree_digest(repo) == want
    assert [r["name"] for r in b.ps()] == []
    reply = a.json("send", "heavy", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}.", reply
    assert precopied(a) == []

    (b.root / "cotal.toml").unlink()
    moved = a.json("move", "heavy", "--to", to_b)
    assert [s["lifecycleUid"] for s in moved["seats"]] == [seat["lifecycleUid"]]
    assert tree_digest(Path({r["name"]: r for r in b.ps()}["heavy"]["cwd"])) == want
    assert precopied(a) == [] and precopied(b) == []


async def test_a_destination_that_dies_in_its_restore_before_the_claim_leaves_the_seat_sealed(
    two_roots: tuple[Cli, Cli],  # noqa: F811
) -> None:
    """B runs the restore coordinator in its own manager, so a death in it is the manager's:
    A cannot tell whether B claimed, so the seat waits sealed, never started twice; once B
    runs again, the same `cotal move` offers it again and B, which never claimed, adopts it."""
    a, b = two_roots
    repo, seat = spawn_heavy(a)
    want = tree_digest(repo)
    to_b, server = failing_destination(b, a, "resume.after-admission")

    died = a.run("move", "heavy", "--to", to_b, "--json", check=False, timeout=180)
    assert "wait sealed" in refused(died, "move-incomplete")
    assert processes_mentioning(seat["lifecycleUid"]) == []
    assert [r["name"] for r in a.ps()] == []

    b.run("up", "--detach", "--server", *server)
    moved = a.json("move", "heavy", "--to", to_b)
    assert [s["lifecycleUid"] for s in moved["seats"]] == [seat["lifecycleUid"]]
    at_b = {r["name"]: r for r in b.ps()}
    assert at_b["heavy"]["sessionId"] == seat["sessionId"]
    assert tree_digest(Path(at_b["heavy"]["cwd"])) == want
    assert processes_mentioning(seat["lifecycleUid"]) == [at_b["heavy"]["pid"]]
