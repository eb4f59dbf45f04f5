"""`cotal move NAME --to INSTANCE` between two running managers on one standalone broker.

The untrusted case refuses before anything is fenced (the seat keeps its very process at the
source); the trusted case moves the seat: one process carries its lifecycle uid, at the
destination, in its own session, answering its phrase, while each host's other seat keeps its
process; the source cannot start it again; and the seat moves back the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli, SharedBroker
from tests.gitrepo import git, init_repo, write
from tests.helpers import processes_mentioning, refused, signer_key, wait_gone, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PHRASE = "plover-moved-23"


def committed_root(root: Path) -> Path:
    init_repo(root)
    write(root / "README.md", "# move\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    return root


@pytest.fixture
def two_roots(tmp_path: Path, shared_broker: SharedBroker) -> Iterator[tuple[Cli, Cli]]:
    a, b = Cli(committed_root(tmp_path / "a")), Cli(committed_root(tmp_path / "b"))
    for cli in (a, b):
        cli.run("up", "--detach", "--server", shared_broker.url, "--creds", shared_broker.creds)
    yield a, b
    for cli in (a, b):
        if (cli.root / ".cotal" / "mesh.json").exists():
            cli.run("down", check=False)


def seat_repo(cli: Cli, name: str) -> Path:
    repo = init_repo(cli.root / name)
    write(repo / "notes.txt", f"{name}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", name)
    return repo


async def test_move_refuses_untrusted_then_moves_there_and_back(
    two_roots: tuple[Cli, Cli],
) -> None:
    a, b = two_roots
    mover = a.json(
        "spawn", "mover", "--agent", "scribe", "--cwd", str(seat_repo(a, "mover")),
        "--prompt", f"Remember the phrase {PHRASE}.",
    )  # fmt: skip
    stay_a = a.json("spawn", "stay_a", "--agent", "scribe")
    stay_b = b.json("spawn", "stay_b", "--agent", "scribe")
    to_b = stay_b["instanceId"]

    # B does not trust A's signer yet: refused before the fence, the very same process runs on.
    untrusted = a.run("move", "mover", "--to", to_b, "--json", check=False, timeout=120)
    assert "does not trust the source's signer" in refused(untrusted, "untrusted-signer")
    rows = {r["name"]: r for r in a.ps()}
    assert rows["mover"]["pid"] == mover["pid"] and rows["mover"]["state"] == "running"
    assert [r["name"] for r in b.ps()] == ["stay_b"]

    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    moved = a.json("move", "mover", "--to", to_b)
    [seat] = moved["seats"]
    assert (seat["name"], seat["lifecycleUid"], seat["session"]) == (
        "mover",
        mover["lifecycleUid"],
        mover["sessionId"],
    )
    assert moved["downtimeMs"] > 0 and moved["totalMs"] >= moved["downtimeMs"]
    # The test hook stood in for B's kernel clock when B admitted the seat: the move says so,
    # as an operator's declaration would be said (the destination journaled it too).
    assert moved["destinationClock"] == {
        "source": "COTAL_TEST_CLOCK_STATUS",
        "detail": "COTAL_TEST_CLOCK_STATUS=synchronized",
    }
    # Exactly one process carries the uid, and it is B's seat.
    at_b = {r["name"]: r for r in b.ps()}
    assert sorted(at_b) == ["mover", "stay_b"]
    assert at_b["stay_b"]["pid"] == stay_b["pid"]
    assert processes_mentioning(mover["lifecycleUid"]) == [at_b["mover"]["pid"]]
    assert [r["name"] for r in a.ps()] == ["stay_a"]
    assert a.ps()[0]["pid"] == stay_a["pid"]
    reply = b.json("send", "mover", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}.", reply
    # Nothing is left at the source to start it again: its sealed cut, journal and session
    # files went once B ran the seat.
    assert not Path(moved_dir(a, moved["attemptId"])).exists()
    assert not (a.root / ".cotal/maintenance/v1/journal.json").exists()
    assert not list((a.root / ".cotal/sessions").rglob(f"*{mover['lifecycleUid']}*"))
    assert [r["name"] for r in a.ps()] == ["stay_a"]

    # And back, the same way (A trusts B's signer for it).
    a.run("trust", "add", signer_key(b.root), "--name", "host-b")
    back_text = b.run("move", "mover", "--to", stay_a["instanceId"]).stdout
    assert "destination clock: COTAL_TEST_CLOCK_STATUS=synchronized (COTAL_TEST_CLOCK_STATUS)" in (
        back_text
    )
    assert f"moved mover to {stay_a['instanceId']}: uid {mover['lifecycleUid']}" in back_text
    assert [r["name"] for r in b.ps()] == ["stay_b"]
    home = {r["name"]: r for r in a.ps()}
    assert sorted(home) == ["mover", "stay_a"]
    assert home["mover"]["lifecycleUid"] == mover["lifecycleUid"]
    assert home["mover"]["sessionId"] == mover["sessionId"]
    reply = a.json("send", "mover", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}.", reply


async def test_a_move_between_two_hosts_takes_the_brokers_grant_with_it(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    """Two hosts, each with its own credential on one `cotal broker serve` (B's made by
    `cotal broker add-host`, which starts the grant keeper; B's manager joins by itself). A moves
    a seat to B: it answers there, a seat of A still reaches it across the hosts, and A's own
    credential, publishing as the seat with no header at all, is refused by the broker."""
    a, b = Cli(committed_root(tmp_path / "a")), Cli(committed_root(tmp_path / "b"))
    added = a.run(
        "broker", "add-host", "--store-dir", str(tmp_path / "broker"), "hostb", "--json"
    )  # fmt: skip
    b_creds = json.loads(added.stdout)["creds"]
    try:
        a.run("up", "--detach", "--server", shared_broker.url, "--creds", shared_broker.creds)
        b.run("up", "--detach", "--server", shared_broker.url, "--creds", b_creds)
        mover = a.json(
            "spawn", "mover", "--agent", "scribe", "--cwd", str(seat_repo(a, "mover")),
            "--prompt", f"Remember the phrase {PHRASE}.",
        )  # fmt: skip
        a.json("spawn", "stay_a", "--agent", "scribe", "--allow-send", "mover")
        to_b = b.json("spawn", "stay_b", "--agent", "scribe")["instanceId"]
        b.run("trust", "add", signer_key(a.root), "--name", "host-a")

        a.json("move", "mover", "--to", to_b)
        assert b.json("send", "mover", "What was the phrase?", "--wait")["reply"] == (
            f"The phrase is {PHRASE}."
        )
        told = a.json("send", "stay_a", "Tell mover: remember the phrase crossed-38", "--wait")
        assert told["reply"] == "Told mover: delivered."
        assert b.json("send", "mover", "What was the phrase?", "--wait")["reply"] == (
            "The phrase is crossed-38, from stay_a."
        )
        assert processes_mentioning(mover["lifecycleUid"]) == [
            r["pid"] for r in b.ps() if r["name"] == "mover"
        ]
        # As the seat, to a seat neither holds: A no longer holds the seat's grant.
        as_mover = "cotal.main.inst.local.peer.local.mover"
        assert await broker_refuses(shared_broker.url, shared_broker.creds, as_mover)
    finally:
        for cli in (a, b):
            if (cli.root / ".cotal" / "mesh.json").exists():
                cli.run("down", check=False)


async def broker_refuses(url: str, creds: str, subject: str) -> bool:
    """A core publish on `subject` with that credential and no header: True once the broker
    answers it with a permissions violation."""
    import anyio
    import nats

    said: list[str] = []
    heard = anyio.Event()

    async def on_error(exc: Exception) -> None:
        said.append(str(exc).lower())
        heard.set()

    nc = await nats.connect(url, nkeys_seed=creds, error_cb=on_error, allow_reconnect=False)
    try:
        await nc.publish(subject, b"stale write")
        await nc.flush()
        with anyio.fail_after(20):
            while not any(f'publish to "{subject}"' in e for e in said):
                await heard.wait()
                heard = anyio.Event()
    finally:
        await nc.close()
    return any("permissions violation" in e for e in said)


async def test_a_moved_seat_keeps_its_allow_send_and_the_destination_cannot_widen_it(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    a, b = Cli(committed_root(tmp_path / "a")), Cli(committed_root(tmp_path / "b"))
    # B's own cotal.toml would let `mover` send to every seat: a moved seat's list is the one
    # its sealed entry carries.
    write(b.root / "cotal.toml", '[seats.mover]\nallow_send = ["*"]\n')
    try:
        for cli in (a, b):
            cli.run("up", "--detach", "--server", shared_broker.url, "--creds", shared_broker.creds)
        a.json("spawn", "stay_a", "--agent", "scribe")
        a.json(
            "spawn", "mover", "--agent", "scribe", "--cwd", str(seat_repo(a, "mover")),
            "--allow-send", "stay_a",
        )  # fmt: skip
        to_b = b.json("spawn", "stay_b", "--agent", "scribe")["instanceId"]
        b.run("trust", "add", signer_key(a.root), "--name", "host-a")

        a.json("move", "mover", "--to", to_b)
        at_b = {r["name"]: r for r in b.ps()}
        assert at_b["mover"]["allowSend"] == ["stay_a"]
        # From B, over the shared broker, to the seat it was allowed (A's) and not to B's own.
        told = b.json(
            "send", "mover", "Tell stay_a: remember the phrase moved-permission-6\n"
            "Tell stay_b: hello", "--wait",
        )["reply"]  # fmt: skip
        allowed, denied = told.splitlines()
        assert allowed == "Told stay_a: delivered."
        assert denied.startswith("Could not tell stay_b: refused send-not-allowed")
        reply = a.json("send", "stay_a", "what was the phrase?", "--wait")["reply"]
        assert reply == "The phrase is moved-permission-6, from mover."
        assert b.json("send", "stay_b", "what was the phrase?", "--wait")["reply"] == (
            "I do not know the phrase."
        )
    finally:
        for cli in (a, b):
            if (cli.root / ".cotal" / "mesh.json").exists():
                cli.run("down", check=False)


def moved_dir(cli: Cli, attempt: str) -> str:
    return str(cli.root / ".cotal/maintenance/v1/checkpoints" / attempt)


@pytest.mark.parametrize("point", ["cut.after-cut-intent", "cut.after-cut-committed"])
async def test_a_move_whose_command_died_past_the_fence_is_finished_by_a_rerun(
    two_roots: tuple[Cli, Cli], point: str
) -> None:
    a, b = two_roots
    mover = a.json(
        "spawn", "mover", "--agent", "scribe", "--cwd", str(seat_repo(a, "mover")),
        "--prompt", f"Remember the phrase {PHRASE}.",
    )  # fmt: skip
    to_b = b.json("spawn", "stay_b", "--agent", "scribe")["instanceId"]
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    died = a.run(
        "move", "mover", "--to", to_b, "--json", check=False, env={"COTAL_FAILPOINT": point}
    )
    assert died.returncode != 0 and "Traceback" not in died.stderr
    # The same command again finishes what the journal says was begun.
    done = a.json("move", "mover", "--to", to_b)
    assert [s["lifecycleUid"] for s in done["seats"]] == [mover["lifecycleUid"]]
    assert [r["name"] for r in a.ps()] == []
    at_b = {r["name"]: r for r in b.ps()}
    assert sorted(at_b) == ["mover", "stay_b"]
    assert at_b["mover"]["sessionId"] == mover["sessionId"]
    assert processes_mentioning(mover["lifecycleUid"]) == [at_b["mover"]["pid"]]
    reply = b.json("send", "mover", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}.", reply
    # And once more: the move is done, and says so rather than moving anything.
    again = a.run("move", "mover", "--to", to_b, "--json", check=False)
    refused(again, "no-such-seat")


async def test_move_on_a_three_node_cluster(tmp_path: Path, nats_cluster: Any) -> None:
    """The same move with every stream, bucket and the move object replicated on three nodes."""
    a, b = Cli(committed_root(tmp_path / "ca")), Cli(committed_root(tmp_path / "cb"))
    for cli in (a, b):
        cli.run("up", "--detach", "--server", nats_cluster.urls, "--creds", nats_cluster.creds)
    try:
        mover = a.json(
            "spawn", "mover", "--agent", "scribe", "--cwd", str(seat_repo(a, "mover")),
            "--prompt", f"Remember the phrase {PHRASE}.",
        )  # fmt: skip
        to_b = b.json("spawn", "stay_b", "--agent", "scribe")["instanceId"]
        b.run("trust", "add", signer_key(a.root), "--name", "host-a")
        moved = a.json("move", "mover", "--to", to_b)
        assert [s["session"] for s in moved["seats"]] == [mover["sessionId"]]
        at_b = {r["name"]: r for r in b.ps()}
        assert at_b["mover"]["lifecycleUid"] == mover["lifecycleUid"]
        assert processes_mentioning(mover["lifecycleUid"]) == [at_b["mover"]["pid"]]
        reply = b.json("send", "mover", "What was the phrase?", "--wait")
        assert reply["reply"] == f"The phrase is {PHRASE}.", reply
    finally:
        for cli in (a, b):
            if (cli.root / ".cotal" / "mesh.json").exists():
                cli.run("down", check=False)


async def test_a_move_whose_source_manager_died_is_finished_offline_by_a_rerun(
    two_roots: tuple[Cli, Cli],
) -> None:
    a, b = two_roots
    mover = a.json(
        "spawn", "mover", "--agent", "scribe", "--cwd", str(seat_repo(a, "mover")),
        "--prompt", f"Remember the phrase {PHRASE}.",
    )  # fmt: skip
    a.json("spawn", "stay_a", "--agent", "scribe")
    to_b = b.json("spawn", "stay_b", "--agent", "scribe")["instanceId"]
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    died = a.run(
        "move", "mover", "--to", to_b, "--json", check=False,
        env={"COTAL_FAILPOINT": "cut.after-cut-intent:manager"},
    )  # fmt: skip
    assert died.returncode != 0 and "Traceback" not in died.stderr
    # Every seat of A died with its manager; the rerun captures the moved one offline.
    await wait_gone([pid for pid in processes_mentioning(mover["lifecycleUid"])], timeout=30)
    done = a.json("move", "mover", "--to", to_b)
    assert [s["lifecycleUid"] for s in done["seats"]] == [mover["lifecycleUid"]]
    at_b = {r["name"]: r for r in b.ps()}
    assert at_b["mover"]["sessionId"] == mover["sessionId"]
    assert processes_mentioning(mover["lifecycleUid"]) == [at_b["mover"]["pid"]]
    reply = b.json("send", "mover", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}.", reply
    # A's manager comes back with the seat the move did not carry, and not the moved one.
    a.run("up", "--detach", "--server", *server_of(b))
    try:
        await wait_until(
            lambda: [(r["name"], r["state"]) for r in a.ps()] == [("stay_a", "running")],
            timeout=30,
            every=0.3,
        )
    except TimeoutError:
        raise AssertionError(f"{a.ps()}") from None
    assert processes_mentioning(mover["lifecycleUid"]) == [at_b["mover"]["pid"]]


def server_of(cli: Cli) -> list[str]:
    record = json.loads((cli.root / ".cotal/mesh.json").read_text())
    return [record["server"], "--creds", record["creds"]]


def failing_destination(b: Cli, a: Cli, point: str) -> tuple[str, list[str]]:
    """B's manager again, now dying (or its resume's process dying) at `point`, trusting A:
    its instance id and the broker arguments it runs on."""
    server = server_of(b)
    b.run("down")
    b.run("up", "--detach", "--server", *server, env={"COTAL_FAILPOINT": point})
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    return b.json("status")["instanceId"], server


async def test_a_move_whose_destination_manager_died_after_its_claim_is_finished_by_a_rerun(
    two_roots: tuple[Cli, Cli],
) -> None:
    a, b = two_roots
    mover = a.json(
        "spawn", "mover", "--agent", "scribe", "--cwd", str(seat_repo(a, "mover")),
        "--prompt", f"Remember the phrase {PHRASE}.",
    )  # fmt: skip
    # B's manager dies once its own resume of the offer has claimed custody of the seat.
    to_b, server = failing_destination(b, a, "resume.after-custody-claim:manager")
    died = a.run("move", "mover", "--to", to_b, "--json", check=False, timeout=120)
    # Told as soon as B's lease is gone, not after the whole offer timeout; the seat is not
    # started at A, since B may own it now.
    message = refused(died, "move-incomplete")
    assert "lease is gone" in message and "wait sealed" in message
    assert processes_mentioning(mover["lifecycleUid"]) == []
    assert [r["name"] for r in a.ps()] == []

    b.run("up", "--detach", "--server", *server)
    done = a.json("move", "mover", "--to", to_b)
    assert [s["lifecycleUid"] for s in done["seats"]] == [mover["lifecycleUid"]]
    at_b = {r["name"]: r for r in b.ps()}
    assert at_b["mover"]["sessionId"] == mover["sessionId"]
    assert processes_mentioning(mover["lifecycleUid"]) == [at_b["mover"]["pid"]]
    reply = b.json("send", "mover", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}.", reply
    assert not (a.root / ".cotal/maintenance/v1/journal.json").exists()


async def test_a_seats_message_sent_while_the_move_holds_its_recipient_arrives_there(
    two_roots: tuple[Cli, Cli],
) -> None:
    """The move's command dies past the fence (the seat is cut, held by the move); a seat of
    the source tells it a phrase then; the rerun finishes the move and the moved seat, now at
    the destination, has the message, from its sender, exactly once."""
    a, b = two_roots
    mover = a.json(
        "spawn", "mover", "--agent", "scribe", "--cwd", str(seat_repo(a, "mover")),
    )  # fmt: skip
    a.json("spawn", "teller", "--agent", "scribe", "--allow-send", "mover")
    to_b = b.json("spawn", "stay_b", "--agent", "scribe")["instanceId"]
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    died = a.run(
        "move", "mover", "--to", to_b, "--json", check=False,
        env={"COTAL_FAILPOINT": "cut.after-cut-committed"},
    )  # fmt: skip
    assert died.returncode != 0 and "Traceback" not in died.stderr
    assert processes_mentioning(mover["lifecycleUid"]) == []
    told = a.json("send", "teller", "Tell mover: remember the phrase held-in-move-8", "--wait")
    assert told["reply"] == "Told mover: delivered."

    a.json("move", "mover", "--to", to_b)
    at_b = {r["name"]: r for r in b.ps()}
    assert processes_mentioning(mover["lifecycleUid"]) == [at_b["mover"]["pid"]]
    # The held message is the moved seat's first turn there; the question waits behind it.
    reply = b.json("send", "mover", "what was the phrase?", "--wait")["reply"]
    assert reply == "The phrase is held-in-move-8, from teller.", reply
    received = [
        json.loads(line)
        for line in b.run("logs", "mover", "--json").stdout.splitlines()
        if line.startswith("{") and '"delivery.received"' in line
    ]
    assert [e["sender"] for e in received].count("teller") == 1, received


async def test_a_move_after_a_sealed_cut_of_another_seat_refuses_before_the_fence(
    two_roots: tuple[Cli, Cli],
) -> None:
    """Some, then a move: the sealed cut waiting in A is not the move's, so the move refuses by
    name before anything is fenced, and the seat runs on as it was."""
    a, b = two_roots
    mover = a.json(
        "spawn", "mover", "--agent", "scribe", "--cwd", str(seat_repo(a, "mover")),
        "--prompt", f"Remember the phrase {PHRASE}.",
    )  # fmt: skip
    a.json("spawn", "kept", "--agent", "scribe", "--cwd", str(seat_repo(a, "kept")))
    sealed = a.json("down", "--preserve-state", "--seat", "kept")
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    to_b = b.json("status")["instanceId"]
    out = a.run("move", "mover", "--to", to_b, "--json", check=False, timeout=120)
    assert f"cut {sealed['attemptId']} is sealed and waiting" in refused(out, "sealed-cut-waiting")
    [row] = a.ps()
    assert (row["name"], row["pid"], row["state"]) == ("mover", mover["pid"], "running")
    assert b.ps() == []
    reply = a.json("send", "mover", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}.", reply


async def test_a_destination_whose_clock_nobody_vouches_for_refuses_at_the_probe(
    two_roots: tuple[Cli, Cli],
) -> None:
    """B's clock would refuse its admission (`clock-unsynchronized`): asked at the probe, so
    the seat is never stopped for a move that could not land."""
    a, b = two_roots
    mover = a.json("spawn", "mover", "--agent", "scribe", "--cwd", str(seat_repo(a, "mover")))
    server = server_of(b)
    b.run("down")
    # The test hook stands in for B's kernel saying its clock is not kept in step.
    b.run("up", "--detach", "--server", *server, env={"COTAL_TEST_CLOCK_STATUS": "unsynchronized"})
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    to_b = b.json("status")["instanceId"]
    out = a.run("move", "mover", "--to", to_b, "--json", check=False, timeout=120)
    message = refused(out, "clock-unsynchronized")
    assert f"destination {to_b}'s clock is not synchronized" in message
    assert "nothing was fenced" in message
    [row] = a.ps()
    assert (row["name"], row["pid"], row["state"]) == ("mover", mover["pid"], "running")
    assert b.ps() == []
