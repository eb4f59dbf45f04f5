"""The destination side of `cotal move`: this manager answers on subjects of its own instance.

`probe` says, before the source fences anything, whether this manager would take the seats
(active, no adoption under way, the names free, the signer in this root's trust store, a clock
its recency gate trusts, room in its table, and, through `movecheck.py`, each seat's launch
profile, its harness and version, and the disk its history needs).
`precopy` keeps a seat's history, shipped while it still runs, by digest in this root's
pre-copy directory, where the adoption's chain finds it (docs/design.md, "Pre-copy"). `offer`
fetches the checkpoint the source put in the move bucket (its digest checked by the Object
Store chunk by chunk and by us as a whole), and runs this root's restore coordinator on it in
this process (`manager/coord/restore.py`, the one `cotal up --restore` runs), its manager port
this daemon's own handlers: the same admission, journal, custody claim, restore and adoption as
an operator's, so a move is never a second path to a seat, and no interpreter starts inside the
seat's downtime. Offers are answered one at a time.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar, cast

import anyio
import msgspec
import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from connectors.interpreter import own_python
from manager import registry
from manager.broker import carry
from manager.broker.precopyfetch import decode_fetched
from manager.checkpoint import clock
from manager.checkpoint.chain import grow_seed, precopy_file, precopy_seed, sweep_precopies
from manager.checkpoint.gitstate import BACKGROUND
from manager.coord.records import RestoreResult
from manager.coord.report import reporting
from manager.daemon import movecheck
from manager.daemon.events import Events
from manager.daemon.metrics import Metrics
from manager.daemon.seat import Seat
from manager.workspace import ed25519
from manager.workspace.identity import InstanceIdentity
from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from manager.workspace.private import ensure_private_dir, fsync_dir
from manager.workspace.trust import read_trusted
from protocol import control, move, names
from protocol.errors import DecodeError, Refusal
from protocol.events import EventDetail
from protocol.maintenance import RESUME_UNDER_WAY, Maintenance
from protocol.refusals import Code

log = structlog.get_logger("cotal.move")

A = TypeVar("A")
R = TypeVar("R")

# The whole adoption of a carried checkpoint by this root's own coordinator.
ADOPT_TIMEOUT_S = 300.0
# A pre-copied history's fetch and hashing, by its child (manager/broker/precopyfetch.py).
PRECOPY_FETCH_S = 300.0
# Up to this size a pre-copied history is fetched by the manager itself: a few chunks through
# its loop cost the other seats nothing measurable, where a child's interpreter start cost each
# seat of a drain 0.3-0.7 s of CPU (bench/fleet.py, for bundles of 581 bytes).
PRECOPY_INLINE_BYTES = 1 << 20


class MoverOwner(Protocol):
    """What a move's destination asks of the Manager: who it is and where, its seat table and
    maintenance state to answer a probe, its broker clients for the bucket, and its own control
    handlers, through which the restore coordinator adopts the seats (`OwnHandlers`)."""

    @property
    def identity(self) -> InstanceIdentity: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def space(self) -> str: ...

    @property
    def nc(self) -> Client: ...

    @property
    def js(self) -> JetStreamContext: ...

    @property
    def seats(self) -> Mapping[str, Seat]: ...

    @property
    def maintenance(self) -> Maintenance: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def state(self) -> str: ...

    @property
    def handle(self) -> Callable[[str, Any], Awaitable[Any]]: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def events(self) -> Events: ...


class Mover:
    def __init__(self, mgr: MoverOwner) -> None:
        self.mgr = mgr
        self._offers = anyio.Lock()
        self._precopies = anyio.Lock()

    async def serve(self) -> None:
        mgr = self.mgr
        instance = mgr.identity.instance_id
        async with anyio.create_task_group() as tg:
            for verb, handle in (
                ("probe", self._probe),
                ("precopy", self._precopy),
                ("offer", self._offer),
            ):
                sub = await mgr.nc.subscribe(names.move_subject(mgr.space, instance, verb))
                tg.start_soon(self._answer_each, sub, handle)

    async def _answer_each(
        self, sub: object, handle: Callable[[bytes], Awaitable[move.MoveAnswer]]
    ) -> None:
        async for msg in sub.messages:  # type: ignore[attr-defined]
            assert isinstance(msg, Msg)
            try:
                answer = await handle(msg.data)
            except Refusal as exc:
                answer = move.MoveAnswer(ok=False, code=exc.code, message=exc.text)
            except DecodeError as exc:
                answer = move.MoveAnswer(ok=False, code=exc.code, message=exc.text)
            except (OSError, TimeoutError, ValueError) as exc:
                # A move that fails here is that move's failure, never the manager's: its
                # other seats and its next offer go on.
                log.error("move.failed", error=repr(exc))
                answer = move.MoveAnswer(
                    ok=False, code=Code.MOVE_FAILED, message=f"the destination failed: {exc!r}"
                )
            if msg.reply:
                try:
                    await msg.respond(move.encode(answer))
                except nats.errors.Error as exc:
                    # The asker re-asks; what the offer did is in this root's journal.
                    log.warning("move.answer_lost", error=repr(exc))

    def _already(self, seats: list[str], uids: list[str]) -> bool:
        here = self.mgr.seats
        return all(n in here and here[n].uid == u for n, u in zip(seats, uids, strict=True))

    async def _probe(self, data: bytes) -> move.MoveAnswer:
        mgr = self.mgr
        probe = move.decode_probe(data)
        if self._already(probe.seats, probe.uids):
            return move.MoveAnswer(ok=True, already=True)
        m = mgr.maintenance
        if mgr.stopping or m.state != "active" or m.adoption.state != "idle":
            raise Refusal(
                Code.DESTINATION_BUSY,
                f"destination {mgr.identity.instance_id} is {mgr.state} "
                f"(adoption {m.adoption.state}) and takes no seat now",
                "retry once it is active, or move to another manager; nothing was fenced",
            )
        for name, uid in zip(probe.seats, probe.uids, strict=True):
            seat = mgr.seats.get(name)
            if seat is not None:
                raise Refusal(
                    Code.DUPLICATE_NAME,
                    f"seat name {name!r} is taken at destination {mgr.identity.instance_id} "
                    f"(uid {seat.uid})",
                    f"`cotal rm {name}` there first, or move to another manager; nothing was "
                    "fenced",
                )
            if any(s.uid == uid for s in mgr.seats.values()):
                raise Refusal(
                    Code.DUPLICATE_PRINCIPAL,
                    f"uid {uid} already runs at destination {mgr.identity.instance_id}",
                    "a seat runs once; nothing was fenced",
                )
        trusted = {s.key for s in read_trusted(mgr.layout)}
        if probe.signer not in trusted:
            raise Refusal(
                Code.UNTRUSTED_SIGNER,
                f"destination {mgr.identity.instance_id} does not trust the source's signer "
                f"{probe.signer}",
                f"on the destination: `cotal trust add {probe.signer} --name NAME` after "
                "checking the key out of band; nothing was fenced",
            )
        self._check_clock()
        if len(mgr.seats) + len(probe.seats) > names.MAX_SEATS:
            raise Refusal(
                Code.CAPACITY,
                f"destination {mgr.identity.instance_id} runs {len(mgr.seats)} seats and "
                f"would hold more than its {names.MAX_SEATS} with {len(probe.seats)} more",
                "remove a seat there first (`cotal rm NAME`), or move fewer seats; nothing was "
                "fenced",
            )
        # What this root's admission and launch would refuse after the cut: its profile for
        # each agent, the harness installed here and its version, the disk for the history.
        await movecheck.check_needs(mgr.layout.root, mgr.identity.instance_id, probe.needs)
        return move.MoveAnswer(ok=True)

    def _check_clock(self) -> None:
        """The recency gate this root's admission will pass, asked before the source fences
        anything: a clock nobody vouches for refuses here, not after the seats stopped."""
        mgr = self.mgr
        declared = registry.trusted_clock_reason(registry.load_config(mgr.layout.root).recency)
        reading = clock.read_clock(declared)
        if not reading.synchronized:
            raise Refusal(
                Code.CLOCK_UNSYNCHRONIZED,
                f"destination {mgr.identity.instance_id}'s clock is not synchronized "
                f"({reading.detail}), so its admission could judge no checkpoint's age",
                "synchronize the destination's clock (chrony, ntpd, systemd-timesyncd), or, "
                'where none can run, declare [recency] clock = "trusted" with clock_reason '
                "in its cotal.toml; nothing was fenced",
            )

    async def _precopy(self, data: bytes) -> move.MoveAnswer:
        """Keep one seat's pre-copied history, indexed once now, outside any seat's downtime:
        the bundle a signer this root trusts vouches for is fetched beside the event loop,
        hashed whole, and unbundled into a bare seed repository `<sha256>.seed`, renamed into
        place only once complete. Admission links the seed's packs into its scratch repository
        instead of unbundling that history inside the move's window."""
        pre = move.decode_precopy(data)
        self._check_signed(pre)
        store = self.mgr.layout.precopy
        seed = store / precopy_seed(pre.sha256)
        async with self._precopies:
            await anyio.to_thread.run_sync(ensure_private_dir, store)
            await anyio.to_thread.run_sync(sweep_precopies, store)
            if seed.is_dir() and not seed.is_symlink():
                # A rerun's pre-copy of the same history; the seed is proven at its use.
                return move.MoveAnswer(ok=True, already=True)
            stamp = secrets.token_hex(4)
            part = store / f"shipping-{pre.sha256}.{stamp}.part"
            growing = store / f"seeding-{pre.sha256}.{stamp}.part"
            try:
                size, digest = await self._fetch_precopy(pre.object, part, pre.bytes)
                if size != pre.bytes or digest != pre.sha256:
                    raise Refusal(
                        Code.INTEGRITY,
                        f"the pre-copied history {pre.object} is {size} bytes hashing to "
                        f"{digest}, not the {pre.bytes} bytes hashing to {pre.sha256} the "
                        "source put",
                        "rerun `cotal move` at the source: it ships the history again",
                    )
                await grow_seed(
                    part,
                    growing,
                    cure="rerun `cotal move` at the source: it ships the history again",
                )
                # The bundle stays beside its seed: a restore consumes the seed, and a rerun
                # of a restore that failed after it restores from the bundle instead.
                await anyio.to_thread.run_sync(_promote, part, store / precopy_file(pre.sha256))
                await anyio.to_thread.run_sync(_promote, growing, seed)
            finally:
                part.unlink(missing_ok=True)
                await anyio.to_thread.run_sync(
                    functools.partial(shutil.rmtree, growing, ignore_errors=True)
                )
        log.info("move.precopied", seat=pre.seat, source=pre.source, bytes=pre.bytes)
        return move.MoveAnswer(ok=True)

    async def _fetch_precopy(self, name: str, part: Path, size: int) -> tuple[int, str]:
        """The object into `part`, and its size and digest as they were written: a small one
        here, a larger one by a child at background niceness, off this manager's event loop
        (manager/broker/precopyfetch.py)."""
        mgr = self.mgr
        if size <= PRECOPY_INLINE_BYTES:
            try:
                with anyio.fail_after(PRECOPY_FETCH_S):
                    return await carry.get_into(mgr.js, mgr.space, name, part)
            except Exception as exc:  # refused below by name, as a child's failure is
                self._fetch_failed(name, f"{type(exc).__name__}: {str(exc)[:2000]}")
        argv = [
            *BACKGROUND,
            *own_python("manager.broker.precopyfetch"),
            str(mgr.layout.root),
            mgr.space,
            name,
            str(part),
        ]
        try:
            with anyio.fail_after(PRECOPY_FETCH_S):
                done = await anyio.run_process(argv, check=False)
        except TimeoutError:
            detail = f"the fetch did not end within {PRECOPY_FETCH_S:g}s"
        else:
            if done.returncode == 0:
                try:
                    fetched = decode_fetched(done.stdout)
                    return fetched.bytes, fetched.sha256
                except DecodeError as exc:
                    detail = exc.message
            else:
                detail = done.stderr.decode(errors="replace").strip()[-2000:]
        self._fetch_failed(name, detail)

    @staticmethod
    def _fetch_failed(name: str, detail: str) -> NoReturn:
        raise Refusal(
            Code.MOVE_FAILED,
            f"the pre-copied history {name} could not be fetched from the move bucket: {detail}",
            "rerun `cotal move` at the source: it ships the history again",
        )

    def _check_signed(self, pre: move.MovePrecopy) -> None:
        trusted = {s.key for s in read_trusted(self.mgr.layout)}
        if pre.signer not in trusted:
            raise Refusal(
                Code.UNTRUSTED_SIGNER,
                f"destination {self.mgr.identity.instance_id} does not trust the signer "
                f"{pre.signer} of the pre-copied history of {pre.seat}",
                f"on the destination: `cotal trust add {pre.signer} --name NAME` after "
                "checking the key out of band; nothing was fenced",
            )
        payload = move.precopy_payload(self.mgr.space, pre)
        if not ed25519.verifies_b64(pre.signer, pre.signature, payload):
            raise Refusal(
                Code.BAD_SIGNATURE,
                f"the pre-copy of {pre.seat} is not signed by the key {pre.signer} it names",
                "rerun `cotal move` at the source; nothing was fenced",
            ) from None

    async def _offer(self, data: bytes) -> move.MoveAnswer:
        offer = move.decode_offer(data)
        async with self._offers:
            # The destination's share of the seats' downtime starts with the offer: the source
            # has cut them, and they run nowhere until this adoption ends.
            began = anyio.current_time()
            if self._already(offer.seats, offer.uids):
                self.mgr.metrics.move_answered("already")
                return move.MoveAnswer(ok=True, already=True)
            try:
                path = await self._fetch(offer)
                try:
                    answer = await self._adopt(offer, path)
                finally:
                    await path.unlink(missing_ok=True)
            except Exception:
                # Answered as a refusal by `_answer_each`.
                self.mgr.metrics.move_answered("refused")
                raise
            if answer.ok:
                self.mgr.metrics.move_answered("adopted", anyio.current_time() - began)
                for name, uid in zip(offer.seats, offer.uids, strict=False):
                    self.mgr.events.emit(
                        "move.adopted", name, uid, EventDetail(attempt_id=offer.attempt_id)
                    )
            else:
                self.mgr.metrics.move_answered("refused")
            if not answer.claimed:
                # Adopted (unbundled into the seat's tree) or refused before the claim (the
                # source takes the seat back): either way this root needs the history no more.
                # A claimed refusal keeps it for the rerun that finishes the move here.
                for sha in offer.precopy:
                    (self.mgr.layout.precopy / precopy_file(sha)).unlink(missing_ok=True)
                    await anyio.to_thread.run_sync(
                        functools.partial(
                            shutil.rmtree,
                            self.mgr.layout.precopy / precopy_seed(sha),
                            ignore_errors=True,
                        )
                    )
            return answer

    async def _fetch(self, offer: move.MoveOffer) -> anyio.Path:
        mgr = self.mgr
        ensure_private_dir(mgr.layout.incoming)
        path = mgr.layout.incoming / f"{offer.attempt_id}.move.tar"
        # Chunk by chunk into the file, each chunk written and hashed beside the event loop as
        # it arrives: a big seat's fetch neither stalls this manager's other seats nor holds
        # the checkpoint in memory, and the file is not read again for its digest.
        size, digest = await carry.get_into(mgr.js, mgr.space, offer.object, path)
        if size != offer.bytes or digest != offer.sha256:
            path.unlink(missing_ok=True)
            raise Refusal(
                Code.INTEGRITY,
                f"the carried checkpoint {offer.object} is {size} bytes hashing to {digest}, "
                f"not the {offer.bytes} bytes hashing to {offer.sha256} the source put",
                "rerun `cotal move` at the source: it puts the checkpoint again",
            )
        return anyio.Path(path)

    async def _adopt(self, offer: move.MoveOffer, path: anyio.Path) -> move.MoveAnswer:
        """This root's restore coordinator, run here: the admission with this root's trust
        store, the journal, the custody claim, the restore and the adoption into this running
        mesh are exactly `cotal up --restore`'s, and so are its crash-only reruns. The
        coordinator is imported with this module, at the manager's start (about 35 ms, paid
        while `cotal up` warms it), not at a first offer, inside the seats' downtime."""
        mgr = self.mgr
        attempt = offer.attempt_id
        log.info("move.adopting", attempt=attempt, source=offer.source)
        try:
            out = await self._restore(Path(path), attempt, "move.progress")
        except Refusal as exc:
            code, message = exc.code, exc.text
        except Exception as exc:
            # A move that fails here is that move's failure, never the manager's: whatever the
            # coordinator raised ends this offer, and the manager's other seats run on.
            log.exception("move.adopt_failed", attempt=attempt)
            code, message = Code.MOVE_FAILED, f"the destination's restore failed: {exc!r}"
        else:
            log.info("move.adopted", attempt=attempt, seats=offer.seats)
            return move.MoveAnswer(ok=True, result=msgspec.Raw(msgspec.json.encode(out)))
        journal = Journal(mgr.layout).load() if mgr.layout.journal.exists() else None
        claimed = (
            journal is not None
            and journal.attempt_id == attempt
            and journal.state in RESUME_UNDER_WAY
        )
        log.warning("move.refused", attempt=attempt, code=code, claimed=claimed)
        return move.MoveAnswer(ok=False, code=code, message=message, claimed=claimed)

    async def restore_here(
        self, path: Path, attempt: str, *, seat: str, progress: str
    ) -> RestoreResult:
        """A checkpoint file this manager fetched itself (a takeover's standing checkpoint) run
        through the same restore as an offer, one at a time with the offers; its refusal is
        raised as it is."""
        async with self._offers:
            log.info("restore_here.adopting", attempt=attempt, seat=seat)
            return await self._restore(path, attempt, progress)

    async def _restore(self, path: Path, attempt: str, progress: str) -> RestoreResult:
        """The restore coordinator on `path`, each line it says logged as `progress`."""
        # Imported here, not at the top: the restore coordinator and its admission are a sixth
        # of the daemon's imports, and a manager that never adopts a cut never needs them
        # (every manager start paid them; docs/operations.md, "Manager start").
        from manager.coord import restore
        from manager.coord.requests import RestoreRequest

        req = RestoreRequest(restore=str(path), space=self.mgr.space)

        def said(text: str) -> None:
            log.info(progress, attempt=attempt, line=text)

        with anyio.fail_after(ADOPT_TIMEOUT_S), reporting(said):
            return await restore.restore(
                req, self.mgr.layout.root, port=OwnHandlers(self.mgr.handle)
            )


class OwnHandlers:
    """This daemon's control handlers as the restore coordinator's manager port
    (`manager/coord/port.py`): the same op records the control socket carries, handed to the
    same handlers, without a socket between a process and itself."""

    def __init__(self, dispatch: Callable[[str, Any], Awaitable[Any]]) -> None:
        self._dispatch = dispatch

    async def status(self) -> control.StatusReply | None:
        return await self.request(control.STATUS, control.NoArgs(), timeout=5.0)

    async def request(self, op: control.Op[A, R], args: A, *, timeout: float = 60.0) -> R:
        with anyio.fail_after(timeout):
            return cast(R, await self._dispatch(op.name, args))


def _promote(part: Path, final: Path) -> None:
    os.rename(part, final)
    fsync_dir(final.parent)
