"""Daemon wiring: broker connection, Manager, control socket, signals."""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

import anyio
import structlog

from manager import logs
from manager.broker.connection import connect
from manager.control.server import ControlServer
from manager.daemon.core import Manager
from manager.workspace.identity import load_or_create_identity
from manager.workspace.layout import Layout
from manager.workspace.private import ensure_private_dir, read_stable, write_private_atomic
from protocol.errors import Refusal
from protocol.names import check_space

log = structlog.get_logger("cotal.daemon")


def read_control_token(layout: Layout) -> str:
    if not layout.control_token.exists() and not layout.control_token.is_symlink():
        # Started directly (a service manager rather than `cotal up`): mint the token the CLI
        # will read; `up` writes a fresh one itself before starting a daemon.
        ensure_private_dir(layout.auth)
        write_private_atomic(layout.control_token, secrets.token_hex(32).encode() + b"\n")
    data = read_stable(
        layout.control_token, cap=1024, what="control token", require_private=True
    ).data
    token = data.decode().strip()
    if len(token) < 32:
        raise Refusal(
            "bad-token", f"control token {layout.control_token} is too short", "rerun `cotal up`"
        )
    return token


async def serve(
    root: Path,
    space: str,
    server: str,
    creds: Path | None,
    resume_attempt: str | None = None,
    replicas: int = 1,
) -> None:
    layout = Layout.at(root)
    check_space(space)
    ensure_private_dir(layout.control)
    ensure_private_dir(layout.logs)
    logs.configure(layout.manager_log)
    token = read_control_token(layout)
    identity = load_or_create_identity(layout, space)
    nc = await connect(server, creds, name=f"cotal-manager:{identity.instance_id}")
    manager = Manager(
        layout, space, nc, identity, server, resume_attempt_id=resume_attempt, replicas=replicas
    )
    log.info(
        "daemon.starting",
        pid=os.getpid(),
        root=str(layout.root),
        space=space,
        instance=identity.instance_id,
    )
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(manager.run)
            await tg.start(ControlServer(layout.socket, token, manager.handle).serve)
            tg.start_soon(_signals, manager)
            log.info("daemon.ready", socket=str(layout.socket))
            await manager.shutdown_requested.wait()
            # Let the shutdown reply reach the caller before the socket goes away.
            await anyio.sleep(0.2)
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if not manager.stopping:
                await manager.stop_all_keep_footprint()
            try:
                layout.socket.unlink()
            except FileNotFoundError:
                pass
            with anyio.move_on_after(5.0):
                await nc.drain()
            log.info("daemon.stopped", pid=os.getpid())


async def _signals(manager: Manager) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("daemon.signal", signal=signal.Signals(signum).name)
            await manager.stop_all_keep_footprint()
            manager.shutdown_requested.set()
            return
