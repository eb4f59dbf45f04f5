"""The console's app (manager/console/app.py) driven by Textual's own pilot, headless: a root
whose manager is down is said so and the app keeps running; rows given to its board are drawn;
every verb asks before it acts, does nothing on "no", and on "yes" runs the CLI's own request,
whose refusal (no manager here) is shown in the CLI's words. The web server (manager/console/
web.py) listens on loopback alone and says its address only once a connection there is
accepted. The real manager, broker and seats are the end-to-end test's
(tests/e2e/test_console.py)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from textual.widgets import DataTable, Log, Static

from manager.console import web
from manager.console.app import Ask, Confirm, ConsoleApp
from protocol.errors import Refusal
from protocol.refusals import Code
from tests.helpers import wait_until
from tests.unit.test_console_model import HERE, THERE, event, fleet, local

pytestmark = pytest.mark.anyio

NOT_UP = "no manager has been started in {root}; run `cotal up --detach` there"


def text_of(app: ConsoleApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


def rows_of(app: ConsoleApp) -> list[list[str]]:
    table = app.query_one("#seats", DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def seated(app: ConsoleApp) -> None:
    app.board.roster(
        [
            fleet("alice", "ua", HERE, "host-a", "running"),
            fleet("bob", "ub", THERE, "host-b", "running"),
        ],
        [local("alice", "ua")],
        "2026-12-07T08:00:00.000Z",
    )
    app.redraw()


async def test_a_root_with_no_manager_is_said_down_and_the_app_keeps_running(
    tmp_path: Path,
) -> None:
    app = ConsoleApp(tmp_path, poll_s=0.2, follow_events=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(lambda: "DOWN" in text_of(app, "#status"))
        assert text_of(app, "#status").startswith(
            f"manager: DOWN (not-up: no manager has been started in {tmp_path}), retrying"
        )
        assert app.query_one("#status").has_class("down")
        # Polled again and again, never ending the app.
        await pilot.pause(0.5)
        assert app.is_running
        seated(app)
        assert rows_of(app) == [
            ["alice", "host-a", "running", "idle", "-", "0", "-", "-", HERE],
            ["bob", "host-b", "running", "-", "-", "-", "-", "-", THERE],
        ]


async def test_every_verb_asks_first_and_no_does_nothing(tmp_path: Path) -> None:
    app = ConsoleApp(tmp_path, poll_s=5, follow_events=False)
    async with app.run_test(size=(160, 48)) as pilot:
        seated(app)
        await pilot.pause()
        for key, verb in (("x", "stop"), ("s", "start"), ("r", "restart")):
            await pilot.press(key)
            assert isinstance(app.screen, Confirm)
            assert f"`cotal {verb} alice`" in app.screen.question
            await pilot.press("n")
            assert not isinstance(app.screen, Confirm)
            assert text_of(app, "#said") == f"{verb} alice: not done"
        # Escape and Enter on the focused button (No) are a no as well.
        await pilot.press("x", "escape")
        assert text_of(app, "#said") == "stop alice: not done"
        await pilot.press("x", "enter")
        assert text_of(app, "#said") == "stop alice: not done"


async def test_yes_runs_the_clis_request_and_shows_its_refusal(tmp_path: Path) -> None:
    app = ConsoleApp(tmp_path, poll_s=5, follow_events=False)
    async with app.run_test(size=(160, 48)) as pilot:
        seated(app)
        await pilot.pause()
        await pilot.press("x", "y")
        not_up = NOT_UP.format(root=tmp_path)
        await wait_until(lambda: "refused" in text_of(app, "#said"))
        assert text_of(app, "#said") == f"stop alice refused: not-up: {not_up}"
        # send: the text, then the confirm naming it, then the request.
        await pilot.press("m")
        assert isinstance(app.screen, Ask)
        await pilot.press(*"hello there", "enter")
        assert isinstance(app.screen, Confirm)
        assert app.screen.question == "Send to alice: 'hello there'?"
        await pilot.press("y")
        await wait_until(lambda: text_of(app, "#said").startswith("send alice refused"))
        assert text_of(app, "#said") == f"send alice refused: not-up: {not_up}"
        # move: no destination typed is nothing moved, and no confirm is asked.
        await pilot.press("v")
        assert isinstance(app.screen, Ask)
        assert "Live: " + THERE + " (host-b)" in str(app.screen.prompt)
        await pilot.press("enter")
        assert text_of(app, "#said") == "move alice: no destination, nothing moved"
        # drain: an empty destination is --fleet, said in the question.
        await pilot.press("d", "enter")
        assert isinstance(app.screen, Confirm)
        assert app.screen.question == (
            f"Drain this host: move every seat of {tmp_path} to the fleet's managers, by free "
            "room (`cotal drain --fleet`)?"
        )
        await pilot.press("n")
        assert text_of(app, "#said") == "drain: not done"


async def test_a_seat_of_another_host_is_not_acted_on_here_and_says_where_it_runs(
    tmp_path: Path,
) -> None:
    app = ConsoleApp(tmp_path, poll_s=5, follow_events=False)
    async with app.run_test(size=(160, 48)) as pilot:
        seated(app)
        await pilot.pause()
        await pilot.press("down")
        await pilot.press("x")
        assert not isinstance(app.screen, Confirm)
        assert text_of(app, "#said") == (
            f"bob is held by {THERE} (host-b), not by this root's manager: run `cotal console` "
            "(or the verb) at its root"
        )
        log = app.query_one("#log", Log)
        await wait_until(lambda: "bob runs at" in "\n".join(log.lines))
        elsewhere = [
            f"bob runs at {THERE} (host-b): its log and transcript are files of that root; run "
            "`cotal console` there"
        ]
        assert list(log.lines) == elsewhere
        # Its events (replayed or live) do not load this root's files of a seat named bob.
        app.heard(event("turn.started", "bob", "ub"))
        await pilot.pause(0.3)
        assert list(log.lines) == elsewhere


def test_the_web_console_listens_on_loopback_alone() -> None:
    assert web.check_host("localhost") == "127.0.0.1"
    assert web.check_host("127.0.0.2") == "127.0.0.2"
    assert web.check_host("::1") == "::1"
    for host in ("0.0.0.0", "192.168.1.4", "::", "example.org"):
        with pytest.raises(Refusal) as refused:
            web.check_host(host)
        assert refused.value.code == Code.BAD_ARGS


def test_a_port_another_process_holds_is_refused_by_name() -> None:
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        with pytest.raises(Refusal) as refused:
            web.listen_socket("127.0.0.1", port)
    assert refused.value.code == Code.BAD_ARGS
    assert refused.value.message.startswith(f"cannot listen on 127.0.0.1:{port}: ")


def test_the_address_is_said_once_the_server_accepts_and_its_key_file_goes_with_it(
    tmp_path: Path,
) -> None:
    """`ready` is called on the server's own event loop: a connection opened there, before the
    loop runs again, is accepted only if the socket listens already. The page without its key
    is refused; SIGTERM stops the server and takes the key file with it."""
    (tmp_path / ".cotal").mkdir()
    seen: dict[str, object] = {}

    def ask_the_page(url: str) -> None:
        try:
            urllib.request.urlopen(url, timeout=10)
        except urllib.error.HTTPError as exc:
            seen["status"] = exc.code
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    def ready(url: str, keyed: Path) -> None:
        split = urlsplit(url)
        assert split.hostname is not None and split.port is not None
        with socket.create_connection((split.hostname, split.port), timeout=1):
            seen["accepted"] = True
        seen["keyed"] = keyed.read_text()
        threading.Thread(target=ask_the_page, args=(url,), daemon=True).start()

    web.serve(tmp_path, "127.0.0.1", 0, ready)
    assert seen["accepted"] is True
    assert seen["status"] == 403
    assert str(seen["keyed"]).startswith("http://127.0.0.1:")
    assert not (tmp_path / ".cotal" / web.URL_FILE).exists()
