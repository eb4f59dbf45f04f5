"""Duplicates are remembered for the horizon (issue 38, item 3): a turn that runs again has its
sends dropped after a broker restart, after a whole cut in place, and after a resume on a broker
that shares nothing with the source, where the broker's own duplicate window has forgotten the
ids (a message the DM trim removed is gone from the window after a restart; another broker
never saw them). Real brokers, a real daemon, real scribe seats.

Each case runs the same turn: seat `a` tells `b` two phrases, then stalls (`#slow-after-tell`)
on its first delivery; `b` answers both and acknowledges them; the DM trim then removes the first
(the second stays, as every subject's last message does). The turn then runs again and makes
both sends again under the same ids: each must be answered as made and published nowhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from manager.broker.retention import trim_acknowledged
from manager.checkpoint.reader import read_seat_checkpoint
from protocol import names
from protocol.checkpoint import SENT_FILE
from protocol.meshcall import send_message_id
from protocol.sentledger import decode_sent
from tests.cluster import free_ports
from tests.conftest import Cli, cotal_env
from tests.gitrepo import committed_repo
from tests.helpers import (
    ask,
    broker,
    dm_messages,
    ps_row,
    seat_events,
    stop_broker,
    trusting,
    wait_until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PHRASES = ["remember the phrase first-sent-1", "remember the phrase second-sent-2"]
TURN = f"Tell b: {PHRASES[0]}\nTell b: {PHRASES[1]}\n#slow-after-tell:60000"


def _from_a(cli: Cli) -> list[dict[str, object]]:
    return [e for e in seat_events(cli, "b", "delivery.received") if e["sender"] == "a"]


async def _sent_answered_and_trimmed(cli: Cli, repo: Path) -> tuple[str, list[str]]:
    """`a`'s turn made both sends, `b` answered and acknowledged both, and the trim removed the
    first from the stream: the uid of `a` and the two send ids."""
    cli.json("spawn", "b", "--cwd", str(repo))
    a = cli.json("spawn", "a", "--cwd", str(repo), "--allow-send", "b")
    inbound = cli.json("send", "a", TURN)["id"]
    ids = [send_message_id(a["lifecycleUid"], inbound, n) for n in (0, 1)]
    await wait_until(lambda: len(seat_events(cli, "a", "mesh.sent")) == 2, timeout=30)
    assert [e["id"] for e in seat_events(cli, "a", "mesh.sent")] == ids
    b_uid = ps_row(cli, "b")["lifecycleUid"]
    durable = names.dm_durable("local", "b", b_uid)
    async with broker(cli.root) as js:
        with anyio.fail_after(60):
            while True:
                info = await js.consumer_info("DM_main", durable)
                if len(_from_a(cli)) == 2 and info.num_pending == info.num_ack_pending == 0:
                    break
                await anyio.sleep(0.2)
        assert await trim_acknowledged(js, "main") >= 1
    held = await dm_messages(cli, "b", "a")
    assert [body["text"] for body, _ in held] == [PHRASES[1]]
    return a["lifecycleUid"], ids


async def _run_again_and_dropped(cli: Cli, ids: list[str], held: list[str]) -> None:
    """The turn ran again: both sends answered as made and none published; `b`'s inbox from
    `a` holds just `held`."""
    await wait_until(
        lambda: len(seat_events(cli, "a", "mesh.duplicate_dropped")) == 2, timeout=120, every=0.3
    )
    dropped = seat_events(cli, "a", "mesh.duplicate_dropped")
    assert [(e["id"], e["kind"]) for e in dropped] == [(i, "send") for i in ids]
    assert [body["text"] for body, _ in await dm_messages(cli, "b", "a")] == held


async def test_a_broker_restart_forgets_nothing_the_ledger_holds(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    store = tmp_path / "broker"
    argv = [sys.executable, "-m", "manager.cli", "broker", "serve", "--store-dir", str(store)]
    argv += ["--port", str(port), "--json"]

    def serve() -> tuple[subprocess.Popen[str], dict[str, str]]:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cotal_env()
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        return proc, json.loads(line)

    stop = stop_broker

    cli = Cli(tmp_path / "ws")
    cli.root.mkdir()
    repo = committed_repo(cli.root / "repo")
    proc, info = serve()
    try:
        cli.run("up", "--detach", "--server", info["url"], "--creds", info["creds"])
        _uid, ids = await _sent_answered_and_trimmed(cli, repo)

        # The broker restarts on its store: the first send's id left its duplicate window with
        # the message the trim removed.
        stop(proc)
        proc, again = serve()
        assert again["url"] == info["url"] and again["creds"] == info["creds"]
        # The manager is back on the broker: b answers from what it was told.
        assert ask(cli, "b", "what was the phrase?") == "The phrase is second-sent-2, from a."

        # a's harness dies mid-turn: its message comes again and the turn sends both again.
        os.kill(ps_row(cli, "a")["pid"], signal.SIGKILL)
        await _run_again_and_dropped(cli, ids, [PHRASES[1]])
        assert len(_from_a(cli)) == 2
    finally:
        cli.run("down", check=False)
        stop(proc)


async def test_a_whole_cut_in_place_forgets_nothing_the_ledger_holds(cli: Cli) -> None:
    repo = committed_repo(cli.root / "repo")
    cli.run("up", "--detach")
    try:
        _uid, ids = await _sent_answered_and_trimmed(cli, repo)
        # The whole cut stops the embedded broker; the resume in place starts it again.
        cut = json.loads(
            cli.run("down", "--preserve-state", "--drain-timeout", "1", "--json").stdout
        )
        assert [m["name"] for m in cut["midTurn"]] == ["a"], cut
        cli.json("up", "--restore", cut["checkpointDir"])
        # The message a's stop released waits out its ack wait at the restarted broker.
        await _run_again_and_dropped(cli, ids, [PHRASES[1]])
        # b's log holds the two it was given before the cut, and nothing since.
        assert len(_from_a(cli)) == 2
    finally:
        cli.run("down", check=False)


async def test_a_resume_on_a_broker_that_shares_nothing_carries_the_ledger(
    tmp_path: Path, cli: Cli
) -> None:
    repo = committed_repo(cli.root / "repo")
    cli.run("up", "--detach")
    uid, ids = await _sent_answered_and_trimmed(cli, repo)
    cut = json.loads(cli.run("down", "--preserve-state", "--drain-timeout", "1", "--json").stdout)
    assert [m["name"] for m in cut["midTurn"]] == ["a"], cut
    attempt = Path(cut["checkpointDir"])
    state = read_seat_checkpoint(attempt / "a").space_state
    assert state is not None and state.sent is not None and state.sent.entries == 2
    carried = decode_sent((attempt / "a" / SENT_FILE).read_bytes(), state.sent)
    assert [(e.id, e.kind) for e in carried] == sorted((i, "send") for i in ids)
    b_state = read_seat_checkpoint(attempt / "b").space_state
    assert b_state is not None and b_state.sent is None

    # Host A is gone whole; the destination starts a broker of its own, which never saw a send.
    copy = tmp_path / "carried" / attempt.name
    copy.parent.mkdir()
    os.rename(attempt, copy)
    os.rename(cli.root, cli.root.with_name("ws.src"))
    cli.root.mkdir()
    out = cli.run("up", "--restore", str(copy), *trusting(copy), "--json")
    try:
        assert json.loads(out.stdout)["sharedBroker"] is False
        assert "a: 2 sent id(s) carried into this broker's sent ledger" in out.stderr
        await _run_again_and_dropped(cli, ids, [])
        assert _from_a(cli) == []
        assert ps_row(cli, "a")["lifecycleUid"] == uid
    finally:
        cli.run("down", check=False)
