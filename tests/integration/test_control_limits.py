"""What a caller of the control socket may cost the daemon is bounded: floods of connections,
descriptor exhaustion, deeply nested frames and strings the OS cannot take leave the daemon up
and its seats served, and each bad field is refused by name."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli, cotal_env
from tests.helpers import frame

pytestmark = pytest.mark.usefixtures("isolated_home")


def _up_limited(cli: Cli, nofile: int) -> int:
    """`cotal up` with the daemon (and its broker) under RLIMIT_NOFILE `nofile`; its pid."""
    subprocess.run(
        ["prlimit", f"--nofile={nofile}:{nofile}", "--", sys.executable, "-m", "manager.cli"]
        + ["up", "--detach", "--root", str(cli.root)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        env=cotal_env(),
        cwd=cli.root,
    )
    pid = int(json.loads((cli.root / ".cotal" / "mesh.json").read_text())["manager"]["pid"])
    limits = Path(f"/proc/{pid}/limits").read_text()
    [line] = [ln for ln in limits.splitlines() if ln.startswith("Max open files")]
    assert line.split()[3:5] == [str(nofile), str(nofile)], line
    return pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


@contextlib.contextmanager
def _connections(path: Path, n: int) -> Iterator[list[socket.socket]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = n + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            socks.append(s)
            s.settimeout(10)
            s.connect(str(path))
        yield socks
    finally:
        for s in socks:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _connect(cli: Cli) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(cli.root / ".cotal" / "manager.sock"))
    return s


def _read_reply(s: socket.socket) -> dict[str, object] | None:
    head = b""
    while len(head) < 4:
        chunk = s.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    (n,) = struct.unpack(">I", head)
    body = b""
    while len(body) < n:
        chunk = s.recv(n - len(body))
        if not chunk:
            return None
        body += chunk
    reply: dict[str, object] = json.loads(body)
    return reply


def _session(cli: Cli) -> socket.socket:
    s = _connect(cli)
    token = (cli.root / ".cotal" / "auth" / "control.token").read_text().strip()
    s.sendall(frame(json.dumps({"op": "hello", "token": token}).encode()))
    assert (_read_reply(s) or {}).get("ok") is True
    return s


def _log(cli: Cli) -> list[dict[str, object]]:
    text = (cli.root / ".cotal" / "logs" / "manager.log").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("nofile", [1024, 64])
def test_a_connection_flood_leaves_the_daemon_and_its_seat_serving(cli: Cli, nofile: int) -> None:
    """1,100 idle connections: at 1,024 descriptors the caps keep the daemon far from the
    limit; at 64 its accept runs out of descriptors and must ride that out. Either way the
    seat keeps answering and the operator's CLI gets in while the flood is still open."""
    pid = _up_limited(cli, nofile)
    try:
        cli.json("spawn", "w1")
        sock = cli.root / ".cotal" / "manager.sock"
        with _connections(sock, 1100):
            assert _alive(pid)
            assert cli.json("send", "w1", "remember the phrase amber-kite-5", "--wait")["reply"]
            assert cli.json("status")["state"] == "active"
            assert len(os.listdir(f"/proc/{pid}/fd")) < nofile
        assert _alive(pid)
        [row] = cli.ps()
        assert row["name"] == "w1" and row["state"] == "running"
        if nofile < 1024:
            events = [e for e in _log(cli) if e.get("event") == "control.accept_failed"]
            assert events and events[0]["reason"] == "descriptors exhausted"
            # Said once per burst, not once per failed accept.
            assert len(events) < 10
    finally:
        cli.run("down", check=False)


def test_a_deeply_nested_frame_is_refused_by_name_and_closed(mesh: Cli) -> None:
    nested = b"[" * 10_000 + b"]" * 10_000
    with _session(mesh) as s:
        s.sendall(frame(b'{"id":7,"op":"spawn","args":' + nested + b"}"))
        reply = _read_reply(s)
        assert reply is not None and reply["ok"] is False
        assert reply["error"] == {
            "code": "frame-too-deep",
            "message": "frame nests arrays or objects deeper than 64 levels",
        }
        assert _read_reply(s) is None
    # Before hello: closed with no reply, like every other bad first frame.
    with _connect(mesh) as s:
        s.sendall(frame(b'{"op":"hello","token":' + nested + b"}"))
        assert s.recv(65536) == b""
    assert not [e for e in _log(mesh) if e.get("event") == "control.internal_error"]
    assert mesh.json("status")["state"] == "active"


def _call(s: socket.socket, op: str, args: dict[str, object]) -> dict[str, object]:
    s.sendall(frame(json.dumps({"id": 3, "op": op, "args": args}).encode()))
    reply = _read_reply(s)
    assert reply is not None
    return reply


def test_nul_bearing_and_oversized_strings_are_refused_by_field_name(mesh: Cli) -> None:
    with _session(mesh) as s:
        reply = _call(s, "spawn", {"name": "w1", "cwd": str(mesh.root) + "\x00/etc"})
        assert reply["ok"] is False
        assert reply["error"] == {
            "code": "bad-cwd",
            "message": "spawn: argument 'cwd' holds a NUL byte; pass cwd without NUL bytes",
        }
        reply = _call(s, "spawn", {"name": "w\x001"})
        assert (reply["error"] or {})["code"] == "bad-name"  # type: ignore[index]
        reply = _call(s, "spawn", {"name": "w1", "cwd": "/" + "a" * 5000})
        assert reply["error"] == {
            "code": "bad-cwd",
            "message": "spawn: argument 'cwd' is 5001 characters, over the 4096-character cap; "
            "pass a shorter cwd",
        }
        reply = _call(s, "stop-seat", {"name": "x" * 900})
        assert (reply["error"] or {})["code"] != "internal-error"  # type: ignore[index]
        # Free text is bounded by the op's frame cap, not by the path cap.
        reply = _call(s, "send", {"name": "nobody", "text": "t" * 5000})
        assert (reply["error"] or {})["code"] != "bad-text"  # type: ignore[index]
        assert _call(s, "status", {})["ok"] is True
    assert not [e for e in _log(mesh) if e.get("event") == "control.internal_error"]


@pytest.mark.anyio
async def test_a_client_over_the_connection_cap_is_told_busy_not_refused(tmp_path: Path) -> None:
    """At the cap a newcomer is closed before its hello is read; it must hear `control-busy`
    (its token was fine), and the connection already in must keep being served."""
    import anyio

    from manager.control.client import ControlClient
    from manager.control.server import ControlServer
    from protocol.errors import Refusal

    async def handler(op: str, _args: object) -> object:
        return {"op": op}

    token = "ab" * 32
    path = tmp_path / "s.sock"
    server = ControlServer(path, token, handler, refuse_marked=False, max_connections=1)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            first = await ControlClient.connect(path, token)
            try:
                with pytest.raises(Refusal) as refused:
                    await ControlClient.connect(path, token)
                assert refused.value.code == "control-busy"
                assert "at most 1 connections at once" in refused.value.message
                assert await first.call("status") == {"op": "status"}
                # The server stops before the client hangs up, so no read of its is woken
                # by the hang-up while it is being cancelled.
                tg.cancel_scope.cancel()
            finally:
                await first.aclose()


@pytest.mark.anyio
async def test_the_blocking_one_shot_client_says_what_the_async_client_says(
    tmp_path: Path,
) -> None:
    """`cotal ps` and the other one-request commands ask over a blocking socket, no event loop
    (manager/control/blocking.py): against a real control server it gets the reply, and each
    way a request can fail is refused with the async client's code and words."""
    import anyio
    import anyio.to_thread

    from manager.control import blocking
    from manager.control.client import ControlClient
    from manager.control.server import ControlServer
    from protocol import control
    from protocol.errors import Refusal

    async def handler(op: str, _args: object) -> object:
        if op == "fleet":
            await anyio.sleep_forever()
        return {"text": "cotal_up 1\n"}

    token = "cd" * 32
    path = tmp_path / "s.sock"

    def ask(
        op: control.Op[control.NoArgs, Any],
        key: str = token,
        timeout: float = 5.0,
        at: Path = path,
    ) -> object:
        return blocking.request(at, key, op, control.NoArgs(), timeout)

    async def refused(*args: Any) -> Refusal:
        with pytest.raises(Refusal) as caught:
            await anyio.to_thread.run_sync(ask, *args)
        return caught.value

    gone = await refused(control.METRICS)
    assert (gone.code, gone.message) == (
        "daemon-unreachable",
        f"no manager answers at {path} (No such file or directory)",
    )
    server = ControlServer(path, token, handler, refuse_marked=False, max_connections=2)
    # A server of its own for the request that never gets its reply, whose connection stays
    # in use until the server stops.
    stuck = ControlServer(tmp_path / "t.sock", token, handler, refuse_marked=False)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            await tg.start(stuck.serve)
            reply = await anyio.to_thread.run_sync(ask, control.METRICS)
            assert reply == control.MetricsReply(text="cotal_up 1\n")

            wrong = await refused(control.METRICS, "ef" * 32)
            assert (wrong.code, wrong.message) == (
                "auth-refused",
                "the manager closed the connection at hello",
            )

            first = await ControlClient.connect(path, token)
            second = await ControlClient.connect(path, token)
            try:
                busy = await refused(control.METRICS)
                assert busy.code == "control-busy"
                assert "at most 2 connections at once" in busy.message
            finally:
                await first.aclose()
                await second.aclose()

            slow = await refused(control.FLEET, token, 0.3, tmp_path / "t.sock")
            assert (slow.code, slow.message) == ("timeout", "fleet got no reply within 0s")
            tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_manager_that_accepts_but_never_answers_hello_is_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manager that accepted the connection has not closed the door: a hello left unanswered
    (a daemon still draining a flood, on a busy host) is `timeout` in both clients, never
    `auth-refused`."""
    import anyio
    import anyio.to_thread

    from manager.control import blocking
    from manager.control.client import ControlClient
    from protocol import control
    from protocol.errors import Refusal

    path = tmp_path / "mute.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    monkeypatch.setattr(blocking, "HELLO_WAIT_S", 1.0)
    try:
        with anyio.fail_after(20):
            with pytest.raises(Refusal) as caught:
                await ControlClient.connect(path, "ab" * 32, hello_within=1.0)
            assert (caught.value.code, caught.value.message) == (
                "timeout",
                "hello got no reply within 1s",
            )
            with pytest.raises(Refusal) as caught:
                await anyio.to_thread.run_sync(
                    blocking.request, path, "ab" * 32, control.METRICS, control.NoArgs(), 5.0
                )
            assert (caught.value.code, caught.value.message) == (
                "timeout",
                "hello got no reply within 1s",
            )
    finally:
        listener.close()
