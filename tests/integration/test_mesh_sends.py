"""Seats sending to seats, end to end (real broker, real daemon, real scribe seats): a relay
names its sender, a send the seat may not make is refused to it by name and reaches nobody,
a stopped recipient gets its mail at its start, a turn run again re-sends nothing the
recipient sees twice, and a call that claims a sender is refused whole."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.conftest import Cli
from tests.gitrepo import committed_repo
from tests.helpers import ask, broker, dm_messages, refused, seat_events, wait_gone, wait_until

pytestmark = pytest.mark.anyio

STREAM = "DM_main"


async def test_a_tells_b_and_b_names_a_as_the_sender(mesh: Cli) -> None:
    mesh.json("spawn", "b")
    spawned = mesh.json("spawn", "a", "--allow-send", "b")
    assert spawned["allowSend"] == ["b"]
    [row_a] = [r for r in mesh.ps() if r["name"] == "a"]
    assert row_a["allowSend"] == ["b"]
    assert "SENDS TO" in mesh.run("ps", "--wide").stdout

    assert ask(mesh, "a", "Tell b: remember the phrase amber-kettle-12") == "Told b: delivered."
    # b's inbox hands out one message at a time, so the question runs after a's message.
    assert ask(mesh, "b", "what was the phrase?") == "The phrase is amber-kettle-12, from a."

    [(body, headers)] = await dm_messages(mesh, "b", "a")
    assert body["sender"] == "local.a" and body["text"] == "remember the phrase amber-kettle-12"
    assert headers["Cotal-Sender"] == "a"
    # b's answer to a seat's message goes to the operator: a reply to a would bypass b's
    # permissions (b may send to nobody).
    assert await dm_messages(mesh, "a", "b") == []
    replies = {r["inReplyTo"]: r["text"] for r, _ in await dm_messages(mesh, "operator", "b")}
    assert replies[body["id"]] == "Noted: amber-kettle-12 (from a)."
    # The operator's own send carries its sender too.
    [(_, op_headers)] = await dm_messages(mesh, "b", "operator")
    assert op_headers["Cotal-Sender"] == "operator"

    received = {(e["sender"], e["id"]) for e in seat_events(mesh, "b", "delivery.received")}
    assert ("a", body["id"]) in received
    assert any(sender == "operator" for sender, _ in received)
    [sent] = seat_events(mesh, "a", "mesh.sent")
    assert (sent["to"], sent["id"]) == ("b", body["id"])


async def test_a_send_outside_the_permission_is_refused_and_reaches_nobody(mesh: Cli) -> None:
    mesh.json("spawn", "a")
    mesh.json("spawn", "b")
    mesh.json("spawn", "c", "--allow-send", "a")

    reply = ask(mesh, "c", "Tell b: remember the phrase stolen-key-9\nTell a: hello from c")
    denied, delivered = reply.splitlines()
    assert denied.startswith("Could not tell b: refused send-not-allowed: seat c may not send")
    assert delivered == "Told a: delivered."
    assert await dm_messages(mesh, "b", "c") == []
    assert ask(mesh, "b", "what was the phrase?") == "I do not know the phrase."
    [logged] = seat_events(mesh, "c", "mesh.send_refused")
    assert logged["code"] == "send-not-allowed" and "may not send to b" in logged["error"]

    # A seat never sends to itself, even with '*'; and a name with no inbox is refused.
    mesh.json("spawn", "d", "--allow-send", "*")
    assert ask(mesh, "d", "who can you tell?") == "I can tell: a, b, c."
    assert ask(mesh, "c", "who can you tell?") == "I can tell: a."
    assert ask(mesh, "b", "who can you tell?") == "I can tell nobody."
    bad = mesh.run("spawn", "e", "--allow-send", "a.b", "--json", check=False)
    assert "a.b" in refused(bad, "bad-name")
    assert "e" not in {r["name"] for r in mesh.ps()}
    lines = ask(mesh, "d", "Tell d: loop\nTell nobody: hello\nTell a: hi").splitlines()
    assert lines[0].startswith("Could not tell d: refused send-not-allowed")
    assert lines[1].startswith("Could not tell nobody: refused no-such-seat")
    assert lines[2] == "Told a: delivered."


async def test_a_message_to_a_stopped_seat_waits_for_its_start(mesh: Cli) -> None:
    mesh.json("spawn", "b")
    mesh.json("spawn", "a", "--allow-send", "b")
    mesh.json("stop", "b")

    assert ask(mesh, "a", "Tell b: remember the phrase quiet-harbor-3") == "Told b: delivered."
    assert len(await dm_messages(mesh, "b", "a")) == 1
    assert seat_events(mesh, "b", "delivery.received") == []

    mesh.json("start", "b")
    assert ask(mesh, "b", "what was the phrase?") == "The phrase is quiet-harbor-3, from a."


async def test_a_turn_run_again_sends_each_message_once(mesh: Cli) -> None:
    mesh.json("spawn", "b")
    mesh.json("spawn", "a", "--allow-send", "b")

    # The turn sends twice, then its harness dies before the reply; the manager restarts it
    # into its session, the message comes again, and the turn sends both again.
    prompt = (
        "Tell b: remember the phrase first-copy-1\n"
        "Tell b: remember the phrase second-copy-2\n"
        "#die-after-tell:once"
    )
    done = mesh.json("send", "a", prompt, "--wait", "--timeout", "90")
    assert done["reply"] == "Told b: delivered.\nTold b: delivered."
    assert done["attempts"] == 2

    # The second run's sends are in the sent ledger: answered as made, not published again.
    sends = seat_events(mesh, "a", "mesh.sent")
    dropped = seat_events(mesh, "a", "mesh.duplicate_dropped")
    assert len(sends) == 2
    assert [s["id"] for s in sends] == [d["id"] for d in dropped]
    assert [s["seq"] for s in sends] == [d["seq"] for d in dropped]
    held = await dm_messages(mesh, "b", "a")
    assert [body["text"] for body, _ in held] == [
        "remember the phrase first-copy-1",
        "remember the phrase second-copy-2",
    ]
    assert ask(mesh, "b", "what was the phrase?") == "The phrase is second-copy-2, from a."
    received = [e for e in seat_events(mesh, "b", "delivery.received") if e["sender"] == "a"]
    assert len(received) == 2

    async with broker(mesh.root) as js:
        info = await js.stream_info(STREAM)
    assert info.config.duplicate_window >= 24 * 60 * 60


async def test_a_hostile_call_claiming_a_sender_is_refused(mesh: Cli) -> None:
    mesh.json("spawn", "b")
    mesh.json("spawn", "c")
    mesh.json("spawn", "a", "--allow-send", "b")

    reply = ask(mesh, "a", "Tell b: remember the phrase forged-9 #forge-sender:c")
    assert reply.startswith("Could not tell b: refused mesh-call-invalid:")
    assert "sender" in reply
    for sender in ("a", "c"):
        assert await dm_messages(mesh, "b", sender) == []
    [logged] = seat_events(mesh, "a", "mesh.send_refused")
    assert logged["code"] == "mesh-call-invalid"
    # Nothing reached b, under any name.
    assert ask(mesh, "b", "what was the phrase?") == "I do not know the phrase."


async def test_a_send_from_a_launch_prompt_is_refused(mesh: Cli) -> None:
    mesh.json("spawn", "b")
    mesh.json("spawn", "a", "--allow-send", "b", "--prompt", "Tell b: hello early")
    await wait_until(lambda: bool(seat_events(mesh, "a", "mesh.send_refused")), timeout=20)
    [logged] = seat_events(mesh, "a", "mesh.send_refused")
    assert logged["code"] == "send-outside-turn"
    assert await dm_messages(mesh, "b", "a") == []


async def test_cotal_toml_gives_a_seat_its_permission(cli: Cli) -> None:
    (cli.root / "cotal.toml").write_text('[seats.a]\nallow_send = ["b"]\n')
    cli.run("up", "--detach")
    try:
        cli.json("spawn", "b")
        assert cli.json("spawn", "a")["allowSend"] == ["b"]
        assert cli.json("spawn", "c")["allowSend"] == []
        assert ask(cli, "a", "Tell b: remember the phrase from-config-7") == "Told b: delivered."
        assert ask(cli, "b", "what was the phrase?") == "The phrase is from-config-7, from a."
    finally:
        cli.run("down", check=False)


@pytest.mark.usefixtures("isolated_home")
async def test_a_message_to_a_seat_a_cut_holds_is_delivered_after_its_resume(cli: Cli) -> None:
    repo = committed_repo(cli.root / "repo")
    cli.run("up", "--detach")
    try:
        cli.json("spawn", "b", "--cwd", str(repo))
        cli.json("spawn", "a", "--cwd", str(repo), "--allow-send", "b")
        cut = cli.json("down", "--preserve-state", "--seat", "b")
        assert [r["name"] for r in cli.ps()] == ["a"]

        # b is in no table now; its inbox durable waits at the broker, and the send lands in it.
        told = ask(cli, "a", "Tell b: remember the phrase held-by-cut-5")
        assert told == "Told b: delivered."
        restored = cli.json("up", "--restore", cut["checkpointDir"])
        assert restored["adopted"] is True, restored
        assert ask(cli, "b", "what was the phrase?") == "The phrase is held-by-cut-5, from a."
    finally:
        cli.run("down", check=False)


async def test_a_seats_permission_survives_its_managers_death(mesh: Cli) -> None:
    mesh.json("spawn", "b")
    mesh.json("spawn", "c")
    a = mesh.json("spawn", "a", "--allow-send", "b")
    record = json.loads((mesh.root / ".cotal/seats" / f"a-{a['lifecycleUid']}.json").read_text())
    assert record["allowSend"] == ["b"]
    daemon = mesh.json("status")["pid"]
    os.kill(daemon, signal.SIGKILL)
    await wait_gone([daemon, a["pid"]], timeout=20)

    mesh.run("up", "--detach")

    def all_running() -> bool:
        rows = mesh.ps()
        return len(rows) == 3 and all(r["state"] == "running" for r in rows)

    await wait_until(all_running, timeout=60, every=0.2)
    rows = {r["name"]: r for r in mesh.ps()}
    assert rows["a"]["allowSend"] == ["b"] and rows["a"]["pid"] != a["pid"]
    assert rows["b"]["allowSend"] == rows["c"]["allowSend"] == []
    told = ask(mesh, "a", "Tell b: remember the phrase after-crash-4\nTell c: hello")
    assert told.splitlines()[0] == "Told b: delivered."
    assert told.splitlines()[1].startswith("Could not tell c: refused send-not-allowed")
    assert ask(mesh, "b", "what was the phrase?") == "The phrase is after-crash-4, from a."
    assert await dm_messages(mesh, "c", "a") == []


async def test_a_turn_cut_after_its_sends_sends_each_once_after_the_resume(cli: Cli) -> None:
    """The cut lands after the turn's two sends and before its end: the message is carried
    as mid-turn, the resume delivers it again, the turn sends both again under the same ids,
    which the sent ledger answers as made, and the broker keeps one copy of each."""
    repo = committed_repo(cli.root / "repo")
    cli.run("up", "--detach")
    try:
        cli.json("spawn", "b", "--cwd", str(repo))
        cli.json("spawn", "a", "--cwd", str(repo), "--allow-send", "b")
        cli.json(
            "send", "a", "Tell b: remember the phrase cut-copy-1\n"
            "Tell b: remember the phrase cut-copy-2\n#slow-after-tell:8000",
        )  # fmt: skip
        await wait_until(lambda: len(seat_events(cli, "a", "mesh.sent")) == 2, timeout=30)
        # A cut of a alone: the broker runs on, so the mid-turn message a's stop released is
        # there for its resume at once (a broker restarted since holds it for its ack_wait).
        cut = json.loads(
            cli.run(
                "down", "--preserve-state", "--seat", "a", "--drain-timeout", "1", "--json"
            ).stdout
        )
        assert [m["name"] for m in cut["midTurn"]] == ["a"], cut
        cli.json("up", "--restore", cut["checkpointDir"])

        await wait_until(
            lambda: len(seat_events(cli, "a", "mesh.duplicate_dropped")) == 2, timeout=60
        )
        sends = seat_events(cli, "a", "mesh.sent")
        dropped = seat_events(cli, "a", "mesh.duplicate_dropped")
        assert [s["id"] for s in sends] == [d["id"] for d in dropped]
        held = await dm_messages(cli, "b", "a")
        assert [body["text"] for body, _ in held] == [
            "remember the phrase cut-copy-1",
            "remember the phrase cut-copy-2",
        ]
        assert ask(cli, "b", "what was the phrase?") == "The phrase is cut-copy-2, from a."
        received = [e for e in seat_events(cli, "b", "delivery.received") if e["sender"] == "a"]
        assert len(received) == 2
    finally:
        cli.run("down", check=False)
