"""Dead letters travel with a cut instead of blocking it (issue 38, item 7): a seat's dead
letters are carried beside its inbox, kept as dead letters (never delivered) where it resumes,
on the same broker and on one that shares nothing with the source, and `cotal inbox SEAT
--redeliver-all` puts every one back into its inbox, in order. Real brokers, a real daemon, real
scribe seats."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest

from manager.checkpoint.reader import read_seat_checkpoint
from protocol import names
from protocol.checkpoint import DEAD_LETTER_FILE
from protocol.deadletter import decode_dead_letters
from protocol.messages import decode_dm
from tests.conftest import Cli, SharedBroker
from tests.gitrepo import git, init_repo, write
from tests.helpers import broker, signer_key, trusting, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

# Each fails its first delivery, which is the cap, so each is a dead letter at once; put back,
# each is its second delivery and is answered.
POISON = [f"#error-until:1 remember the phrase dead-{n}" for n in ("one", "two", "three")]


def _row(cli: Cli, name: str) -> dict[str, Any]:
    [row] = [r for r in cli.ps() if r["name"] == name]
    return row


def _commit(root: Path) -> None:
    init_repo(root)
    write(root / "README.md", "# dead letters travel\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")


def _with_dead_letters(cli: Cli) -> tuple[dict[str, Any], list[str]]:
    """A running mesh whose seat `d` holds the three POISON messages as dead letters, oldest
    first; the seat and the message ids in the order they were sent."""
    _commit(cli.root)
    (cli.root / "cotal.toml").write_text("[delivery]\nmax_deliveries = 1\n")
    cli.run("up", "--detach")
    row = cli.json("spawn", "d", "--agent", "scribe")
    ids = [cli.json("send", "d", text)["id"] for text in POISON]
    return row, ids


def _transcript_ids(root: Path, row: dict[str, Any]) -> list[str]:
    store = root / ".cotal" / "sessions" / "scribe" / f"d-{row['lifecycleUid']}.store"
    lines = (store / f"{row['sessionId']}.jsonl").read_bytes().splitlines()
    return [
        json.loads(x)["id"]
        for x in lines
        if b'"role":"assistant"' in x and json.loads(x).get("id") is not None
    ]


async def _dead_ids_at(root: Path) -> int:
    async with broker(root) as js:
        info = await js.stream_info("DEAD_main", subjects_filter="cotal.main.dead.>")
        return sum((info.state.subjects or {}).values())


async def test_dead_letters_travel_to_a_broker_that_shares_nothing_and_come_back_in_order(
    tmp_path: Path, cli: Cli
) -> None:
    row, ids = _with_dead_letters(cli)
    await wait_until(lambda: _row(cli, "d")["deadLetters"] == 3, timeout=90, every=0.2)
    before = cli.json("inbox", "d")["letters"]
    assert [x["messageId"] for x in before] == ids

    # The cut is not refused: the dead letters go into the checkpoint beside the inbox.
    cut = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert cut["journal"] == "ready" and cut["failures"] == [], cut
    attempt = Path(cut["checkpointDir"])
    state = read_seat_checkpoint(attempt / "d").space_state
    assert state is not None and state.dead_letters is not None
    assert state.dead_letters.letters == 3
    subject = f"cotal.main.dead.local.d.{row['lifecycleUid']}"
    carried = decode_dead_letters(
        (attempt / "d" / DEAD_LETTER_FILE).read_bytes(), state.dead_letters, subject
    )
    assert [m.seq for m in carried] == [x["id"] for x in before]
    assert [decode_dm(m.data()).text for m in carried] == POISON
    copy = tmp_path / "carried" / attempt.name
    shutil.copytree(attempt, copy)

    # Host A goes away whole; the destination starts a broker of its own.
    os.rename(cli.root, cli.root.with_name("ws.src"))
    cli.root.mkdir()
    out = cli.run("up", "--restore", str(copy), *trusting(copy), "--json")
    assert json.loads(out.stdout)["sharedBroker"] is False
    assert "d: 3 dead letter(s) carried into this broker's dead letters (0 already here)" in (
        out.stderr
    )

    # Still dead letters there, as they were: none delivered, none dropped.
    after = cli.json("inbox", "d")
    assert after["lifecycleUid"] == row["lifecycleUid"] and after["count"] == 3
    keep = ("messageId", "subject", "sender", "deliveries", "reason", "deadAt", "head", "bytes")
    assert [{k: x[k] for k in keep} for x in after["letters"]] == [
        {k: x[k] for k in keep} for x in before
    ]
    assert _row(cli, "d")["deadLetters"] == 3
    async with broker(cli.root) as js:
        durable = names.dm_durable("local", "d", row["lifecycleUid"])
        info = await js.consumer_info("DM_main", durable)
        assert (
            info.num_pending == 0 and info.num_ack_pending == 0 and info.delivered.stream_seq == 0
        )

    # Every one back into the inbox, in the order they were set aside, and each answered.
    back = cli.json("inbox", "d", "--redeliver-all")
    assert back["count"] == 3 and back["truncated"] is False
    assert [x["messageId"] for x in back["letters"]] == ids
    assert [x["id"] for x in back["letters"]] == [x["id"] for x in after["letters"]]
    assert [x["delivery"] for x in back["letters"]] == [2, 2, 2]
    seqs = [x["seq"] for x in back["letters"]]
    assert seqs == sorted(seqs)
    last = cli.json("send", "d", "what was the phrase", "--wait", "--timeout", "60")
    assert last["reply"] == "The phrase is dead-three."
    moved = _row(cli, "d")
    assert moved["deadLetters"] == 0 and await _dead_ids_at(cli.root) == 0
    assert _transcript_ids(cli.root, moved)[-4:] == [*ids, last["id"]]
    assert cli.json("inbox", "d", "--redeliver-all") == {
        "name": "d",
        "lifecycleUid": row["lifecycleUid"],
        "count": 0,
        "letters": [],
        "truncated": False,
    }
    cli.run("down")


async def test_a_resume_on_the_same_broker_keeps_the_dead_letters_once(cli: Cli) -> None:
    row, ids = _with_dead_letters(cli)
    await wait_until(lambda: _row(cli, "d")["deadLetters"] == 3, timeout=90, every=0.2)
    before = cli.json("inbox", "d")["letters"]
    cut = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert cut["journal"] == "ready", cut
    out = cli.run("up", "--restore", cut["checkpointDir"], "--json")
    assert "d: 3 dead letter(s) already at this broker; kept" in out.stderr
    after = cli.json("inbox", "d")
    assert after["count"] == 3 and after["letters"] == before
    assert [x["messageId"] for x in after["letters"]] == ids
    assert _row(cli, "d")["deadLetters"] == 3 and await _dead_ids_at(cli.root) == 3
    cli.run("down")


async def test_a_move_carries_the_dead_letters_and_redeliver_all_returns_them_there(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    a, b = Cli(tmp_path / "a"), Cli(tmp_path / "b")
    for cli in (a, b):
        cli.root.mkdir()
        _commit(cli.root)
        (cli.root / "cotal.toml").write_text("[delivery]\nmax_deliveries = 1\n")
        cli.run("up", "--detach", "--server", shared_broker.url, "--creds", shared_broker.creds)
    try:
        row = a.json("spawn", "d", "--agent", "scribe")
        ids = [a.json("send", "d", text)["id"] for text in POISON]
        await wait_until(lambda: _row(a, "d")["deadLetters"] == 3, timeout=90, every=0.2)
        before = a.json("inbox", "d")["letters"]
        to_b = b.json("status")["manager"]["instanceId"]
        b.run("trust", "add", signer_key(a.root), "--name", "host-a")

        # Not refused: the seat moves with its dead letters, which stay dead letters there.
        moved = a.json("move", "d", "--to", to_b)
        assert [s["lifecycleUid"] for s in moved["seats"]] == [row["lifecycleUid"]]
        assert [r["name"] for r in a.ps()] == []
        there = b.json("inbox", "d")
        assert there["count"] == 3 and there["letters"] == before
        await wait_until(lambda: _row(b, "d")["deadLetters"] == 3, timeout=30, every=0.2)

        back = b.json("inbox", "d", "--redeliver-all")
        assert [x["messageId"] for x in back["letters"]] == ids and back["count"] == 3
        last = b.json("send", "d", "what was the phrase", "--wait", "--timeout", "60")
        assert last["reply"] == "The phrase is dead-three."
        assert _transcript_ids(b.root, _row(b, "d"))[-4:] == [*ids, last["id"]]
        assert _row(b, "d")["deadLetters"] == 0
    finally:
        for cli in (a, b):
            cli.run("down", check=False)


async def test_a_crash_between_a_burial_and_its_settlement_leaves_one_dead_letter_anywhere(
    tmp_path: Path, cli: Cli
) -> None:
    """The window forced: the manager dies after the dead letter is written and before the
    message is terminated in the inbox, so the message is both for a moment. The restarted
    manager releases it, it comes back past its cap, is found among the dead letters and is
    terminated, not buried again; then it travels as that one dead letter to a broker that
    shares nothing with the source, where it is neither delivered nor buried a second time.
    (A cut reading the inbox inside the window is tests/integration/test_dead_letter_window.py.)"""
    _commit(cli.root)
    (cli.root / "cotal.toml").write_text("[delivery]\nmax_deliveries = 1\n")
    cli.run("up", "--detach", env={"COTAL_FAILPOINT": "delivery.buried-before-terminate"})
    row = cli.json("spawn", "d", "--agent", "scribe")
    pid = int(json.loads((cli.root / ".cotal" / "mesh.json").read_text())["manager"]["pid"])
    sent = cli.json("send", "d", POISON[0])["id"]
    await wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=60, every=0.2)
    assert await _dead_ids_at(cli.root) == 1
    cli.run("up", "--detach")
    durable = names.dm_durable("local", "d", row["lifecycleUid"])

    async with broker(cli.root) as js:
        for _ in range(300):
            info = await js.consumer_info("DM_main", durable)
            if not info.num_ack_pending:
                break
            await anyio.sleep(0.2)
        assert info.num_ack_pending == 0 and info.num_pending == 0, info
        assert info.ack_floor.stream_seq > 0, info
    assert await _dead_ids_at(cli.root) == 1
    log = (cli.root / ".cotal" / "logs" / "manager.log").read_text()
    assert '"delivery.already_dead_lettered"' in log
    await wait_until(lambda: _row(cli, "d")["deadLetters"] == 1, timeout=30, every=0.2)

    cut = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    assert cut["journal"] == "ready" and cut["failures"] == [], cut
    attempt = Path(cut["checkpointDir"])
    state = read_seat_checkpoint(attempt / "d").space_state
    assert state is not None and state.dead_letters is not None
    assert state.dead_letters.letters == 1 and state.messages == 0, state
    copy = tmp_path / "carried" / attempt.name
    shutil.copytree(attempt, copy)
    os.rename(cli.root, cli.root.with_name("ws.src"))
    cli.root.mkdir()
    cli.run("up", "--restore", str(copy), *trusting(copy), "--json")
    # A turn answered after it: had the message travelled as mail too, it ran before this.
    cli.json("send", "d", "what was the phrase", "--wait", "--timeout", "60")
    after = cli.json("inbox", "d")
    assert [x["messageId"] for x in after["letters"]] == [sent] and after["count"] == 1
    assert await _dead_ids_at(cli.root) == 1
    cli.run("down")
