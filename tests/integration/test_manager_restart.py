"""The manager survives its own death: kill -9 the daemon, start it again, and every seat is
back under its lifecycle uid, in its session, with nothing lost from its inbox."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from manager.daemon.delivery import reply_id
from protocol.lifecycle import decode_seat_record
from tests.conftest import Cli
from tests.gitrepo import committed_repo
from tests.harness import mode
from tests.helpers import broker, pid_alive, refused, wait_gone, wait_until

pytestmark = pytest.mark.anyio

SEATS = 5


def nats_servers_on(store: Path) -> list[int]:
    """Every live nats-server whose config lives in `store`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"nats-server") and str(store).encode() in b" ".join(argv):
            found.append(int(entry.name))
    return sorted(found)


async def replies_to(root: Path, ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    """Every reply in the DM stream to one of `ids`, read message by message from the store."""
    found: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
    async with broker(root) as js:
        last = (await js.stream_info("DM_main")).state.last_seq
        for seq in range(1, last + 1):
            msg = await js.get_msg("DM_main", seq)
            if not msg.subject or not msg.subject.startswith("cotal.main.inst.local.operator."):
                continue
            dm = json.loads(msg.data or b"{}")
            if dm.get("inReplyTo") in found:
                found[dm["inReplyTo"]].append(dm)
    return found


async def test_seats_come_back_after_the_manager_is_killed(mesh: Cli) -> None:
    rows = [mesh.json("spawn", f"s{i}") for i in range(SEATS)]
    for i in range(SEATS):
        reply = mesh.json("send", f"s{i}", f"remember the phrase phrase-{i}", "--wait")
        assert reply["reply"] == f"Noted: phrase-{i}."
    in_flight = {
        mesh.json("send", f"s{i}", f"work item {i} #slow:3000")["id"]: f"s{i}" for i in range(SEATS)
    }
    # ps is another process's view: polled under a deadline, as no event here can signal it.
    await wait_until(lambda: any(r["busy"] for r in mesh.ps()), timeout=30)
    daemon = mesh.json("status")["pid"]
    os.kill(daemon, signal.SIGKILL)
    # Seats die with their manager: nothing unsupervised keeps running.
    await wait_gone([daemon] + [r["pid"] for r in rows], timeout=20)
    records = sorted(p.name for p in (mesh.root / ".cotal" / "seats").iterdir())
    assert records == sorted(f"{r['name']}-{r['lifecycleUid']}.json" for r in rows)

    broker_before = json.loads((mesh.root / ".cotal" / "mesh.json").read_text())["embeddedBroker"]
    # The operator's own recovery: `cotal up` again. The broker outlived the daemon, so the new
    # manager must join it rather than start a second broker on the same store.
    up = mesh.run("up", "--detach")
    assert "reusing the embedded broker left running" in up.stderr
    record = json.loads((mesh.root / ".cotal" / "mesh.json").read_text())
    assert record["embeddedBroker"] == broker_before
    assert nats_servers_on(mesh.root / ".cotal" / "nats") == [broker_before["pid"]]
    try:
        by_name = {r["name"]: r for r in rows}
        with anyio.fail_after(60):
            while True:
                status = mesh.run("status", "--json", check=False)
                if status.returncode == 0:
                    ps = mesh.ps()
                    if len(ps) == SEATS and all(r["state"] == "running" for r in ps):
                        break
                await anyio.sleep(0.2)
        new_daemon = json.loads(status.stdout)["pid"]
        assert new_daemon == record["manager"]["pid"] and new_daemon != daemon
        for row in ps:
            before = by_name[row["name"]]
            assert row["lifecycleUid"] == before["lifecycleUid"]
            assert row["sessionId"] == before["sessionId"]
            assert row["instanceId"] == before["instanceId"]
            assert row["pid"] != before["pid"] and pid_alive(row["pid"])
            assert row["restarts"] == 1
        # The inbox is FIFO with one message in flight: each question is answered after the
        # work item the dead manager left unsettled.
        for i in range(SEATS):
            reply = mesh.json("send", f"s{i}", "What was the phrase?", "--wait", "--timeout", "90")
            assert reply["reply"] == f"The phrase is phrase-{i}."
        # Exactly one reply to every work item: answered once, or redelivered and answered.
        replies = await replies_to(mesh.root, set(in_flight))
        for message_id, seat in in_flight.items():
            [only] = replies[message_id]
            assert only["id"] == reply_id(message_id) and only["sender"] == f"local.{seat}"
            assert only["text"] == f"ack: work item {seat[1:]} #slow:3000"
        async with broker(mesh.root) as js:
            for r in rows:
                info = await js.consumer_info(
                    "DM_main", f"dm_local-{r['name']}-{r['lifecycleUid']}"
                )
                assert info.num_pending == 0 and info.num_ack_pending == 0
        mesh.run("down")
        await wait_gone([new_daemon, broker_before["pid"]], timeout=30)
        assert not (mesh.root / ".cotal" / "seats").exists() or not any(
            (mesh.root / ".cotal" / "seats").iterdir()
        )
    finally:
        mesh.run("down", check=False)


async def test_a_seat_whose_custody_moved_is_listed_failed_and_never_relaunched(
    mesh: Cli,
) -> None:
    kept = mesh.json("spawn", "kept")
    moved = mesh.json("spawn", "moved")
    seats_dir = mesh.root / ".cotal" / "seats"
    record_file = seats_dir / f"moved-{moved['lifecycleUid']}.json"
    assert mode(seats_dir) == 0o700 and mode(record_file) == 0o600
    record = decode_seat_record(record_file.read_bytes(), where="test")
    assert (record.name, record.lifecycle_uid, record.state) == (
        "moved",
        moved["lifecycleUid"],
        "running",
    )
    assert record.session_id == moved["sessionId"] and record.continuity == "exact"
    daemon = mesh.json("status")["pid"]
    os.kill(daemon, signal.SIGKILL)
    await wait_gone([daemon, kept["pid"], moved["pid"]], timeout=20)
    # Another host takes custody of `moved` while no manager runs here.
    key = f"local.moved.{moved['lifecycleUid']}"
    async with broker(mesh.root) as js:
        kv = await js.key_value("cotal_custody_main")
        custody = json.loads((await kv.get(key)).value or b"")
        custody.update(holder="z" * 26, generation=custody["generation"] + 1)
        await kv.put(key, json.dumps(custody).encode())
    broker_before = json.loads((mesh.root / ".cotal" / "mesh.json").read_text())["embeddedBroker"]
    # The operator's own recovery: `cotal up` again. The broker outlived the daemon, so the new
    # manager must join it rather than start a second broker on the same store.
    up = mesh.run("up", "--detach")
    assert "reusing the embedded broker left running" in up.stderr
    record = json.loads((mesh.root / ".cotal" / "mesh.json").read_text())
    assert record["embeddedBroker"] == broker_before
    assert nats_servers_on(mesh.root / ".cotal" / "nats") == [broker_before["pid"]]
    try:
        with anyio.fail_after(60):
            while True:
                if mesh.run("status", "--json", check=False).returncode == 0:
                    ps = {r["name"]: r for r in mesh.ps()}
                    if ps.get("kept", {}).get("state") == "running" and "moved" in ps:
                        if ps["moved"]["state"] == "failed":
                            break
                await anyio.sleep(0.2)
        row = ps["moved"]
        assert row["pid"] is None and row["lifecycleUid"] == moved["lifecycleUid"]
        assert row["reason"].startswith("custody-not-held") and "z" * 26 in row["reason"]
        assert ps["kept"]["sessionId"] == kept["sessionId"]
        # Nothing was deprovisioned, and removing it drops only this manager's entry.
        mesh.run("rm", "moved")
        async with broker(mesh.root) as js:
            await js.consumer_info("DM_main", f"dm_local-moved-{moved['lifecycleUid']}")
            entry = await (await js.key_value("cotal_custody_main")).get(key)
            assert json.loads(entry.value or b"")["holder"] == "z" * 26
        assert [r["name"] for r in mesh.ps()] == ["kept"]
        assert not record_file.exists()
    finally:
        mesh.run("down", check=False)


async def test_a_seat_never_runs_again_under_an_edited_profile(mesh: Cli) -> None:
    """The manager re-derives a seat's launch profile at every relaunch: a seat re-adopted
    after its manager died, with `cotal.toml` edited meanwhile, is refused by name and kept
    (inbox, session, record), and runs again once the profile is back."""
    (mesh.root / "cotal.toml").write_text('[agents.scribe]\nmodel = "first"\n')
    spawned = mesh.json("spawn", "drifter", "--agent", "scribe")
    reply = mesh.json("send", "drifter", "remember the phrase drift-9", "--wait")
    assert reply["reply"] == "Noted: drift-9."
    record = decode_seat_record(
        (mesh.root / ".cotal" / "seats" / f"drifter-{spawned['lifecycleUid']}.json").read_bytes(),
        where="test",
    )
    assert record.profile is not None
    daemon = mesh.json("status")["pid"]
    os.kill(daemon, signal.SIGKILL)
    await wait_gone([daemon, spawned["pid"]], timeout=20)

    (mesh.root / "cotal.toml").write_text('[agents.scribe]\nmodel = "second"\n')
    mesh.run("up", "--detach")
    # ps is another process's view: polled under a deadline.
    await wait_until(lambda: [r["state"] for r in mesh.ps()] == ["failed"], timeout=60, every=0.2)
    [row] = mesh.ps()
    assert row["lifecycleUid"] == spawned["lifecycleUid"]
    assert "seat drifter: this root's launch profile for scribe is now revision" in row["reason"], (
        row
    )
    assert f"not the {record.profile} the seat was started under" in row["reason"], row

    assert (
        "then `cotal start drifter` (after `cotal stop drifter` if it shows failed)"
        in (row["reason"])
    )
    # Starting it under the edited profile is refused too, and leaves it stopped.
    mesh.run("stop", "drifter")
    again = mesh.run("start", "drifter", "--json", check=False)
    assert "launch profile for scribe is now revision" in refused(again, "profile-drift")
    assert mesh.ps()[0]["state"] == "stopped"
    (mesh.root / "cotal.toml").write_text('[agents.scribe]\nmodel = "first"\n')
    restarted = mesh.json("start", "drifter")
    assert restarted["lifecycleUid"] == spawned["lifecycleUid"]
    assert restarted["sessionId"] == spawned["sessionId"]
    reply = mesh.json("send", "drifter", "What was the phrase?", "--wait")
    assert reply["reply"] == "The phrase is drift-9."


async def test_a_cut_never_records_a_profile_its_seat_did_not_run_under(mesh: Cli) -> None:
    """The cut's plan proves each seat's profile against `cotal.toml` as a relaunch does: with
    the file edited since the seat started, the cut refuses by name and stops nothing."""
    (mesh.root / "cotal.toml").write_text('[agents.scribe]\nmodel = "first"\n')
    cwd = committed_repo(mesh.root / "steady")
    spawned = mesh.json("spawn", "steady", "--agent", "scribe", "--cwd", str(cwd))
    (mesh.root / "cotal.toml").write_text('[agents.scribe]\nmodel = "second"\n')
    cut = mesh.run("down", "--preserve-state", "--json", check=False)
    assert "seat steady: this root's launch profile for scribe is now revision" in refused(
        cut, "profile-drift"
    )
    [row] = mesh.ps()
    assert (row["pid"], row["state"]) == (spawned["pid"], "running")
    (mesh.root / "cotal.toml").write_text('[agents.scribe]\nmodel = "first"\n')
    sealed = mesh.json("down", "--preserve-state")
    assert [s["lifecycleUid"] for s in sealed["seats"]] == [spawned["lifecycleUid"]]
