"""`cotal console` (issue 40, item 4) against a real manager, broker and scribe seats: in a real
terminal (tmux, 160x48, whatever COLUMNS and LINES say), every cell of the seats' rows is on
screen, a `cotal stop` run beside it shows, and the console's own stop key, once confirmed,
really stops a seat; served with `--web`, a headless Chromium loads the page and the seats are
drawn on it (tests/chromium.py), with a screenshot as evidence. The widgets' logic is tested
headless with Textual's pilot (tests/unit/test_console_app.py)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import anyio
import pytest

from tests.chromium import CHROMIUM, shoot
from tests.conftest import Cli, cotal_env
from tests.helpers import processes_mentioning, ps_row, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]


def seated(cli: Cli, *names: str) -> None:
    for name in names:
        cli.run("spawn", name, "--agent", "scribe")


class Tmux:
    """A tmux server of the test's own (its socket under tmp_path), one session 160x48."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket

    def run(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(
            ["tmux", "-S", str(self.socket), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=check,
            # COLUMNS and LINES as a parent may export them (pytest-xdist's workers do): the
            # console must draw on the terminal's own 160x48 all the same.
            env=cotal_env({"TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"}),
        )
        return out.stdout

    def start(self, command: list[str]) -> None:
        """The session, its one window running `command` (in the test's environment, which the
        new server inherits)."""
        self.run("new-session", "-d", "-x", "160", "-y", "48", "-s", "console", shlex.join(command))

    def sessions(self) -> str:
        return self.run("list-sessions", check=False)

    def kill(self) -> None:
        self.run("kill-server", check=False)

    def screen(self) -> list[str]:
        return self.run("capture-pane", "-p", "-t", "console").splitlines()

    async def wait_for(self, drawn: Callable[[], bool], what: str, timeout: float = 30) -> None:
        """Wait until `drawn` holds of the screen; a timeout fails naming `what`, with the
        screen as it was last captured."""
        try:
            await wait_until(drawn, timeout=timeout)
        except TimeoutError:
            screen = "\n".join(self.screen())
            raise AssertionError(
                f"not drawn in {timeout} s: {what}; the screen:\n{screen}"
            ) from None

    def row(self, name: str) -> list[str]:
        """The seat table's row of `name`, split into its cells (empty when not on screen)."""
        for line in self.screen():
            cells = line.split("│")[0].split()
            if cells and cells[0] == name:
                return cells
        return []


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
async def test_the_console_in_a_terminal_shows_seats_follows_a_stop_and_stops_one(
    mesh: Cli, tmp_path: Path
) -> None:
    seated(mesh, "alice", "bob")
    tmux = Tmux(tmp_path / "tmux.sock")
    command = [sys.executable, "-m", "manager.cli", "console", "--root", str(mesh.root)]
    tmux.start(command)
    try:
        # NAME HOST STATE TURN INBOX DEAD TOKENS COST INSTANCE, every cell waited for: a row
        # cut short is a console drawn narrower than its terminal (an inherited COLUMNS, once),
        # or a capture landing while tmux still applies a frame.
        instance = mesh.json("status")["instanceId"]
        idle = ["running", "idle", "0", "0", "-", "-", instance]
        await tmux.wait_for(
            lambda: tmux.row("alice")[2:] == idle and tmux.row("bob")[2:] == idle, "both idle"
        )
        await tmux.wait_for(lambda: "events: live" in tmux.screen()[1], "events live")

        # A stop from outside: its event wakes the console, which reads the table again.
        mesh.run("stop", "bob")
        await tmux.wait_for(lambda: tmux.row("bob")[2:4] == ["stopped", "-"], "bob stopped", 10)
        await tmux.wait_for(lambda: tmux.row("alice")[2:] == idle, "alice still idle")

        # The console's own stop: the key asks first; `y` answers; the seat really stops.
        tmux.run("send-keys", "-t", "console", "x")
        await tmux.wait_for(lambda: any("Stop alice?" in line for line in tmux.screen()), "ask")
        assert ps_row(mesh, "alice")["state"] == "running"
        tmux.run("send-keys", "-t", "console", "y")
        await wait_until(lambda: ps_row(mesh, "alice")["state"] == "stopped", timeout=30)
        await tmux.wait_for(lambda: tmux.row("alice")[2:3] == ["stopped"], "alice stopped")
        await tmux.wait_for(
            lambda: any("stopped alice (exit SIGTERM)" in line for line in tmux.screen()),
            "the stop's line",
        )
        tmux.run("send-keys", "-t", "console", "q")
        await wait_until(lambda: "console" not in tmux.sessions(), timeout=10)
    finally:
        tmux.kill()


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed")
async def test_the_web_console_in_headless_chromium_draws_the_seats(
    mesh: Cli, tmp_path: Path
) -> None:
    seated(mesh, "alice", "bob")
    server = await anyio.open_process(
        [sys.executable, "-m", "manager.cli", "console", "--web", "--port", "0", "--json"]
        + ["--root", str(mesh.root)],
        env=cotal_env(),
        stderr=subprocess.DEVNULL,
    )
    try:
        assert server.stdout is not None
        with anyio.fail_after(30):
            first = await server.stdout.receive()
        served = json.loads(first.decode().splitlines()[0])
        url, key_file = served["url"], Path(served["keyFile"])
        assert url.startswith("http://127.0.0.1:") and "key" not in url
        assert key_file == mesh.root / ".cotal" / "console-web.url"
        assert key_file.stat().st_mode & 0o777 == 0o600
        keyed = key_file.read_text().strip()
        assert keyed.startswith(url + "?key=")

        # Without the key, the page is refused: nothing reachable on loopback drives seats.
        async with aiohttp.ClientSession() as http:
            async with http.get(url) as bare:
                assert bare.status == 403
            async with http.get(url + "ws") as socket_only:
                assert socket_only.status == 403

        shot = tmp_path / "console.png"
        text = await shoot(keyed, shot, tmp_path / "chromium", ["alice", "bob", "running"])
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
        assert "NEEDS YOU" in text and "events: live" in text
    finally:
        server.terminate()
        with anyio.fail_after(20):
            await server.wait()
        await server.aclose()
    # The server takes its key with it, and the app it ran for the page ends with it.
    assert not key_file.exists()
    await wait_until(lambda: not processes_mentioning(f"console --root {mesh.root}"), timeout=10)
