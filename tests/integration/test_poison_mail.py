"""Poison mail, end to end: a real broker, a real daemon, real scribe (and pi) seats.

A turn that ends badly restarts its harness into its own session, within the restart budget;
a message past its delivery cap moves to the seat's dead letters and the inbox moves on; the
operator lists, redelivers and drops dead letters with `cotal inbox`; and a message delivered
again reaches the harness with its delivery count.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from connectors.base import TurnOutcome, redelivery_notice
from connectors.pi import PiConnector, PiDriver
from protocol.messages import decode_dm
from tests.conftest import PI_CLI, Cli, FakeServer
from tests.harness import Seat, running_seat, seat_opts
from tests.helpers import broker, manager_log_events, ps_row, wait_until

pytestmark = pytest.mark.anyio

INSTANT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _up(cli: Cli, max_deliveries: int) -> None:
    (cli.root / "cotal.toml").write_text(f"[delivery]\nmax_deliveries = {max_deliveries}\n")
    cli.run("up", "--detach")


@pytest.fixture
def capped(cli: Cli, request: pytest.FixtureRequest) -> Iterator[Cli]:
    _up(cli, request.param)
    yield cli
    if (cli.root / ".cotal" / "mesh.json").exists():
        cli.run("down", check=False)


def _transcript(cli: Cli, row: dict[str, Any]) -> list[bytes]:
    store = (
        cli.root / ".cotal" / "sessions" / "scribe" / f"{row['name']}-{row['lifecycleUid']}.store"
    )
    return (store / f"{row['sessionId']}.jsonl").read_bytes().splitlines()


def _user_line(lines: list[bytes], message_id: str) -> bytes:
    [line] = [x for x in lines if json.loads(x).get("id") == message_id and b'"role":"user"' in x]
    return line


@pytest.mark.parametrize("capped", [2], indirect=True)
async def test_poison_mail_is_set_aside_listed_redelivered_and_dropped(capped: Cli) -> None:
    mesh = capped
    first = mesh.json("spawn", "alice", "--agent", "scribe")
    uid, session = first["lifecycleUid"], first["sessionId"]

    # Every delivery up to the second ends in error; the cap is 2.
    poison = mesh.json("send", "alice", "#error-until:2 remember the phrase amber-owl-7")
    # Queued behind it (one message in flight per inbox): answered once the inbox moves on.
    after = mesh.json("send", "alice", "hello after", "--wait", "--timeout", "60")
    assert after["reply"] == "ack: hello after" and after["attempts"] == 1

    row = ps_row(mesh, "alice")
    # Each failed turn restarted the harness into its own session, under the same uid.
    assert row["restarts"] == 2 and row["state"] == "running"
    assert row["lifecycleUid"] == uid and row["sessionId"] == session
    assert row["pid"] != first["pid"]
    assert row["deadLetters"] == 1
    restarts = manager_log_events(mesh, "seat.turn_restart", "alice")
    assert [e["turn"] for e in restarts] == [
        "error: injected fault error-until:2 (delivery 1)",
        "error: injected fault error-until:2 (delivery 2)",
    ]
    [table_head, table_row] = mesh.run("ps").stdout.splitlines()
    assert table_head.split() == ["NAME", "AGENT", "STATE", "TURN", "UPTIME", "RESTARTS", "DEAD"]
    assert table_row.split()[0] == "alice" and table_row.split()[-2:] == ["2", "1"]
    status = mesh.json("status")
    assert status["manager"]["deadLetters"] == {"alice": 1}
    assert "dead      alice 1 (see cotal inbox SEAT)" in mesh.run("status").stdout.splitlines()

    listed = mesh.json("inbox", "alice")
    assert listed["name"] == "alice" and listed["lifecycleUid"] == uid
    assert listed["count"] == 1 and listed["truncated"] is False
    [letter] = listed["letters"]
    assert letter["messageId"] == poison["id"] and letter["sender"] == "local.operator"
    assert letter["deliveries"] == 2
    assert letter["reason"] == "error: injected fault error-until:2 (delivery 2)"
    assert letter["head"] == "#error-until:2 remember the phrase amber-owl-7"
    assert letter["subject"] == "cotal.main.inst.local.alice.local.operator"
    assert INSTANT.fullmatch(letter["deadAt"])
    human = mesh.run("inbox", "alice").stdout.splitlines()
    assert human[0] == f"alice: 1 dead letter(s) (uid {uid})"
    assert human[2].split()[:3] == [str(letter["id"]), "local.operator", "2"]
    # Kept whole: the dead letter holds the message's own bytes, and the inbox moved past it.
    async with broker(mesh.root) as js:
        raw = await js.get_msg("DEAD_main", seq=letter["id"])
        assert raw.subject == f"cotal.main.dead.local.alice.{uid}"
        kept = decode_dm(raw.data or b"")
        assert (kept.id, kept.text) == (
            poison["id"],
            "#error-until:2 remember the phrase amber-owl-7",
        )
        durable = await js.consumer_info("DM_main", f"dm_local-alice-{uid}")
        assert durable.num_ack_pending == 0 and durable.num_pending == 0

    # Put back: delivered again, told so, and answered (the third delivery succeeds).
    back = mesh.json("inbox", "alice", "--redeliver", str(letter["id"]))
    assert back["id"] == letter["id"] and back["messageId"] == poison["id"]
    assert back["delivery"] == 3
    await wait_until(
        lambda: any(
            b'"role":"assistant"' in x and poison["id"].encode() in x
            for x in _transcript(mesh, row)
        ),
        timeout=30,
    )
    line = _user_line(_transcript(mesh, row), poison["id"])
    at = json.loads(line)["at"]
    assert line == (
        b'{"role":"user","text":"#error-until:2 remember the phrase amber-owl-7","id":"'
        + poison["id"].encode()
        + b'","at":"'
        + at.encode()
        + b'","delivery":3}'
    )
    # The reply went to the original sender, and the seat was not restarted for it. The
    # harness writes its transcript before the manager publishes the reply, so the reply is
    # waited for: until then the subject's last message is the reply to "hello after".
    async with broker(mesh.root) as js:
        with anyio.fail_after(30):
            while True:
                reply = decode_dm(
                    (
                        await js.get_last_msg(
                            "DM_main", "cotal.main.inst.local.operator.local.alice"
                        )
                    ).data
                    or b""
                )
                if reply.in_reply_to == poison["id"]:
                    break
                assert reply.in_reply_to == after["id"], reply
                await anyio.sleep(0.1)
    assert reply.text == "Noted: amber-owl-7."
    after_redelivery = ps_row(mesh, "alice")
    assert after_redelivery["deadLetters"] == 0 and after_redelivery["restarts"] == 2
    assert mesh.json("inbox", "alice") == {
        "name": "alice",
        "lifecycleUid": uid,
        "count": 0,
        "letters": [],
        "truncated": False,
    }
    again = mesh.run("inbox", "alice", "--redeliver", str(letter["id"]), check=False)
    assert again.returncode == 2
    assert f"seat alice has no dead letter {letter['id']}" in again.stderr

    # A second poison message spends the restart budget (3 in 120 s): its first failure is
    # the third restart, its second, at the cap, is set aside without a fourth.
    second = mesh.json("send", "alice", "#error-always bye")
    await wait_until(lambda: ps_row(mesh, "alice")["deadLetters"] == 1, timeout=60, every=0.2)
    now = ps_row(mesh, "alice")
    assert now["restarts"] == 3 and now["state"] == "running" and now["sessionId"] == session
    [refused] = manager_log_events(mesh, "seat.turn_restart_refused", "alice")
    assert refused["why"] == "its restart budget is spent (3 restarts within 120s)"
    [dead] = mesh.json("inbox", "alice")["letters"]
    assert dead["messageId"] == second["id"] and dead["deliveries"] == 2

    # Dropped for good: gone from the broker, and a second drop names the id it cannot find.
    dropped = mesh.json("inbox", "alice", "--drop", str(dead["id"]))
    assert dropped == {
        "name": "alice",
        "lifecycleUid": uid,
        "id": dead["id"],
        "messageId": second["id"],
    }
    async with broker(mesh.root) as js:
        info = await js.stream_info("DEAD_main", subjects_filter="cotal.main.dead.>")
        assert not info.state.subjects
    assert ps_row(mesh, "alice")["deadLetters"] == 0
    twice = mesh.run("inbox", "alice", "--drop", str(dead["id"]), check=False)
    assert (
        twice.returncode == 2
        and "no-such-dead-letter"
        in mesh.run("inbox", "alice", "--drop", str(dead["id"]), "--json", check=False).stderr
    )
    nobody = mesh.run("inbox", "bob", check=False)
    assert nobody.returncode == 2 and "no seat named 'bob'" in nobody.stderr
    bad = mesh.run("inbox", "alice", "--drop", "0", check=False)
    assert bad.returncode == 64 and "'0' is not a dead letter id" in bad.stderr


@pytest.mark.parametrize("capped", [5], indirect=True)
async def test_restarts_stop_at_the_budget_and_the_cap_still_applies(capped: Cli) -> None:
    mesh = capped
    mesh.json("spawn", "bob", "--agent", "scribe")
    poison = mesh.json("send", "bob", "#error-always")
    nxt = mesh.json("send", "bob", "then this", "--wait", "--timeout", "90")
    assert nxt["reply"] == "ack: then this"
    row = ps_row(mesh, "bob")
    # Deliveries 1-3 restarted the harness; 4 and 5 found the budget spent and ran in the same
    # process, each after a pause for a call that might still be live.
    assert row["restarts"] == 3 and row["deadLetters"] == 1
    refused = manager_log_events(mesh, "seat.turn_restart_refused", "bob")
    assert [e["turn"] for e in refused] == [
        "error: injected fault error-always (delivery 4)",
        "error: injected fault error-always (delivery 5)",
    ]
    [dead] = mesh.json("inbox", "bob")["letters"]
    assert dead["messageId"] == poison["id"] and dead["deliveries"] == 5
    # `cotal rm` deletes the seat's dead letters with the rest of its footprint.
    removed = mesh.json("rm", "bob")
    assert removed["deadLettersDeleted"] == 1
    async with broker(mesh.root) as js:
        info = await js.stream_info("DEAD_main", subjects_filter="cotal.main.dead.>")
        assert not info.state.subjects


@pytest.mark.parametrize("capped", [3], indirect=True)
async def test_a_message_redelivered_by_the_broker_reaches_the_harness_with_its_count(
    capped: Cli,
) -> None:
    mesh = capped
    first = mesh.json("spawn", "cy", "--agent", "scribe")
    sent = mesh.json("send", "cy", "#error-until:1 hi", "--wait", "--timeout", "60")
    assert sent["attempts"] == 2 and sent["reply"] == "ack: #error-until:1 hi"
    row = ps_row(mesh, "cy")
    assert row["restarts"] == 1 and row["deadLetters"] == 0 and row["pid"] != first["pid"]
    line = json.loads(_user_line(_transcript(mesh, row), sent["id"]))
    assert line["delivery"] == 2 and line["text"] == "#error-until:1 hi"


@pytest.mark.pi
@pytest.mark.skipif(not PI_CLI.is_file(), reason="pi is not installed under .tools/pi")
async def test_pi_reads_the_redelivery_notice_before_the_message(
    root: Path, fake_openai: FakeServer, tmp_path: Path
) -> None:
    opts = seat_opts(
        root, "pi", "dora", config={"base_url": fake_openai.base_url, "model": "fake-model"}
    )
    async with running_seat(PiConnector(), opts, tmp_path, timeout=30, seat=Seat[PiDriver]) as s:
        with anyio.fail_after(30):
            await s.driver.get_state()
            outcome = await s.driver.prompt(
                "remember the phrase quartz-heron-12", message_id="m1", delivery=2
            )
            assert outcome == TurnOutcome("ok", "Noted: quartz-heron-12.")
    [request, *_] = fake_openai.requests()
    assert fake_openai.user_texts(request)[-1] == (
        f"{redelivery_notice(2)}\n\nremember the phrase quartz-heron-12"
    )
