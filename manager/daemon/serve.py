"""Daemon wiring: broker connection, Manager, control socket, signals, and the service
manager's readiness protocol.

Under systemd (`Type=notify`, deploy/systemd/cotal-manager@.service) the daemon sends:

* `READY=1` with `MAINPID=` and a `STATUS=` line once the control socket accepts connections,
  the broker footprint exists and every seat a predecessor left recorded has been re-adopted
  (relaunched and proven, or refused and shown as failed): `Manager.drain()` returns when no
  lifecycle operation is in flight, and the re-adoptions are counted as such before
  `Manager.run` reports started. A spawn that arrives meanwhile is waited for too.
* `STOPPING=1` as soon as a shutdown (the `shutdown` op, SIGTERM or SIGINT) begins.

Started directly rather than by `cotal up` there is no `.cotal/mesh.json`, which `cotal down`
and `cotal status` need to find the manager; the daemon then writes one naming itself.

Seat isolation (`connectors/sandbox.py`) is probed once here, said once in the log (a
warning when it cannot hide the manager's secrets), and the daemon makes itself undumpable
first, so `/proc/<daemon>/environ` and `/proc/<daemon>/mem` are closed to a process of its own
uid without CAP_SYS_PTRACE.
"""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

import anyio
import nats.errors
import structlog

from connectors import sandbox
from manager import logs
from manager.broker import grants
from manager.broker.connection import close_quietly, connect
from manager.control.server import ControlServer
from manager.daemon.core import Manager
from manager.daemon.notify import sd_notify
from manager.daemon.watchers import put_mark
from manager.procs import alive, pid_identity
from manager.workspace import roots
from manager.workspace.identity import load_or_create_identity
from manager.workspace.layout import Layout
from manager.workspace.private import ensure_private_dir, read_stable, write_private_atomic
from protocol.errors import Refusal
from protocol.mesh import MESH_CAP, MeshRecord, decode_mesh, encode_mesh
from protocol.names import check_space
from protocol.refusals import Code

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
            Code.BAD_TOKEN, f"control token {layout.control_token} is too short", "rerun `cotal up`"
        )
    return token


def record_mesh(layout: Layout, space: str, server: str, creds: Path | None) -> bool:
    """Write `.cotal/mesh.json` naming this process, when none names a manager that may be
    running; True when written.

    A record without a manager is `cotal up` starting this daemon: `up` names it itself once it
    answers, and keeps the embedded broker it started in the record, so that one is left alone.
    A record of a dead manager on the same server keeps its broker fields for `cotal down`.
    """
    existing: MeshRecord | None = None
    if os.path.lexists(layout.mesh):
        try:
            existing = decode_mesh(read_stable(layout.mesh, cap=MESH_CAP, what="mesh record").data)
        except (Refusal, OSError) as exc:
            log.warning("daemon.mesh_unreadable", path=str(layout.mesh), error=str(exc))
        if existing is not None and (existing.manager is None or alive(existing.manager)):
            return False
    keep = existing is not None and existing.server == server
    record = MeshRecord(
        version=1,
        space=space,
        server=server,
        creds=str(creds.resolve()) if creds else None,
        embedded_broker=existing.embedded_broker if keep and existing else None,
        broker_store=existing.broker_store if keep and existing else None,
        manager=pid_identity(os.getpid()),
    )
    write_private_atomic(layout.mesh, encode_mesh(record))
    return True


def seat_pids(manager: Manager) -> list[int]:
    """The pids of the seats' processes that have not been reaped: who the socket refuses."""
    return [
        seat.handle.pid
        for seat in list(manager.seats.values())
        if seat.handle is not None and seat.handle.pid is not None and not seat.handle.reaped
    ]


def announce_isolation() -> sandbox.Isolation:
    found = sandbox.probe()
    if found.hides_secrets:
        log.info("daemon.isolation", mode=found.mode, detail=found.detail)
    else:
        log.warning(
            "daemon.isolation_weak",
            mode=found.mode,
            detail=found.detail,
            consequence="seats can read .cotal/auth (control token, broker credential, signing "
            "key) and reach the control socket; only the socket's seat check stands",
            cure="run the manager where a mount namespace is allowed (root, or unprivileged user "
            "namespaces enabled); see docs/operations.md, Seat isolation",
        )
    return found


def register_root(layout: Layout) -> None:
    """Name this root in the host's registry, so every other root's seats are kept from it."""
    try:
        entry = roots.register(layout.root)
    except (Refusal, OSError) as exc:
        log.warning(
            "daemon.roots_registry_unusable",
            error=str(exc),
            consequence="seats of other cotal roots on this host are not kept from this root "
            "unless it lies under /tmp, /var/tmp or /dev/shm",
            cure="make the registry directory creatable (see docs/operations.md, Seat isolation)",
        )
        return
    log.info("daemon.root_registered", entry=str(entry))


class _Notifier:
    """The service-manager messages this daemon sends, each at most once."""

    def __init__(self) -> None:
        self._stopping = False

    def stopping(self) -> None:
        if not self._stopping:
            self._stopping = True
            sd_notify("STOPPING=1\nSTATUS=stopping")


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
    sandbox.make_undumpable()
    logs.configure(layout.manager_log)
    announce_isolation()
    register_root(layout)
    token = read_control_token(layout)
    identity = load_or_create_identity(layout, space)
    nc = await connect(server, creds, name=f"cotal-manager:{identity.instance_id}")
    # On a broker that scopes each host's credential, this instance is counted as this host's
    # before it writes anything as itself (its lease, a claim).
    await grants.join(nc, creds, identity.instance_id)
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
    notifier = _Notifier()
    try:
        await _serve_until_shutdown(manager, token, notifier, creds)
    finally:
        with anyio.CancelScope(shield=True):
            notifier.stopping()
            if not manager.stopping:
                await manager.stop_all_keep_footprint()
            # Only a stop that was asked for (a shutdown op, a signal) says so: a manager that
            # dies of an error leaves its `up` mark, and its seats read `lost`, as they are.
            if manager.shutdown_requested.is_set():
                await put_mark(manager.custody, identity.instance_id, "down")
            try:
                layout.socket.unlink()
            except FileNotFoundError:
                pass
            with anyio.move_on_after(5.0):
                try:
                    await nc.drain()
                except nats.errors.Error as exc:
                    # Reconnecting to a broker that is gone (a cut whose broker died, say):
                    # there is nothing left to drain into it.
                    log.warning("daemon.drain_failed", error=str(exc) or type(exc).__name__)
            await close_quietly(nc)
            log.info("daemon.stopped", pid=os.getpid())


async def _serve_until_shutdown(
    manager: Manager, token: str, notifier: _Notifier, creds: Path | None
) -> None:
    """Run the Manager and its control socket, tell the service manager when it is ready, and
    return once a shutdown was asked for and its reply is out."""
    layout = manager.layout
    async with anyio.create_task_group() as tg:
        await tg.start(manager.run)
        # After any claim a restore made for this start (it claims, then starts the manager):
        # the mark says this holder ran since, so its claims read `lost`, not `in transit`, if
        # it dies.
        await put_mark(manager.custody, manager.identity.instance_id, "up")
        control_server = ControlServer(
            layout.socket,
            token,
            manager.handle,
            seat_pids=lambda: seat_pids(manager),
        )
        await tg.start(control_server.serve)
        tg.start_soon(_signals, manager, notifier)
        if record_mesh(layout, manager.space, manager.server_url, creds):
            log.info("daemon.mesh_recorded", path=str(layout.mesh))
        if manager.in_flight:
            sd_notify(f"STATUS=re-adopting {len(manager.seats)} seat(s)")
        await manager.drain()
        log.info("daemon.ready", socket=str(layout.socket), seats=len(manager.seats))
        sd_notify(
            f"READY=1\nMAINPID={os.getpid()}\n"
            f"STATUS=serving {layout.root} ({len(manager.seats)} seat(s))"
        )
        await manager.shutdown_requested.wait()
        notifier.stopping()
        # The shutdown op's reply (written into the caller's socket buffer, which outlives this
        # process) must be out before the control server is cancelled.
        with anyio.move_on_after(2.0):
            await control_server.replies_written()
        tg.cancel_scope.cancel()


async def _signals(manager: Manager, notifier: _Notifier) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("daemon.signal", signal=signal.Signals(signum).name)
            notifier.stopping()
            await manager.stop_all_keep_footprint()
            manager.shutdown_requested.set()
            return
