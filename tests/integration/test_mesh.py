"""The running mesh end to end: real broker, real daemon, real scribe seats."""

from __future__ import annotations

import json
import os
import signal
import stat

import anyio
import pytest
from nats.js.errors import NotFoundError

from manager.broker.dm import new_message_id, publish_dm
from protocol import names
from protocol.instant import now_iso
from protocol.messages import DirectMessage
from protocol.names import LIFECYCLE_UID_RE
from tests.conftest import Cli
from tests.helpers import broker, pid_alive, processes_mentioning, wait_gone, wait_until

pytestmark = pytest.mark.anyio


async def _durable_exists(cli: Cli, name: str, uid: str) -> bool:
    async with broker(cli.root) as js:
        try:
            await js.consumer_info("DM_main", f"dm_local-{name}-{uid}")
            return True
        except NotFoundError:
            return False


async def test_spawn_ps_durable_send_rm(mesh: Cli) -> None:
    row = mesh.json(
        "spawn", "alice", "--agent", "scribe", "--prompt", "Remember the phrase juniper-ledger-41"
    )
    assert row["name"] == "alice" and row["state"] == "running" and row["continuity"] == "exact"
    uid = row["lifecycleUid"]
    assert LIFECYCLE_UID_RE.fullmatch(uid)

    [listed] = mesh.ps()
    assert (
        listed["lifecycleUid"] == uid
        and listed["pid"] == row["pid"]
        and listed["sessionId"] == row["sessionId"]
    )

    assert await _durable_exists(mesh, "alice", uid)
    async with broker(mesh.root) as js:
        info = await js.consumer_info("DM_main", f"dm_local-alice-{uid}")
    assert info.config.ack_policy == "explicit"
    assert info.config.filter_subject == "cotal.main.inst.local.alice.>"

    pointer = mesh.root / ".cotal" / "sessions" / "scribe" / f"alice-{uid}.json"
    assert stat.S_IMODE(os.lstat(pointer).st_mode) == 0o600
    assert json.loads(pointer.read_text()) == {
        "version": 1,
        "sessionId": row["sessionId"],
        "status": "running",
    }

    reply = mesh.json("send", "alice", "what was the phrase?", "--wait")
    assert reply["reply"] == "The phrase is juniper-ledger-41."
    assert reply["attempts"] == 1

    removed = mesh.json("rm", "alice")
    assert removed["lifecycleUid"] == uid
    assert not await _durable_exists(mesh, "alice", uid)
    assert not pointer.exists()
    assert mesh.ps() == []
    await wait_gone([row["pid"]])


async def test_spawn_refusals_change_nothing(mesh: Cli) -> None:
    mesh.json("spawn", "bob", "--agent", "scribe")
    dup = mesh.run("spawn", "bob", "--agent", "scribe", check=False)
    assert dup.returncode == 2
    assert "a seat named 'bob' already exists" in dup.stderr and "cotal rm bob" in dup.stderr
    bad = mesh.run("spawn", "no-dashes", check=False)
    assert bad.returncode == 2 and "is not a safe label" in bad.stderr
    unknown = mesh.run("spawn", "carol", "--agent", "nope", check=False)
    assert unknown.returncode == 2 and "unknown agent 'nope'" in unknown.stderr
    empty = mesh.run("spawn", "dave", "--agent", "scribe", "--prompt=-rf", check=False)
    assert empty.returncode == 2 and "starting with '-' or '@'" in empty.stderr
    # The operator's own address on the broker is not a seat's to take.
    operator = mesh.run("spawn", "operator", "--agent", "scribe", "--json", check=False)
    assert operator.returncode == 2
    assert json.loads(operator.stderr.splitlines()[-1])["code"] == "reserved-name"
    assert [r["name"] for r in mesh.ps()] == ["bob"]


async def test_error_turn_stays_unacked_and_is_redelivered(mesh: Cli) -> None:
    row = mesh.json("spawn", "erin", "--agent", "scribe")
    reply = mesh.json(
        "send",
        "erin",
        "#error-once:t1 remember the phrase amber-owl-7",
        "--wait",
        "--timeout",
        "30",
    )
    # The first delivery ended in error and was not acknowledged; the broker redelivered it.
    assert reply["attempts"] == 2
    assert reply["reply"] == "Noted: amber-owl-7."
    async with broker(mesh.root) as js:
        info = await js.consumer_info("DM_main", f"dm_local-erin-{row['lifecycleUid']}")
    assert info.num_redelivered == 0 and info.num_ack_pending == 0
    assert info.delivered.stream_seq == info.ack_floor.stream_seq
    log = (mesh.root / ".cotal" / "logs" / "manager.log").read_text()
    assert '"event": "delivery.retained"' in log and '"status": "error"' in log


async def test_killed_seat_restarts_into_the_same_session(mesh: Cli) -> None:
    row = mesh.json(
        "spawn", "fay", "--agent", "scribe", "--prompt", "Remember the phrase quartz-heron-12"
    )
    os.kill(row["pid"], signal.SIGKILL)

    def restarted() -> bool:
        rows = mesh.ps()
        return len(rows) == 1 and rows[0]["state"] == "running" and rows[0]["restarts"] == 1

    await wait_until(restarted, timeout=20, every=0.1)
    [now] = mesh.ps()
    assert now["sessionId"] == row["sessionId"]
    assert now["lifecycleUid"] == row["lifecycleUid"]
    assert now["pid"] != row["pid"]
    assert (
        mesh.json("send", "fay", "what was the phrase?", "--wait")["reply"]
        == "The phrase is quartz-heron-12."
    )


async def test_a_message_for_a_killed_seats_last_pull_is_released_not_held_for_ack_wait(
    mesh: Cli,
) -> None:
    row = mesh.json("spawn", "hal", "--agent", "scribe")
    durable = f"dm_local-hal-{row['lifecycleUid']}"
    async with broker(mesh.root) as js:
        with anyio.fail_after(10):
            while True:
                if (await js.consumer_info("DM_main", durable)).num_waiting > 0:
                    break
                await anyio.sleep(0.02)
        # The bridge's request is still open at the broker while its seat dies: the message
        # published now goes to it (or, once it expired, to the restarted seat's own request).
        os.kill(row["pid"], signal.SIGKILL)
        dm = DirectMessage(
            id=new_message_id(),
            sender=names.principal(names.SEAT_OWNER, names.OPERATOR_ACTOR),
            recipient=names.principal(names.SEAT_OWNER, "hal"),
            text="remember the phrase basalt-finch-3",
            sent_at=now_iso(),
        )
        seq = await publish_dm(js, "main", dm)
        # Stranded on the dead request, the message would hold the inbox (one unacknowledged
        # message at a time) for ack_wait; released, the restarted seat answers it at once.
        assert names.ACK_WAIT_S >= 60
        with anyio.fail_after(30):
            while True:
                info = await js.consumer_info("DM_main", durable)
                if info.ack_floor.stream_seq >= seq:
                    break
                await anyio.sleep(0.1)
    assert info.num_ack_pending == 0 and info.num_pending == 0
    [now] = mesh.ps()
    assert now["restarts"] == 1 and now["lifecycleUid"] == row["lifecycleUid"]
    assert (
        mesh.json("send", "hal", "what was the phrase?", "--wait")["reply"]
        == "The phrase is basalt-finch-3."
    )


async def test_down_with_a_survivor_of_a_seat_names_it_and_stops_the_rest(mesh: Cli) -> None:
    kept = mesh.json("spawn", "ida", "--agent", "scribe")
    other = mesh.json("spawn", "jon", "--agent", "scribe")
    daemon = mesh.json("status")["pid"]
    # A process of ida's lifecycle that left her process group: her stop cannot be proven.
    survivor = await anyio.open_process(
        ["sleep", "300"], env={"COTAL_LIFECYCLE_UID": kept["lifecycleUid"], "PATH": "/bin"}
    )
    try:
        out = mesh.run("down", check=False)
        assert out.returncode != 0 and "internal error" not in out.stderr, out.stderr
        assert (
            f"seat ida (pid {kept['pid']}) exited but processes of its lifecycle are still "
            f"alive: [{survivor.pid}]" in out.stderr
        ), out.stderr
        assert f"kill {survivor.pid}, then retry" in out.stderr
        await wait_gone([kept["pid"], other["pid"], daemon])
    finally:
        survivor.kill()
        await survivor.wait()
    # The manager still exited; with the survivor gone the rerun finishes the down.
    mesh.run("down")
    assert not (mesh.root / ".cotal" / "mesh.json").exists()


async def test_fourth_crash_in_the_window_retires_the_seat(mesh: Cli) -> None:
    row = mesh.json("spawn", "gus", "--agent", "scribe")
    uid = row["lifecycleUid"]
    # A message that crashes the harness is redelivered after each restart: crash 1..3, when it
    # reaches the delivery cap (3) and moves to dead letters; the next one is crash 4.
    mesh.json("send", "gus", "#crash")
    mesh.json("send", "gus", "#crash again")
    await wait_until(lambda: mesh.ps() == [], timeout=30, every=0.2)
    log = (mesh.root / ".cotal" / "logs" / "manager.log").read_text()
    events = [json.loads(line) for line in log.splitlines()]
    restarted = [e for e in events if e["event"] == "seat.restarted" and e["seat"] == "gus"]
    assert len(restarted) == 3
    assert all(e["session"] == row["sessionId"] for e in restarted)
    [loop] = [e for e in events if e["event"] == "seat.crash_loop"]
    assert loop["seat"] == "gus" and loop["crashes"] == 4
    assert not await _durable_exists(mesh, "gus", uid)


async def test_sigkill_of_daemon_leaves_no_seat_and_down_leaves_no_process(mesh: Cli) -> None:
    a = mesh.json("spawn", "h1", "--agent", "scribe")
    b = mesh.json("spawn", "h2", "--agent", "scribe", "--cwd", str(mesh.root))
    daemon_pid = mesh.json("status")["pid"]
    os.kill(daemon_pid, signal.SIGKILL)
    await wait_gone([daemon_pid, a["pid"], b["pid"]])
    down = mesh.run("down")
    assert "embedded broker pid" in down.stdout and "proven gone" in down.stdout
    await wait_until(lambda: processes_mentioning(str(mesh.root)) == [], every=0.1)
    assert not pid_alive(daemon_pid)


async def test_down_stops_everything_and_deletes_durables(mesh: Cli) -> None:
    rows = [mesh.json("spawn", f"s{i}", "--agent", "scribe") for i in range(3)]
    record = json.loads((mesh.root / ".cotal" / "mesh.json").read_text())
    down = mesh.json("down")
    assert sorted(s["name"] for s in down["seats"]) == ["s0", "s1", "s2"]
    assert down["manager"] == record["manager"]["pid"]
    assert down["broker"] == record["embeddedBroker"]["pid"]
    await wait_gone([r["pid"] for r in rows] + [down["manager"], down["broker"]], timeout=1)
    assert processes_mentioning(str(mesh.root)) == []
    assert not (mesh.root / ".cotal" / "mesh.json").exists()
    again = mesh.run("down", check=False)
    assert again.returncode == 0 and again.stdout == f"nothing is up in {mesh.root.resolve()}\n"
