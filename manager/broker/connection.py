"""One authenticated broker connection per daemon; every call carries a deadline."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import anyio
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext

from manager.broker.retry import patience
from protocol.errors import Refusal
from protocol.refusals import Code

log = structlog.get_logger("cotal.broker")

CALL_TIMEOUT_S = 5.0
# nats-py retries a first connect forever when reconnects are unlimited (it walks the server
# pool with no attempt count), so a coordinator facing a dead broker would hang: its first
# connect gets this long in all, then a named refusal. Long enough to ride out an election.
FIRST_CONNECT_S = 15.0


def first_connect_s() -> float:
    """FIRST_CONNECT_S, shortened by an operator's broker patience below it."""
    return min(FIRST_CONNECT_S, patience())


def _auth_kwargs(creds: Path | None) -> dict[str, str]:
    if creds is None:
        return {}
    try:
        head = creds.read_bytes()[:64]
    except OSError as exc:
        raise Refusal(
            Code.BAD_CREDS,
            f"broker credential {creds} is unreadable ({exc.strerror})",
            "pass --creds with a readable 0600 file",
        ) from None
    if head.startswith(b"SU"):
        return {"nkeys_seed": str(creds)}
    if b"BEGIN NATS USER JWT" in head:
        return {"user_credentials": str(creds)}
    raise Refusal(
        Code.BAD_CREDS,
        f"broker credential {creds} is neither an nkey user seed nor a .creds file",
        "pass the file `cotal broker serve` printed, or a NATS .creds file",
    )


def split_servers(server: str) -> list[str]:
    """`--server` takes one URL or a comma-separated list of cluster URLs."""
    urls = [u.strip() for u in server.split(",") if u.strip()]
    if not urls:
        raise Refusal(
            Code.BAD_SERVER,
            "--server is empty",
            "pass nats://host:port, or several separated by commas",
        )
    return urls


async def _on_error(exc: Exception) -> None:
    # nats-py's default prints a traceback per failed reconnect; one key-value line says it.
    log.warning("broker.connection_error", error=f"{type(exc).__name__}: {exc}")


async def _on_disconnect() -> None:
    log.warning("broker.disconnected")


async def _on_reconnect() -> None:
    log.info("broker.reconnected")


# The credential each connection authenticated with: a claimant's grant wait asks the broker's
# keeper to count its instance as that credential's host (manager/broker/grants.py, `join`).
_creds_of: weakref.WeakKeyDictionary[Client, Path] = weakref.WeakKeyDictionary()


def creds_of(nc: Client) -> Path | None:
    return _creds_of.get(nc)


async def connect(
    server: str, creds: Path | None, *, name: str, deadline: float | None = None
) -> Client:
    """Connected and authenticated, or `Refusal("broker-unreachable")`. With `deadline`, the
    first connect (every server, every retry) ends by then; without it, it waits for a broker
    that is coming up, which only a process with its own supervisor (the daemon) may do."""
    # As `nats.connect` passes them; a dict because nats-py's annotations call floats ints.
    options: dict[str, Any] = {
        "servers": split_servers(server),
        "name": name,
        "connect_timeout": CALL_TIMEOUT_S,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "allow_reconnect": True,
        "error_cb": _on_error,
        "disconnected_cb": _on_disconnect,
        "reconnected_cb": _on_reconnect,
        **_auth_kwargs(creds),
    }
    nc = Client()
    try:
        with anyio.fail_after(deadline):
            await nc.connect(**options)
    except TimeoutError:
        # A connect given up halfway may hold a socket; closing one never connected is harmless.
        await close_quietly(nc)
        waited = f" within {deadline:g}s" if deadline is not None else ""
        raise Refusal(
            Code.BROKER_UNREACHABLE,
            f"no broker answered at {server}{waited}",
            "check that the broker runs (`cotal up` starts one; `cotal status` names its pid) and "
            "that the URL is right, then retry",
        ) from None
    except Exception as exc:
        await close_quietly(nc)
        raise Refusal(
            Code.BROKER_UNREACHABLE,
            f"cannot connect to the broker at {server}: {exc}",
            "check that the broker runs (`cotal up` starts one) and the credential is right",
        ) from None
    if creds is not None:
        _creds_of[nc] = creds
    log.info("broker.connected", server=nc.connected_url.netloc if nc.connected_url else server)
    return nc


async def close_quietly(nc: Client) -> None:
    """Close a client whatever state it is in, within CALL_TIMEOUT_S. A client reconnecting to
    a broker that died raises from `close` as it writes what it had pending (a broken pipe, a
    reset); nothing more can reach that broker, so that is logged, never raised."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(CALL_TIMEOUT_S):
        try:
            await nc.close()
        except Exception as exc:
            log.warning("broker.close_failed", error=f"{type(exc).__name__}: {exc}")


class LazyConnection:
    """A coordinator's one broker connection: opened at its first use, closed once at the end.

    A coordinator that refuses before it needs the broker never connects, and every broker
    phase after the first reuses the same connection instead of paying for a new handshake.
    """

    def __init__(self, server: str, creds: Path | None, *, name: str) -> None:
        self.server = server
        self.creds = creds
        self.name = name
        self._nc: Client | None = None
        self.opened = 0

    async def client(self) -> Client:
        if self._nc is None:
            self._nc = await connect(
                self.server, self.creds, name=self.name, deadline=first_connect_s()
            )
            self.opened += 1
        return self._nc

    async def jetstream(self) -> JetStreamContext:
        return (await self.client()).jetstream()

    async def aclose(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None:
            await close_quietly(nc)

    async def __aenter__(self) -> LazyConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
