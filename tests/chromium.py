"""A page loaded in headless Chromium (Debian's /usr/bin/chromium) over the DevTools protocol:
what the web console's test and `make demo` use to see `cotal console --web` as a browser does.

No browser is ever downloaded: the system's Chromium is run with every background fetch off
(this network is closed, and Chromium would otherwise keep trying), each host name but
127.0.0.1 resolving to nothing at once (the page's web font included), and a profile of its
own. textual-serve's page draws the terminal on a canvas, so the text on it is not in the DOM:
`page_text` is what the page's websocket carried to the terminal (every frame the app drew),
its control sequences stripped, captured by a script installed before the page's own.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]
# Installed before the page's scripts: keeps what each websocket receives, as text.
CAPTURE = """
window.__cotalScreen = [];
const Native = window.WebSocket;
window.WebSocket = function (url, protocols) {
  const ws = protocols === undefined ? new Native(url) : new Native(url, protocols);
  const decoder = new TextDecoder();
  ws.addEventListener("message", (e) => {
    if (typeof e.data !== "string") {
      window.__cotalScreen.push(decoder.decode(new Uint8Array(e.data), {stream: true}));
    }
  });
  return ws;
};
window.WebSocket.prototype = Native.prototype;
"""
OPAQUE = (
    "(() => { const t = document.querySelector('.textual-terminal');"
    " return t !== null && getComputedStyle(t).opacity === '1'; })()"
)
_CONTROL = re.compile(r"\x1b\[[0-9;?<>=$]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b.")


class Page:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self.ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        with anyio.fail_after(30):
            while True:
                reply = await self.ws.receive_json()
                if reply.get("id") == msg_id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    result: dict[str, Any] = reply.get("result", {})
                    return result

    async def evaluate(self, expression: str) -> Any:
        out = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return out.get("result", {}).get("value")

    async def page_text(self) -> str:
        raw = await self.evaluate("(window.__cotalScreen || []).join('')")
        return _CONTROL.sub("", raw or "")

    async def screenshot(self, path: Path) -> int:
        shot = await self.call("Page.captureScreenshot", format="png")
        data = base64.b64decode(shot["data"])
        path.write_bytes(data)
        return len(data)


async def _devtools_port(proc: Process) -> int:
    assert proc.stderr is not None
    lines = BufferedByteReceiveStream(proc.stderr)
    with anyio.fail_after(30):
        while True:
            try:
                line = (await lines.receive_until(b"\n", 65536)).decode(errors="replace")
            except (anyio.EndOfStream, anyio.IncompleteRead):
                raise RuntimeError(
                    "chromium exited before its DevTools endpoint listened"
                ) from None
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if m:
                return int(m.group(1))


@contextlib.asynccontextmanager
async def browser(profile: Path, *, width: int = 1600, height: int = 1000) -> AsyncIterator[Page]:
    """Headless Chromium with one blank page, driven over DevTools; stopped and reaped on exit."""
    proc = await anyio.open_process(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"]
        + ["about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        port = await _devtools_port(proc)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as listing:
                targets = json.loads(await listing.text())
            [target] = [t for t in targets if t.get("type") == "page"]
            async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.call("Page.enable")
                await page.call("Page.addScriptToEvaluateOnNewDocument", source=CAPTURE)
                yield page
    finally:
        with anyio.CancelScope(shield=True):
            proc.terminate()
            with anyio.move_on_after(10):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await proc.aclose()


async def shoot(url: str, out: Path, profile: Path, names: list[str], timeout: float = 60) -> str:
    """Load `url`, wait until every one of `names` has been drawn on the page's terminal, let
    the page paint, and save a PNG screenshot to `out`. Returns the page's text; raises
    TimeoutError (with what was drawn) when a name never shows."""
    async with browser(profile) as page:
        await page.call("Page.navigate", url=url)
        text = ""
        try:
            with anyio.fail_after(timeout):
                while True:
                    text = await page.page_text()
                    if all(name in text for name in names):
                        break
                    await anyio.sleep(0.1)
                # The terminal shows once its first frame arrived, after a 0.3 s fade in:
                # the screenshot waits for it to be opaque.
                while True:
                    if await page.evaluate(OPAQUE):
                        break
                    await anyio.sleep(0.05)
        except TimeoutError:
            raise TimeoutError(
                f"not all of {names} drawn in {timeout} s; the page drew: {text!r}"
            ) from None
        await page.screenshot(out)
        return text
