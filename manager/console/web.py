"""`cotal console --web`: the same app, served by textual-serve on a loopback address.

textual-serve starts the app (`cotal console --root ROOT`, with its web driver) as a process of
its own for each page opened, and carries its screen over a websocket. Two things are added
here, because the page drives seats (stop, send, move, drain), and a seat runs on this host
too: the sandbox keeps a seat from the control socket and from `.cotal`, not from a loopback
port (docs/operations.md, "Monitoring" says the same of the metrics endpoint, which only reads).

- Loopback only: any other address is refused before anything listens (`check_host`).
- A key: the page is served only at `/?key=KEY` (a random key of this run, never printed or
  logged; written, with the address, to the private file `.cotal/console-web.url`, which the
  sandbox hides from seats). The page sets it as a strict, HTTP-only cookie and the websocket
  that runs the app is opened only with that cookie and from this server's own origin. A seat
  can reach the port; without the key it gets 403 and no app process is started.
- Said once it answers: the socket is bound and listening before the address is printed and the
  key file written (`listen_socket`, `ConsoleServer.run`), so what an operator or a script opens
  at once is the page, never a refused connection.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import secrets
import shlex
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from textual_serve.server import Server

from connectors.interpreter import own_python
from connectors.privatefs import write_private_atomic
from manager.workspace.layout import Layout
from protocol.errors import Refusal
from protocol.refusals import Code

COOKIE = "cotal_console"
URL_FILE = "console-web.url"


def check_host(host: str) -> str:
    """The address to listen on, when it is loopback (127.0.0.0/8 or ::1, written as an IP, or
    `localhost`); anything else is refused by name."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is None or not address.is_loopback:
        raise Refusal(
            Code.BAD_ARGS,
            f"--host {host!r} is not a loopback address: the web console stops, starts, sends "
            "to and moves seats, so it listens on this host alone",
            "leave --host out (127.0.0.1), and from another machine reach it through an SSH "
            "tunnel (ssh -L PORT:127.0.0.1:PORT host)",
        )
    return str(address)


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` (port 0: one the kernel picks) and listening, so the
    address is printed only once a browser pointed at it gets the page. A port another process
    holds is refused by name."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise Refusal(
            Code.BAD_ARGS,
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            "give another --port, or --port 0 for any free one",
        ) from None
    sock.setblocking(False)
    return sock


class ConsoleServer(Server):
    """textual-serve's server with the key checked at the page and at its websocket."""

    def __init__(self, root: Path, sock: socket.socket, key: str) -> None:
        command = shlex.join([*own_python("manager.cli"), "console", "--root", str(root)])
        host, port = sock.getsockname()[:2]
        super().__init__(command, host=host, port=port, title="cotal console")
        if ":" in host:
            self.public_url = f"http://[{host}]:{port}"
        self.sock = sock
        self.key = key

    def initialize_logging(self) -> None:
        # textual-serve's own handler logs each request richly to the terminal; a warning is
        # enough here, and a request line never carries the key into a log.
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")

    async def on_startup(self, app: web.Application) -> None:
        # textual-serve prints its banner here, before anything listens; the address is said
        # by `run` once the site accepts connections.
        pass

    def run(self, ready: Callable[[str], None]) -> None:
        """Serve on the bound socket until SIGINT or SIGTERM; `ready` is told the page's address
        once the server accepts connections on it. (textual-serve's own `serve` says it from
        the app's start-up, which aiohttp runs before the socket is handed to the server.)"""
        self.initialize_logging()
        asyncio.run(self._run(ready))

    async def _run(self, ready: Callable[[str], None]) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        # An open page holds its websocket (and its app process) until the shutdown closes it:
        # a stop waits this long for them, then cuts them.
        runner = web.AppRunner(await self._make_app(), handle_signals=False, shutdown_timeout=5)
        await runner.setup()
        try:
            await web.SockSite(runner, self.sock).start()
            ready(self.public_url + "/")
            await stop.wait()
        finally:
            await runner.cleanup()

    def _keyed(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.key.encode())

    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        if not self._keyed(request.query.get("key")):
            raise web.HTTPForbidden(
                text="this console needs its key: open the address in .cotal/console-web.url "
                "of the root it serves\n"
            )
        response: web.StreamResponse = await super().handle_index(request)
        response.set_cookie(COOKIE, self.key, httponly=True, samesite="Strict", path="/")
        return response

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        origin = request.headers.get("Origin")
        if not self._keyed(request.cookies.get(COOKIE)) or origin not in (None, self.public_url):
            raise web.HTTPForbidden(text="open the console's page with its key first\n")
        return await super().handle_websocket(request)


def serve(root: Path, host: str, port: int, ready: Callable[[str, Path], None]) -> None:
    """Serve until SIGINT or SIGTERM. `ready` is told the address (without its key) and the
    private file holding it with the key, once the server accepts connections there."""
    host = check_host(host)
    sock = listen_socket(host, port)
    key = secrets.token_urlsafe(24)
    url_file = Layout.at(root).control / URL_FILE

    def listening(url: str) -> None:
        write_private_atomic(url_file, f"{url}?key={key}\n".encode())
        ready(url, url_file)

    try:
        ConsoleServer(root, sock, key).run(listening)
    finally:
        sock.close()
        url_file.unlink(missing_ok=True)
