"""One authenticated broker connection per daemon; every call carries a deadline."""

from __future__ import annotations

from pathlib import Path

import anyio
import nats
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext

from protocol.errors import Refusal

log = structlog.get_logger("cotal.broker")

CALL_TIMEOUT_S = 5.0


def _auth_kwargs(creds: Path | None) -> dict[str, str]:
    if creds is None:
        return {}
    try:
        head = creds.read_bytes()[:64]
    except OSError as exc:
        raise Refusal(
            "bad-creds",
            f"broker credential {creds} is unreadable ({exc.strerror})",
            "pass --creds with a readable 0600 file",
        ) from None
    if head.startswith(b"SU"):
        return {"nkeys_seed": str(creds)}
    if b"BEGIN NATS USER JWT" in head:
        return {"user_credentials": str(creds)}
    raise Refusal(
        "bad-creds",
        f"broker credential {creds} is neither an nkey user seed nor a .creds file",
        "pass the file `cotal broker serve` printed, or a NATS .creds file",
    )


def split_servers(server: str) -> list[str]:
    """`--server` takes one URL or a comma-separated list of cluster URLs."""
    urls = [u.strip() for u in server.split(",") if u.strip()]
    if not urls:
        raise Refusal(
            "bad-server",
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


async def connect(server: str, creds: Path | None, *, name: str) -> Client:
    try:
        nc = await nats.connect(
            servers=split_servers(server),
            name=name,
            connect_timeout=CALL_TIMEOUT_S,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            allow_reconnect=True,
            error_cb=_on_error,
            disconnected_cb=_on_disconnect,
            reconnected_cb=_on_reconnect,
            **_auth_kwargs(creds),
        )
    except Refusal:
        raise
    except Exception as exc:
        raise Refusal(
            "broker-unreachable",
            f"cannot connect to the broker at {server}: {exc}",
            "check that the broker runs (`cotal up` starts one) and the credential is right",
        ) from None
    log.info("broker.connected", server=nc.connected_url.netloc if nc.connected_url else server)
    return nc


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

    async def jetstream(self) -> JetStreamContext:
        if self._nc is None:
            self._nc = await connect(self.server, self.creds, name=self.name)
            self.opened += 1
        return self._nc.jetstream()

    async def aclose(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None:
            with anyio.CancelScope(shield=True):
                await nc.close()

    async def __aenter__(self) -> LazyConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
