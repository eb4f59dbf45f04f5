"""The seat verbs end to end (real broker, real daemon, scribe seats): `stop` keeps a seat,
`start` brings it back as it was, `restart` is the two in one, `rm` deprovisions it, and a
stopped seat stays stopped across a manager killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from nats.js.errors import NotFoundError

from manager.broker import custody
from protocol.lifecycle import decode_seat_record
from tests.conftest import Cli
from tests.helpers import broker, pid_alive, wait_gone

pytestmark = pytest.mark.anyio

PHRASE = "Remember the phrase cedar-lantern-58"


async def _durable(cli: Cli, name: str, uid: str) -> Any:
    async with broker(cli.root) as js:
        try:
            return await js.consumer_info("DM_main", f"dm_local-{name}-{uid}")
        except NotFoundError:
            return None


async def _custody(cli: Cli, name: str, uid: str) -> dict[str, Any] | None:
    async with broker(cli.root) as js:
        kv = await js.key_value("cotal_custody_main")
        try:
            entry = await kv.get(f"local.{name}.{uid}")
        except Exception:
            return None
        if entry is None or not entry.value:
            return None
        record: dict[str, Any] = json.loads(entry.value)
        return record


def _pointer(cli: Cli, name: str, uid: str) -> Path:
    return cli.root / ".cotal" / "sessions" / "scribe" / f"{name}-{uid}.json"


def _record(cli: Cli, name: str, uid: str) -> Path:
    return cli.root / ".cotal" / "seats" / f"{name}-{uid}.json"


def _row(cli: Cli, name: str) -> dict[str, Any]:
    [row] = [r for r in cli.ps() if r["name"] == name]
    return row


def _asks_phrase(cli: Cli, name: str) -> str:
    reply: str = cli.json("send", name, "what was the phrase?", "--wait")["reply"]
    return reply


async def test_stop_keeps_the_seat_and_start_brings_it_back(mesh: Cli) -> None:
    spawned = mesh.json("spawn", "alice", "--prompt", PHRASE)
    uid, session = spawned["lifecycleUid"], spawned["sessionId"]

    stopped = mesh.json("stop", "alice")
    assert stopped["kept"] is True and stopped["state"] == "stopped"
    assert stopped["lastExit"] == "SIGTERM"
    await wait_gone([spawned["pid"]])
    # Everything that makes the seat itself stays: inbox, session, custody, record.
    assert await _durable(mesh, "alice", uid) is not None
    assert json.loads(_pointer(mesh, "alice", uid).read_text())["sessionId"] == session
    held = await _custody(mesh, "alice", uid)
    assert held is not None and held["holder"] == spawned["instanceId"]
    record = decode_seat_record(_record(mesh, "alice", uid).read_bytes(), where="test")
    assert (record.state, record.last_exit) == ("stopped", "SIGTERM")
    row = _row(mesh, "alice")
    assert (row["state"], row["pid"], row["lastExit"]) == ("stopped", None, "SIGTERM")
    wide = mesh.run("ps", "--wide").stdout.splitlines()
    assert "LAST EXIT" in wide[0] and "SIGTERM" in wide[1]

    # A message sent while it is stopped waits in its inbox.
    queued = mesh.json("send", "alice", "remember the phrase while-stopped-3")
    again = mesh.json("stop", "alice")
    assert again["alreadyStopped"] is True

    started = mesh.json("start", "alice")
    assert started["state"] == "running" and pid_alive(started["pid"])
    assert started["lifecycleUid"] == uid and started["sessionId"] == session
    assert started["restarts"] == 1 and started["pid"] != spawned["pid"]
    assert _asks_phrase(mesh, "alice") == "The phrase is while-stopped-3."
    info = await _durable(mesh, "alice", uid)
    assert info.num_pending == 0 and info.num_ack_pending == 0
    assert info.delivered.stream_seq >= queued["seq"]
    assert started["alreadyRunning"] is False
    # Starting a running seat has nothing to do.
    same = mesh.json("start", "alice")
    assert same["alreadyRunning"] is True and same["pid"] == started["pid"]
    assert mesh.run("start", "alice").stdout == f"alice is already running (pid {same['pid']})\n"


async def test_restart_is_stop_and_prove_then_start_in_the_same_session(mesh: Cli) -> None:
    spawned = mesh.json("spawn", "bob", "--prompt", PHRASE)
    first = mesh.json("restart", "bob")
    assert not pid_alive(spawned["pid"])
    assert (first["lifecycleUid"], first["sessionId"]) == (
        spawned["lifecycleUid"],
        spawned["sessionId"],
    )
    assert first["state"] == "running" and first["restarts"] == 1
    assert first["lastExit"] == "SIGTERM"
    second = mesh.run("restart", "bob").stdout
    assert second.startswith("restarted bob (scribe) pid ") and " restarts 2\n" in second
    row = _row(mesh, "bob")
    assert row["restarts"] == 2 and row["sessionId"] == spawned["sessionId"]
    assert not pid_alive(first["pid"])
    assert _asks_phrase(mesh, "bob") == "The phrase is cedar-lantern-58."


async def test_rm_deprovisions_a_running_or_a_stopped_seat(mesh: Cli) -> None:
    running = mesh.json("spawn", "carol")
    kept = mesh.json("spawn", "dave")
    mesh.run("stop", "dave")
    for row in (running, kept):
        name, uid = row["name"], row["lifecycleUid"]
        out = mesh.json("rm", name)
        assert out["lifecycleUid"] == uid and out["footprintDeleted"] is True
        assert await _durable(mesh, name, uid) is None
        assert await _custody(mesh, name, uid) is None
        assert not _pointer(mesh, name, uid).exists()
        assert not _record(mesh, name, uid).exists()
    await wait_gone([running["pid"], kept["pid"]])
    assert mesh.ps() == []
    gone = mesh.run("rm", "carol", check=False)
    assert gone.returncode == 2 and "no seat named 'carol'" in gone.stderr


async def test_verbs_refuse_by_name_with_the_cure(mesh: Cli) -> None:
    mesh.json("spawn", "erin")
    missing = mesh.run("start", "nobody", check=False)
    assert missing.returncode == 2
    assert missing.stderr == "cotal: no seat named 'nobody'; see `cotal ps`\n"
    mesh.run("stop", "erin")
    # A cut carries running seats: a stopped one is the operator's decision first.
    init = mesh.run("down", "--preserve-state", check=False)
    assert init.returncode == 2, init.stderr
    assert "erin" in init.stderr and "`cotal start erin` or `cotal rm erin`" in init.stderr
    assert "nothing was stopped" in init.stderr
    assert mesh.json("status")["state"] == "active"
    assert _row(mesh, "erin")["state"] == "stopped"


async def test_a_stopped_seat_stays_stopped_across_a_manager_killed(mesh: Cli) -> None:
    keep = mesh.json("spawn", "frank", "--prompt", PHRASE)
    live = mesh.json("spawn", "gina")
    mesh.run("stop", "frank")
    daemon = mesh.json("status")["pid"]
    os.kill(daemon, signal.SIGKILL)
    await wait_gone([daemon, keep["pid"], live["pid"]], timeout=20)
    mesh.run("up", "--detach")
    try:
        with anyio.fail_after(60):
            while True:
                rows = {r["name"]: r for r in mesh.ps()}
                if rows.get("gina", {}).get("state") == "running":
                    break
                await anyio.sleep(0.2)
        frank = rows["frank"]
        assert frank["state"] == "stopped" and frank["pid"] is None
        assert frank["lifecycleUid"] == keep["lifecycleUid"]
        assert frank["lastExit"] == "SIGTERM" and frank["reason"] is None
        record = decode_seat_record(
            _record(mesh, "frank", keep["lifecycleUid"]).read_bytes(), where="test"
        )
        assert record.state == "stopped"
        # The successor's own stop of it changed nothing, and a start brings it back as it was.
        started = mesh.json("start", "frank")
        assert started["sessionId"] == keep["sessionId"]
        assert started["lifecycleUid"] == keep["lifecycleUid"]
        assert _asks_phrase(mesh, "frank") == "The phrase is cedar-lantern-58."
    finally:
        mesh.run("down", check=False)


async def test_a_harness_that_exits_during_start_is_refused_with_its_code_and_log(
    mesh: Cli,
) -> None:
    spawned = mesh.json("spawn", "dana", "--prompt", PHRASE)
    uid, session = spawned["lifecycleUid"], spawned["sessionId"]
    mesh.json("stop", "dana")
    # A damaged transcript: the harness refuses the session (exit 2) right after it starts,
    # before it answers the manager's state query.
    store = mesh.root / ".cotal" / "sessions" / "scribe" / f"dana-{uid}.store"
    (store / f"{session}.jsonl").write_bytes(b"not a session header\n")
    log = mesh.root / ".cotal" / "logs" / f"seat-dana-{uid}.log"

    # Whether the manager sees the output end or the exit first, the refusal is the same.
    for _ in range(3):
        proc = mesh.run("start", "dana", check=False)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (
            f"cotal: seat dana exited before it was ready (code 2); read {log}\n"
        ), proc.stderr
    assert "scribe: transcript" in log.read_text() and "is malformed" in log.read_text()


async def test_a_teardown_deletes_custody_only_while_this_instance_holds_it(mesh: Cli) -> None:
    row = mesh.json("spawn", "erin")
    uid, mine = row["lifecycleUid"], row["instanceId"]
    async with broker(mesh.root) as js:
        kv = await js.key_value("cotal_custody_main")
        before = await custody.read(kv, "erin", uid)
        assert before is not None and before.record.holder == mine
        # A seat that moved is its new holder's: a late teardown from anyone else leaves it.
        assert await custody.release(kv, "erin", uid, "z" * 31) is False
        after = await custody.read(kv, "erin", uid)
        assert after is not None and after.revision == before.revision
        assert await custody.release(kv, "erin", uid, mine) is True
        assert await custody.read(kv, "erin", uid) is None
        assert await custody.release(kv, "erin", uid, mine) is False
