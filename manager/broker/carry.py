"""What `cotal move` says to the broker: the move bucket (a JetStream Object Store holding one
packed attempt per move while it travels) and the request to a destination manager."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import nats.errors
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ObjectMeta

from manager.broker.retry import riding_elections
from protocol import move, names
from protocol.errors import Refusal
from protocol.move import CarriedMeta
from protocol.refusals import Code

log = structlog.get_logger("cotal.move")


async def put(
    js: JetStreamContext, space: str, name: str, blob: bytes, *, meta: CarriedMeta | None = None
) -> None:
    """The packed attempt into the move bucket (made on first use); the store chunks it and
    records its digest, which every read checks. `meta` names the seats it carries, as the
    object's description, so `cotal ps --fleet` shows them in transit while it is there."""
    bucket = names.move_bucket(space)
    description = None if meta is None else move.encode_carried(meta)

    async def once() -> None:
        try:
            store = await js.object_store(bucket)
        except nats.js.errors.NotFoundError:
            store = await js.create_object_store(bucket)
        # A fresh ObjectMeta each try: the store fills in its options as it puts.
        await store.put(name, blob, meta=ObjectMeta(name=name, description=description))

    await riding_elections(f"move bucket {bucket}", once)


async def get_into(js: JetStreamContext, space: str, name: str, path: Path) -> None:
    """The carried object written chunk by chunk to `path` (0600, never followed, synced); the
    store checks its digest as it reads."""

    async def once() -> None:
        store = await js.object_store(names.move_bucket(space))
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(path, flags, 0o600), "wb") as f:
            await store.get(name, writeinto=f)
            f.flush()
            os.fsync(f.fileno())

    await riding_elections(f"move object {name}", once)


async def drop(js: JetStreamContext, space: str, name: str) -> bool:
    """Remove the carried copy; False (and a log line) when the broker would not."""
    with anyio.CancelScope(shield=True):
        try:
            store = await js.object_store(names.move_bucket(space))
            await store.delete(name)
        except Exception as exc:  # the object is only a copy: said, and the move goes on
            log.warning("move.object_kept", object=name, error=str(exc))
            return False
    return True


async def ask(client: Client, subject: str, payload: bytes, *, timeout: float, what: str) -> Any:
    """One request to a destination manager's own subject; no answer is `destination-gone`."""
    try:
        return await client.request(subject, payload, timeout=timeout)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        raise Refusal(
            Code.DESTINATION_GONE,
            f"no manager answered {what} on this broker within {timeout:g}s",
            "check the instance id with `cotal ps --fleet` and that its manager runs on this "
            "broker",
        ) from None
