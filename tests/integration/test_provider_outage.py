"""An outage is not poison: a real broker, a real daemon, real pi and scribe seats, and the fake
model a real HTTP server process that can be switched into an outage (`<log>.outage`).

A turn whose model provider did not serve it (503, 429, a connection dropped) ends
`provider-unavailable`: the manager holds the message, backs off and hands it to the same
harness again, without a restart and without counting the delivery, so a queue that waited out
the outage is answered in order, each message once, with nothing dead-lettered. A turn that
fails by itself still goes to the dead letters at the cap.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import PI_CLI, Cli, FakeServer
from tests.fixtures.fake_openai import latest_user_text
from tests.helpers import broker, manager_log_events, ps_row, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

QUEUED = 20
# Short, so the test rides out an outage of a few seconds: waits of 0.2, 0.4, then 0.5 s.
BACKOFF = (
    "backoff_initial_s = 0.2\nbackoff_coefficient = 2\nbackoff_max_s = 0.5\nbackoff_jitter = 0.5\n"
)


# Each kind of outage the fake plays, and how pi words the turn it ends.
OUTAGES = (
    ("503", "503 fake outage (503)"),
    ("429", "429 fake outage (429)"),
    ("drop", "Connection error."),
)


def _refusals(server: FakeServer) -> int:
    path = Path(f"{server.log}.outage.log")
    return len(path.read_text().splitlines()) if path.exists() else 0


def _served(server: FakeServer) -> list[str]:
    """The latest user text of each request the fake answered (an outage's are not logged)."""
    return [latest_user_text(r["messages"]) for r in server.requests()]


async def _replies(root: Path, seat: str) -> int:
    async with broker(root) as js:
        subject = f"cotal.main.inst.local.operator.local.{seat}"
        info = await js.stream_info("DM_main", subjects_filter=subject)
        return int((info.state.subjects or {}).get(subject, 0))


@pytest.mark.pi
@pytest.mark.skipif(not PI_CLI.is_file(), reason="pi is not installed under .tools/pi")
async def test_an_outage_backs_off_and_a_queue_behind_it_is_answered_once_in_order(
    cli: Cli, fake_openai: FakeServer
) -> None:
    (cli.root / "cotal.toml").write_text(
        f'[agents.pi]\nbase_url = "{fake_openai.base_url}"\nmodel = "fake-model"\n\n'
        f"[delivery]\nmax_deliveries = 2\n{BACKOFF}"
    )
    cli.run("up", "--detach")
    try:
        first = cli.json("spawn", "p1", "--agent", "pi")
        outage = Path(f"{fake_openai.log}.outage")
        outage.write_text("503")
        sent = [cli.json("send", "p1", f"remember the phrase w-{i}") for i in range(QUEUED)]
        # Past the cap of 2 on the first message, under each kind of outage in turn: each is
        # held until a turn has ended with it.
        for mode, detail in OUTAGES:
            outage.write_text(mode)
            await wait_until(
                lambda d=detail: any(
                    e["detail"] == d
                    for e in manager_log_events(cli, "delivery.provider_unavailable", "p1")
                ),
                timeout=60,
                every=0.1,
            )
        outage.unlink()
        last = cli.json("send", "p1", "what was the phrase", "--wait", "--timeout", "120")
        assert last["reply"] == f"The phrase is w-{QUEUED - 1}." and last["attempts"] == 1

        # Each queued message was served once, in the order sent, and nothing else was.
        served = _served(fake_openai)
        assert served == [f"remember the phrase w-{i}" for i in range(QUEUED)] + [
            "what was the phrase"
        ]
        assert await _replies(cli.root, "p1") == QUEUED + 1
        row = ps_row(cli, "p1")
        assert row["deadLetters"] == 0 and row["restarts"] == 0 and row["pid"] == first["pid"]
        # Only the head of the queue met the outage; its tries were not deliveries.
        waits = manager_log_events(cli, "delivery.provider_unavailable", "p1")
        assert {e["id"] for e in waits} == {sent[0]["id"]}
        # pi's HTTP client retries a refused request itself before it ends the turn, so a
        # wait here stands for one or more of the fake's refusals.
        assert 3 <= len(waits) <= _refusals(fake_openai)
        assert {e["detail"] for e in waits} == {detail for _, detail in OUTAGES}
        assert all(0 < e["retry_in_s"] <= 0.5 for e in waits)
        received = manager_log_events(cli, "delivery.received", "p1")
        assert [e["delivery"] for e in received if e["id"] == sent[0]["id"]] == [1]

        # A turn that fails by itself (a 500 is the request's, not an outage) still counts:
        # at the cap of 2 it is a dead letter.
        poison = cli.json("send", "p1", "fake:http-500 no good")
        await wait_until(lambda: ps_row(cli, "p1")["deadLetters"] == 1, timeout=90, every=0.2)
        [dead] = cli.json("inbox", "p1")["letters"]
        assert dead["messageId"] == poison["id"] and dead["deliveries"] == 2
        assert dead["reason"] == "error: 500 fake server error (fake:http-500)"
    finally:
        cli.run("down", check=False)


@pytest.mark.parametrize("cap", [1])
async def test_a_scribe_turn_its_provider_did_not_serve_is_not_counted(cli: Cli, cap: int) -> None:
    (cli.root / "cotal.toml").write_text(f"[delivery]\nmax_deliveries = {cap}\n{BACKOFF}")
    cli.run("up", "--detach")
    try:
        first = cli.json("spawn", "s1", "--agent", "scribe")
        # Three tries end `provider-unavailable`, the fourth is served; the cap is one delivery.
        sent = cli.json("send", "s1", "#unavailable:3 hello", "--wait", "--timeout", "60")
        assert sent["reply"] == "ack: #unavailable:3 hello" and sent["attempts"] == 1
        row = ps_row(cli, "s1")
        assert row["deadLetters"] == 0 and row["restarts"] == 0 and row["pid"] == first["pid"]
        waits = manager_log_events(cli, "delivery.provider_unavailable", "s1")
        assert [e["tries"] for e in waits] == [1, 2, 3]
        assert [e["detail"] for e in waits] == ["injected outage unavailable:3 (503)"] * 3
        # A turn that fails by itself, at a cap of one, is a dead letter at once.
        bad = cli.json("send", "s1", "#error-always")
        await wait_until(lambda: ps_row(cli, "s1")["deadLetters"] == 1, timeout=60, every=0.1)
        [dead] = cli.json("inbox", "s1")["letters"]
        assert dead["messageId"] == bad["id"] and dead["deliveries"] == 1
    finally:
        cli.run("down", check=False)
