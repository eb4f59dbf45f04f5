"""`cotal manager serve` under a service manager's readiness protocol, played by the test: a
Unix datagram socket named by `$NOTIFY_SOCKET`, as systemd passes to a `Type=notify` unit.

READY=1 must mean the control socket answers and the seats a predecessor left are re-adopted;
the daemon records itself in `.cotal/mesh.json` so `cotal status` and `cotal down` work on a
manager no `cotal up` started; STOPPING=1 comes when it shuts down.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process, SocketAttribute, UNIXDatagramSocket

from manager.coord.mesh import probe_status, request
from manager.daemon.notify import sd_notify
from manager.workspace.layout import Layout
from protocol import control
from tests.conftest import Cli, SharedBroker, cotal_env
from tests.helpers import wait_gone

pytestmark = pytest.mark.anyio

TIMEOUT = 60


def fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().splitlines() if "=" in line)


async def until_message(sock: UNIXDatagramSocket, key: str) -> tuple[dict[str, str], list[str]]:
    """The first datagram that sets `key`, and the ones before it."""
    before: list[str] = []
    while True:
        data, _ = await sock.receive()
        got = fields(data)
        if key in got:
            return got, before
        before.append(data.decode())


def queued(sock: UNIXDatagramSocket) -> list[str]:
    """Every datagram already waiting on the socket, without waiting for more."""
    raw: socket.socket = sock.extra(SocketAttribute.raw_socket)
    out = []
    while True:
        try:
            out.append(raw.recv(65536, socket.MSG_DONTWAIT).decode())
        except BlockingIOError:
            return out


@asynccontextmanager
async def manager_serving(
    root: Path, broker: SharedBroker, notify: Path, log: Path
) -> AsyncIterator[Process]:
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = await anyio.open_process(
            [
                sys.executable,
                "-m",
                "manager.cli",
                "manager",
                "serve",
                "--root",
                str(root),
                "--server",
                broker.url,
                "--creds",
                broker.creds,
            ],
            env=cotal_env({"NOTIFY_SOCKET": str(notify)}),
            cwd=root,
            stdin=None,
            stdout=out,
            stderr=out,
        )
    finally:
        os.close(out)
    try:
        yield proc
    finally:
        with anyio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
            with anyio.move_on_after(10):
                await proc.wait()


async def test_ready_after_the_socket_answers_and_seats_are_readopted_then_down_works(
    root: Path, cli: Cli, shared_broker: SharedBroker, tmp_path: Path
) -> None:
    layout = Layout.at(root)
    notify = tmp_path / "notify.sock"
    async with await anyio.create_unix_datagram_socket(local_path=notify) as sock:
        async with manager_serving(root, shared_broker, notify, tmp_path / "serve1.out") as proc:
            with anyio.fail_after(TIMEOUT):
                ready, _ = await until_message(sock, "READY")
                # Nothing else runs between READY and these: the socket must already answer.
                status = await probe_status(layout)
            assert ready["READY"] == "1" and ready["MAINPID"] == str(proc.pid)
            assert status is not None and status.pid == proc.pid
            record = json.loads(layout.mesh.read_text())
            assert record["manager"]["pid"] == proc.pid and record["server"] == shared_broker.url
            assert record["creds"] == str(Path(shared_broker.creds).resolve())
            assert record.get("embeddedBroker") is None

            await anyio.to_thread.run_sync(cli.json, "spawn", "alice", "--agent", "scribe")
            [seat] = await anyio.to_thread.run_sync(cli.ps)
            # A crash of the manager (not a shutdown) leaves the seat recorded for its successor.
            proc.send_signal(signal.SIGKILL)
            await wait_gone([proc.pid, seat["pid"]])

        # A process of alice's lifecycle still alive holds her re-adoption back (the successor
        # must prove none survives), so READY cannot come while it lives.
        survivor = await anyio.open_process(
            ["sleep", "300"], env={"COTAL_LIFECYCLE_UID": seat["lifecycleUid"], "PATH": "/bin"}
        )
        try:
            async with manager_serving(
                root, shared_broker, notify, tmp_path / "serve2.out"
            ) as proc:
                with anyio.fail_after(TIMEOUT):
                    # Sent once the control socket listens, before re-adoption is awaited.
                    adopting, _ = await until_message(sock, "STATUS")
                    assert await probe_status(layout) is not None
                assert adopting == {"STATUS": "re-adopting 1 seat(s)"}
                early = queued(sock)
                assert not any("READY=1" in d for d in early), early
                survivor.kill()
                await survivor.wait()
                with anyio.fail_after(TIMEOUT):
                    ready, _ = await until_message(sock, "READY")
                    rows = await request(root, control.PS, control.NoArgs())
                assert ready["MAINPID"] == str(proc.pid)
                # Re-adoption is over at READY: the seat runs again under the new manager.
                assert [(r.name, r.state) for r in rows] == [("alice", "running")]
                assert rows[0].pid != seat["pid"]
                # The record named the dead manager; the new one replaced it.
                assert json.loads(layout.mesh.read_text())["manager"]["pid"] == proc.pid

                shown = await anyio.to_thread.run_sync(cli.json, "status")
                assert shown["pid"] == proc.pid
                down = await anyio.to_thread.run_sync(cli.json, "down")
                assert down["manager"] == proc.pid
                assert [s["name"] for s in down["seats"]] == ["alice"]
                with anyio.fail_after(TIMEOUT):
                    stopping, _ = await until_message(sock, "STOPPING")
                    assert await proc.wait() == 0
                assert stopping["STOPPING"] == "1"
                assert not layout.mesh.exists()
        finally:
            with anyio.CancelScope(shield=True):
                if survivor.returncode is None:
                    survivor.kill()
                await survivor.wait()


async def test_a_record_left_by_cotal_up_is_not_replaced(
    root: Path, cli: Cli, shared_broker: SharedBroker, tmp_path: Path
) -> None:
    """`cotal up` writes the record before its manager starts and names the manager once it
    answers; the daemon must not overwrite that record (it may name an embedded broker)."""
    layout = Layout.at(root)
    layout.mesh.parent.mkdir(mode=0o700)
    placed = json.dumps(
        {"version": 1, "space": "main", "server": shared_broker.url, "creds": shared_broker.creds}
    )
    layout.mesh.write_text(placed)
    layout.mesh.chmod(0o600)
    notify = tmp_path / "notify.sock"
    async with await anyio.create_unix_datagram_socket(local_path=notify) as sock:
        async with manager_serving(root, shared_broker, notify, tmp_path / "serve.out") as proc:
            with anyio.fail_after(TIMEOUT):
                await until_message(sock, "READY")
            assert layout.mesh.read_text() == placed
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(TIMEOUT):
                stopping, _ = await until_message(sock, "STOPPING")
                await proc.wait()
            assert stopping["STOPPING"] == "1"


async def test_sd_notify_abstract_socket_unset_and_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"cotal-test-{os.getpid()}-{tmp_path.name}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(b"\0" + name.encode())
        listener.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sd_notify("STATUS=abstract")
        assert listener.recv(4096) == b"STATUS=abstract"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not sd_notify("READY=1")
    # A socket gone away (or never there) is logged, never raised into the daemon.
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody.sock"))
    assert not sd_notify("READY=1")
    monkeypatch.setenv("NOTIFY_SOCKET", "relative.sock")
    assert not sd_notify("READY=1")
