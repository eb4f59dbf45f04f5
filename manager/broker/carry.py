"""What `cotal move` says to the broker: the move bucket (a JetStream Object Store holding one
packed attempt per move while it travels) and the request to a destination manager.

An object travels in bounded memory both ways: `put` hands the store an open file, which it
reads one chunk (128 KiB) at a time and publishes chunk by chunk, each acknowledged before the
next is read; `get_into` has the store write each chunk to the file as it arrives, its ordered
consumer's flow control keeping the chunks in flight to a few megabytes. Both hash what passes
as it passes (beside the event loop, in the store's executor thread), so no second read of a
4 GiB file is needed to learn its digest.

A transfer is not bounded by a fixed time, which a big object would outlast (a 1 GiB history
takes tens of seconds), but by its progress: an attempt in which no chunk moved for
`retry.ATTEMPT_S` is given up and retried, as a call to a leaderless stream is, until no chunk
has moved for the broker patience (`retry.patience()`).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import nats.errors
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ObjectMeta

from manager.broker import retry
from protocol import move, names
from protocol.errors import Refusal
from protocol.move import CarriedMeta
from protocol.refusals import Code

log = structlog.get_logger("cotal.move")

NOFOLLOW_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
NOFOLLOW_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


# How often a transfer's watchdog looks at its progress.
WATCH_EVERY_S = 0.5


class Progress:
    """When a chunk last moved (set from the store's executor thread, read by the watchdog)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def moved(self) -> None:
        self.last = time.monotonic()


class HashingReader:
    """A file the store reads chunk by chunk (it calls `readinto` in its executor), hashing
    each chunk as it goes: the digest of exactly the bytes that were put."""

    def __init__(self, f: Any, progress: Progress) -> None:
        self._f = f
        self._progress = progress
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def readinto(self, buf: Any) -> int:
        n: int = self._f.readinto(buf)
        if n:
            self.sha256.update(memoryview(buf)[:n])
            self.bytes += n
        self._progress.moved()
        return n


class HashingWriter:
    """A file the store writes chunk by chunk (it calls `write` in its executor), hashing each
    chunk as it goes. It has no `buffer` attribute on purpose: the store would write to that
    instead and the hash would miss it."""

    def __init__(self, f: Any, progress: Progress) -> None:
        self._f = f
        self._progress = progress
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self._f.write(data)
        self.sha256.update(data)
        self.bytes += len(data)
        self._progress.moved()
        return len(data)


async def _watched(progress: Progress, work: Callable[[], Awaitable[None]]) -> None:
    """`work`, given up (TimeoutError, which `_streaming` retries) once no chunk has moved for
    an attempt's time since the later of its start and the last chunk."""
    stalled = False
    failed: Exception | None = None
    started = time.monotonic()
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            nonlocal stalled
            # Polled, not signalled: the chunks move in the store's executor thread.
            while True:
                idle = time.monotonic() - max(progress.last, started)
                if idle >= retry.ATTEMPT_S:
                    break
                await anyio.sleep(min(WATCH_EVERY_S, retry.ATTEMPT_S - idle))
            stalled = True
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        try:
            await work()
        except Exception as exc:
            # Raised as itself below, not in the task group's exception group, so the retry
            # loop sees a transient failure as one.
            failed = exc
        tg.cancel_scope.cancel()
    if failed is not None:
        raise failed
    if stalled:
        raise TimeoutError(f"no chunk moved for {retry.ATTEMPT_S:g}s")


async def _streaming(what: str, once: Callable[[Progress], Awaitable[None]]) -> None:
    """`riding_elections` for a transfer: each attempt runs as long as its chunks move, and a
    transient failure is retried until none has moved for the broker patience."""
    deadline = retry.patience()
    delay = 0.2
    progress = Progress()
    while True:
        try:
            await _watched(progress, lambda: once(progress))
            return
        except retry.TRANSIENT as exc:
            if getattr(exc, "err_code", None) == retry.STORE_REFUSED:
                raise
            if time.monotonic() - progress.last + delay > deadline:
                raise retry.unavailable(what, deadline, exc) from None
            log.warning("broker.retry", what=what, error=type(exc).__name__)
            await anyio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def put(
    js: JetStreamContext,
    space: str,
    name: str,
    data: bytes | Path,
    *,
    meta: CarriedMeta | None = None,
    bucket: str | None = None,
    replicas: int = 1,
    description: str | None = None,
) -> tuple[int, str]:
    """`data` (a file, streamed; or a few bytes) into the move bucket, or `bucket` (made on
    first use, with `replicas` copies); the store chunks it and records its digest, which every
    read checks. `meta` names the seats it carries, as the object's description, so `cotal ps
    --fleet` shows them in transit while it is there. Returns the size and SHA-256 of what was
    put. `description`, when given, is the object's description instead."""
    bucket = bucket or names.move_bucket(space)
    if meta is not None:
        description = move.encode_carried(meta)
    done: list[tuple[int, str]] = []

    async def once(progress: Progress) -> None:
        try:
            store = await js.object_store(bucket)
        except nats.js.errors.NotFoundError:
            store = await js.create_object_store(bucket, replicas=replicas)
        # A fresh ObjectMeta each try: the store fills in its options as it puts.
        object_meta = ObjectMeta(name=name, description=description)
        if isinstance(data, bytes):
            await store.put(name, data, meta=object_meta)
            done.append((len(data), hashlib.sha256(data).hexdigest()))
            return
        # A fresh reader each try too: a retry after an election reads the file from its start.
        with os.fdopen(os.open(data, NOFOLLOW_READ), "rb") as f:
            reader = HashingReader(f, progress)
            await store.put(name, reader, meta=object_meta)  # type: ignore[arg-type]
        done.append((reader.bytes, reader.sha256.hexdigest()))

    await _streaming(f"move bucket {bucket}", once)
    return done[-1]


async def get_into(
    js: JetStreamContext, space: str, name: str, path: Path, *, bucket: str | None = None
) -> tuple[int, str]:
    """The carried object (of the move bucket, or `bucket`) written chunk by chunk to `path`
    (0600, never followed, synced); the store checks its digest as it reads. Returns the size
    and SHA-256 of what was written, hashed as it was written."""
    done: list[tuple[int, str]] = []

    async def once(progress: Progress) -> None:
        store = await js.object_store(bucket or names.move_bucket(space))
        with os.fdopen(os.open(path, NOFOLLOW_WRITE, 0o600), "wb") as f:
            writer = HashingWriter(f, progress)
            await store.get(name, writeinto=writer)  # type: ignore[arg-type]
            f.flush()
            # The sync of a big file may take a while with no chunk moving: it is progress.
            progress.moved()
            await anyio.to_thread.run_sync(os.fsync, f.fileno())
        done.append((writer.bytes, writer.sha256.hexdigest()))

    await _streaming(f"move object {name}", once)
    return done[-1]


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
