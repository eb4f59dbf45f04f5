"""Bringing a workspace root's mesh up and down: broker, control token, daemon, proof of exit."""

from __future__ import annotations

import functools
import os
import secrets
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import msgspec

from connectors.interpreter import own_python
from manager import eventloop
from manager.broker import embedded
from manager.control.client import ControlSession
from manager.control.oneshot import control as control
from manager.control.oneshot import read_token as read_token
from manager.control.oneshot import request as request
from manager.control.oneshot import run_request as run_request
from manager.coord.warm import WarmManager, warm_manager
from manager.procs import alive, pid_identity, prove_gone
from manager.workspace.layout import Layout
from manager.workspace.meshfile import read_mesh as read_mesh
from manager.workspace.meshfile import write_mesh as write_mesh
from manager.workspace.private import ensure_private_dir, write_private_atomic
from protocol import control as ops
from protocol.errors import Refusal
from protocol.mesh import MeshRecord, ProcRef
from protocol.names import check_space
from protocol.refusals import Code

A = TypeVar("A")
R = TypeVar("R")
Report = Callable[[str], None]
DAEMON_START_TIMEOUT_S = 20.0
DAEMON_EXIT_TIMEOUT_S = 30.0


def _noop(_text: str) -> None:
    pass


async def probe_status(layout: Layout) -> ops.StatusReply | None:
    async with control(layout) as session:
        return await session.status()


def daemon_status(layout: Layout) -> ops.StatusReply | None:
    """The running manager's status for this root, or None when none answers (or none was ever
    started here: no token)."""
    return eventloop.run(probe_status, layout)


@dataclass(frozen=True)
class _Launch:
    layout: Layout
    record: MeshRecord
    # `cotal manager serve ...`: what a warm manager is handed, and a cold one runs.
    serve_args: list[str]
    token: str
    # The embedded broker this command started, which a refusal of this command must stop;
    # None for a broker it found running (it was the operator's before) or a `--server` one.
    started_broker: ProcRef | None = None

    @property
    def argv(self) -> list[str]:
        return [*own_python("manager.cli"), *self.serve_args]


async def _provision(
    layout: Layout,
    session: ControlSession,
    *,
    space: str,
    server: str | None,
    creds: str | None,
    resume_attempt: str | None,
    replicas: int | None,
    report: Report,
    broker: embedded.BrokerInfo | None = None,
) -> _Launch:
    """Everything before the manager runs: the refusal if one already answers, a fresh control
    token, the broker (embedded unless `server`), the mesh record and the manager's argv."""
    check_space(space)
    _control_dirs(layout)
    existing = read_mesh(layout)
    if existing is not None and layout.control_token.exists():
        status = await session.status()
        if status is not None:
            raise Refusal(
                Code.ALREADY_UP,
                f"a manager (pid {status.pid}) already serves {layout.root}",
                "use it, or `cotal down` first",
            )
    await session.forget()
    token = secrets.token_hex(32)
    write_private_atomic(layout.control_token, token.encode() + b"\n")
    server, creds_path, broker_ref, started = await _broker_for_launch(
        layout, existing, server, creds, broker, report
    )
    try:
        record = MeshRecord(
            version=1,
            space=space,
            server=server,
            creds=str(creds_path) if creds_path else None,
            embedded_broker=broker_ref,
            broker_store=str(layout.nats_store) if broker_ref else None,
        )
        write_mesh(layout, record)
    except BaseException:
        await stop_started_broker(started)
        raise
    serve_args = _serve_args(layout, space, server, creds_path, resume_attempt, replicas)
    return _Launch(layout, record, serve_args, token, started)


def _control_dirs(layout: Layout) -> None:
    ensure_private_dir(layout.control)
    # Nothing under .cotal is ever the operator's to commit (tokens, the broker store, logs), so
    # a root that is a git work tree does not list it as untracked.
    ignore = layout.control / ".gitignore"
    if not ignore.exists():
        write_private_atomic(ignore, b"*\n")
    ensure_private_dir(layout.auth)
    ensure_private_dir(layout.logs)


async def _broker_for_launch(
    layout: Layout,
    existing: MeshRecord | None,
    server: str | None,
    creds: str | None,
    broker: embedded.BrokerInfo | None,
    report: Report,
) -> tuple[str, Path | None, ProcRef | None, ProcRef | None]:
    """The broker the manager will run on: its URL, credential, identity when embedded, and
    the identity of one this command started (which a refusal must stop)."""
    reused = _live_embedded_broker(layout, existing) if server is None else None
    if broker is not None:
        # The caller started this root's broker itself moments ago (a resume imports the
        # inboxes into it first): the manager is its client from here on, not a second start.
        return broker.url, Path(broker.creds), broker.identity, None
    if reused is not None:
        # The manager died and left its broker running: a second broker on the same store
        # is exactly what must never happen, so the new manager joins this one.
        assert existing is not None
        report(f"reusing the embedded broker left running (pid {reused.pid})")
        # Its grant keeper, if it needs one and the start that made it died before that.
        await anyio.to_thread.run_sync(_ensure_keeper, layout.nats_store)
        return (
            existing.server,
            Path(existing.creds) if existing.creds else None,
            reused,
            None,
        )
    if server is None:
        report("starting the embedded broker")
        info = await start_root_broker(layout)
        return info.url, layout.broker_creds, info.identity, info.identity
    return server, Path(creds).resolve() if creds else None, None, None


def _serve_args(
    layout: Layout,
    space: str,
    server: str,
    creds_path: Path | None,
    resume_attempt: str | None,
    replicas: int | None,
) -> list[str]:
    serve_args = ["manager", "serve", "--root", str(layout.root), "--space", space]
    serve_args += ["--server", server]
    if creds_path:
        serve_args += ["--creds", str(creds_path)]
    if resume_attempt:
        serve_args += ["--resume-attempt", resume_attempt]
    if replicas is None:
        from manager.broker.bounds import default_replicas

        replicas = default_replicas(server)
    return [*serve_args, "--replicas", str(replicas)]


async def start_root_broker(layout: Layout) -> embedded.BrokerInfo:
    """This root's embedded broker, started on its own store, beside the event loop."""
    return await anyio.to_thread.run_sync(
        functools.partial(
            embedded.start_embedded,
            layout.nats_store,
            layout.broker_creds,
            log_path=layout.logs / "nats.log",
            grants=True,
        )
    )


async def stop_started_broker(started: ProcRef | None) -> None:
    """One broker per store, and none left behind by a refusal: the broker a command started
    is stopped when the command refuses, whatever cancelled it (and its grant keeper with it)."""
    if started is None:
        return
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(embedded.stop_embedded, started)


async def revive_embedded_broker(layout: Layout, report: Report) -> None:
    """An unfinished cut or resume needs its broker: an embedded one that died under it is
    started again on its own store and at the URL the mesh names, where the manager's client
    keeps reconnecting."""
    record = read_mesh(layout)
    if (
        record is None
        or record.embedded_broker is None
        or record.broker_store != str(layout.nats_store)
        or alive(record.embedded_broker)
    ):
        return
    port = urlsplit(record.server).port
    if port is None:
        return
    report(f"restarting the embedded broker on port {port}: it died under an unfinished attempt")
    info = await anyio.to_thread.run_sync(
        functools.partial(
            embedded.start_embedded,
            layout.nats_store,
            layout.broker_creds,
            port=port,
            log_path=layout.logs / "nats.log",
            lock_wait=embedded.DEAD_BROKER_LOCK_WAIT_S,
            grants=True,
        )
    )
    write_mesh(layout, msgspec.structs.replace(record, embedded_broker=info.identity))


def _ensure_keeper(store: Path) -> None:
    gdir = store / embedded.GRANTS_DIR
    if gdir.is_dir():
        from manager.broker import grants

        grants.ensure_keeper(gdir)


def _live_embedded_broker(layout: Layout, record: MeshRecord | None) -> ProcRef | None:
    if record is None or record.embedded_broker is None:
        return None
    if record.broker_store != str(layout.nats_store) or not alive(record.embedded_broker):
        return None
    return record.embedded_broker


def _summary(launch: _Launch, pid: int | None, instance: str | None) -> dict[str, Any]:
    return {
        "root": str(launch.layout.root),
        "space": launch.record.space,
        "server": launch.record.server,
        "embedded": launch.record.embedded_broker is not None,
        "pid": pid,
        "instanceId": instance,
        "socket": str(launch.layout.socket),
    }


async def start(
    root: Path,
    session: ControlSession,
    *,
    space: str,
    server: str | None,
    creds: str | None,
    report: Report = _noop,
    resume_attempt: str | None = None,
    replicas: int | None = None,
    broker: embedded.BrokerInfo | None = None,
    warm: WarmManager | None = None,
) -> dict[str, Any]:
    """Start a detached manager and return once it answers on `session`, which stays connected
    to it: the caller's next op needs no second handshake. `broker` is this root's embedded
    broker when the caller already started it; `warm`, a manager interpreter it started early
    (manager/coord/warm.py), which becomes this manager instead of a cold start."""
    layout = Layout.at(root)
    launch = await _provision(
        layout,
        session,
        space=space,
        server=server,
        creds=creds,
        resume_attempt=resume_attempt,
        replicas=replicas,
        report=report,
        broker=broker,
    )
    try:
        proc, status = await _run_daemon(launch, session, report, warm)
    except BaseException:
        await stop_started_broker(launch.started_broker)
        raise
    # From here the broker is the running manager's: nothing below stops it under its client.
    write_mesh(layout, msgspec.structs.replace(launch.record, manager=pid_identity(proc.pid)))
    return _summary(launch, status.pid, status.instance_id)


async def _run_daemon(
    launch: _Launch, session: ControlSession, report: Report, warm: WarmManager | None = None
) -> tuple[subprocess.Popen[Any], ops.StatusReply]:
    """The detached manager and its first status on `session`; a manager that exits or stays
    silent is killed and refused `daemon-failed` (the caller stops the broker it started)."""
    layout = launch.layout
    report("starting the manager")
    proc: subprocess.Popen[Any] | None = (
        warm.go(launch.serve_args, layout.logs / "daemon.out") if warm is not None else None
    )
    if proc is None:
        proc = await _spawn_daemon(launch)
    answered = False
    try:
        with anyio.fail_after(DAEMON_START_TIMEOUT_S):
            while True:
                if proc.poll() is not None:
                    raise Refusal(
                        Code.DAEMON_FAILED,
                        f"the manager exited with code {proc.returncode} during start",
                        f"read {layout.logs / 'daemon.out'} and {layout.manager_log}",
                    )
                status = await session.status()
                if status is not None:
                    answered = True
                    return proc, status
                # Until the socket exists a poll is one stat, so a fine one costs nothing
                # and adds no more than its period to every start.
                await anyio.sleep(0.005)
    except TimeoutError:
        raise Refusal(
            Code.DAEMON_FAILED,
            f"the manager did not answer within {DAEMON_START_TIMEOUT_S:.0f}s",
            f"read {layout.manager_log}",
        ) from None
    finally:
        if not answered:
            # A manager that never answered must not outlive the refusal as the broker's client.
            with anyio.CancelScope(shield=True):
                if proc.poll() is None:
                    proc.kill()
                await anyio.to_thread.run_sync(proc.wait)


async def _spawn_daemon(launch: _Launch) -> subprocess.Popen[Any]:
    layout = launch.layout
    out = os.open(layout.logs / "daemon.out", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        # Detached on purpose (its own session, outliving this command), so not an anyio child.
        return await anyio.to_thread.run_sync(
            functools.partial(
                subprocess.Popen,
                launch.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                cwd=layout.root,
            )
        )
    finally:
        os.close(out)


async def _up(
    root: Path,
    *,
    space: str,
    server: str | None,
    creds: str | None,
    detach: bool,
    report: Report,
    replicas: int | None,
) -> dict[str, Any] | _Launch:
    layout = Layout.at(root)
    async with control(layout) as session:
        if detach:
            with warm_manager(root) as warm:
                return await start(
                    root,
                    session,
                    space=space,
                    server=server,
                    creds=creds,
                    report=report,
                    replicas=replicas,
                    warm=warm,
                )
        return await _provision(
            layout,
            session,
            space=space,
            server=server,
            creds=creds,
            resume_attempt=None,
            replicas=replicas,
            report=report,
        )


def check_root(root: Path) -> None:
    """What `cotal up` needs of a root before it touches anything, each refused by name: a
    control directory it can own, a root it can write, and a `cotal.toml` the manager can read
    (which would otherwise surface only as the manager's own failed start)."""
    control = Layout.at(root).control
    try:
        st: os.stat_result | None = os.lstat(control)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a file, not a directory"
        raise Refusal(
            Code.BAD_CONTROL_DIR,
            f"{control} is {kind}; cotal keeps its tokens, broker store and logs in that directory",
            f"move {control} aside (it is not cotal's), then rerun `cotal up`",
        )
    writable = control if st is not None else root
    if os.statvfs(writable).f_flag & os.ST_RDONLY:
        raise Refusal(
            Code.ROOT_NOT_WRITABLE,
            f"{writable} is on a read-only file system; cotal writes its control directory there",
            "remount it read-write, or run `cotal up` in a writable workspace root",
        )
    if not os.access(writable, os.W_OK | os.X_OK):
        raise Refusal(
            Code.ROOT_NOT_WRITABLE,
            f"{writable} is not writable by uid {os.geteuid()}; cotal writes its control "
            "directory there",
            "run cotal as the user who owns the workspace root, or fix its permissions",
        )
    from manager import registry

    registry.load_config(root)
    # Read again where the manager declares the DM stream; a bad one is refused here, before
    # anything starts, rather than as the manager's failed start.
    from manager.broker.bounds import dm_limits

    dm_limits()


def up(
    root: Path,
    *,
    space: str,
    server: str | None,
    creds: str | None,
    detach: bool,
    report: Report = _noop,
    replicas: int | None = None,
) -> dict[str, Any]:
    result = eventloop.run(
        functools.partial(
            _up,
            root,
            space=space,
            server=server,
            creds=creds,
            detach=detach,
            report=report,
            replicas=replicas,
        )
    )
    if isinstance(result, dict):
        return result
    # In the foreground the manager is this process's child until Ctrl-C, which must reach it
    # and then still stop the embedded broker: a plain blocking wait outside any event loop.
    report(f"manager serving {result.layout.root} in the foreground (Ctrl-C stops it)")
    try:
        code = subprocess.run(result.argv, check=False).returncode
    finally:
        if result.record.embedded_broker is not None:
            embedded.stop_embedded(result.record.embedded_broker)
        result.layout.mesh.unlink(missing_ok=True)
    # Ctrl-C reaches the manager too: a clean exit or one by that signal is the operator's stop.
    if code not in (0, -signal.SIGINT, -signal.SIGTERM):
        raise Refusal(
            Code.DAEMON_FAILED,
            f"the manager exited with code {code} while serving in the foreground",
            f"read {result.layout.logs / 'manager.log'} for the reason",
        )
    return {**_summary(result, None, None), "stopped": True}


class Downed(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What `cotal down` stopped: each seat as the manager's shutdown reported it, and the pids
    of the manager and the embedded broker proven gone (None for one that was not running)."""

    seats: list[ops.TeardownRow]
    manager: int | None
    broker: int | None


async def _down(layout: Layout, report: Report) -> Downed:
    record = read_mesh(layout)
    if record is None:
        raise Refusal(
            Code.NOT_UP, f"nothing is up in {layout.root} (no .cotal/mesh.json)", "nothing to do"
        )
    seats: list[ops.TeardownRow] = []
    manager_pid: int | None = None
    read_token(layout)
    async with control(layout) as session:
        status = await session.status()
        if status is not None:
            manager_pid = status.pid
            ref = (
                record.manager
                if record.manager and record.manager.pid == manager_pid
                else pid_identity(manager_pid)
            )
            report(f"stopping {status.seats} seat(s) and the manager")
            result = await session.request(ops.SHUTDOWN, ops.NoArgs(), timeout=120.0)
            seats = result.stopped
    if status is not None:
        gone = await anyio.to_thread.run_sync(
            functools.partial(prove_gone, ref, timeout=DAEMON_EXIT_TIMEOUT_S)
        )
        if not gone:
            raise Refusal(
                Code.DAEMON_STUCK,
                f"manager pid {manager_pid} did not exit after shutdown",
                f"kill -9 {manager_pid}, then rerun `cotal down`",
            )
    elif record.manager is not None and alive(record.manager):
        raise Refusal(
            Code.DAEMON_UNRESPONSIVE,
            f"manager pid {record.manager.pid} is alive but does not answer",
            f"kill {record.manager.pid} (its seats die with it), then rerun `cotal down`",
        )
    broker_pid = None
    if record.embedded_broker is not None:
        report("stopping the embedded broker")
        await anyio.to_thread.run_sync(embedded.stop_embedded, record.embedded_broker)
        broker_pid = record.embedded_broker.pid
    layout.mesh.unlink(missing_ok=True)
    return Downed(seats=seats, manager=manager_pid, broker=broker_pid)


def down(root: Path, *, report: Report = _noop) -> Downed:
    return eventloop.run(_down, Layout.at(root), report)


def broker_serve(
    store_dir: Path,
    *,
    port: int,
    as_json: bool,
    say: Callable[[str], None],
    grants: bool = True,
) -> int:
    import json

    ensure_private_dir(store_dir)
    creds = ensure_private_dir(store_dir / "auth") / "broker.creds"
    info = embedded.start_embedded(store_dir, creds, port=port, grants=grants)
    if as_json:
        say(
            json.dumps(
                {"url": info.url, "creds": info.creds, "pid": info.pid, "monitor": info.monitor}
            )
        )
    else:
        say(f"broker  {info.url}")
        say(f"creds   {info.creds}")
        if info.monitor:
            # Only with COTAL_BROKER_MONITOR set: off by default, as seats could read it.
            say(f"monitor {info.monitor}")
        say("use: cotal up --server URL --creds FILE   (Ctrl-C stops the broker)")
    stop = False

    def _stop(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stop and alive(info.identity):
        time.sleep(0.2)
    embedded.stop_embedded(info.identity)
    return 0


async def publish_direct(
    server: str, creds: Path | None, space: str, seat: str, text: str
) -> dict[str, Any]:
    """Queue a message in a seat's inbox at the broker, with no manager running (a cut seat).
    `unreachableSince` (and `message`) say when the seat is `lost` (`cotal ps --fleet`): its
    holder's lease lapsed, so the message waits for a host that is gone."""
    from manager.broker import fleet
    from manager.broker.connection import connect, first_connect_s
    from manager.broker.dm import new_message_id, publish_dm
    from protocol import meshcall, names
    from protocol.instant import now_iso
    from protocol.messages import DirectMessage

    names.check_seat_name(seat)
    if not text:
        raise Refusal(
            Code.EMPTY_MESSAGE, "refusing to send an empty message", "pass the text to send"
        )
    nc = await connect(server, creds, name="cotal-send", deadline=first_connect_s())
    try:
        dm = DirectMessage(
            id=new_message_id(),
            sender=names.principal(names.SEAT_OWNER, names.OPERATOR_ACTOR),
            recipient=names.principal(names.SEAT_OWNER, seat),
            text=text,
            sent_at=now_iso(),
        )
        js = nc.jetstream()
        # Read before the publish, as a seat's send does: a read that fails publishes nothing.
        gone = await fleet.lost(js, space, seat)
        seq = await publish_dm(js, space, dm)
    except Refusal:
        raise
    except Exception as exc:
        raise Refusal(
            Code.PUBLISH_FAILED,
            f"the broker did not accept the message: {exc}",
            "check that the DM stream exists (a manager of this space ran against this broker)",
        ) from None
    finally:
        await nc.close()
    return {
        "id": dm.id,
        "seq": seq,
        "seat": seat,
        "queued": True,
        "unreachableSince": gone.since if gone is not None else None,
        "message": meshcall.host_unreachable(gone.since) if gone is not None else None,
    }
