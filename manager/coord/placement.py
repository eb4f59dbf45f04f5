"""What a resume puts in place before any seat launches, under custody: each working tree
(restored once per distinct tree, a few at once), each seat's session files, and each seat's
inbox and channel frontiers imported into this broker. The import waits on the broker and the
restore on git, and neither touches what the other does, so each runs beside the other.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
from nats.js import JetStreamContext

from manager import concurrency, registry
from manager.broker import frontier, sent
from manager.broker.retry import phase
from manager.broker.space import import_dead_letters, import_inbox, read_broker_identity
from manager.checkpoint import admit
from manager.checkpoint.confine import place_session_file
from manager.checkpoint.restore import RestoreResult, restore_repository
from manager.coord.admission import BrokerRef, CarriedSpace, replicas
from manager.coord.records import ChannelImported, InboxImported, RestoredTree
from manager.coord.report import say as _say
from manager.coord.requests import RestoreRequest
from manager.workspace.layout import Layout
from protocol.checkpoint import ChannelState
from protocol.errors import Refusal
from protocol.instant import file_stamp
from protocol.refusals import Code

A = TypeVar("A")
B = TypeVar("B")


async def shares_source_broker(js: JetStreamContext, adm: admit.Admission) -> bool:
    """Whether this broker is the one the checkpoint was cut from (its custody chain)."""
    carried = {r.space_state.broker_id for r in adm.records.values() if r.space_state}
    if not carried:
        # A checkpoint from before the space travelled resumes only where it was cut.
        return True
    here = await read_broker_identity(js, adm.manifest.space)
    return carried == {here}


async def beside(
    first: Callable[[], Awaitable[A]], second: Callable[[], Awaitable[B]]
) -> tuple[A, B]:
    """Both run to their end, whatever the other does: neither is left half done to be taken
    up again by a rerun. The first's failure is the one raised when both fail, as it would be
    one after the other."""
    steps: list[Callable[[], Awaitable[Any]]] = [first, second]
    done = await concurrency.ordered_map(lambda step: step(), steps, anyio.CapacityLimiter(2))
    return done[0].unwrap(), done[1].unwrap()


@dataclasses.dataclass(frozen=True)
class _Import:
    """What every step of one seat's import into this broker reads."""

    req: RestoreRequest
    adm: admit.Admission
    js: JetStreamContext
    broker: BrokerRef
    carried: CarriedSpace
    name: str
    # This is the broker the checkpoint was cut from (`shares_source_broker`).
    shared: bool
    horizon_s: int
    channels: registry.ChannelsConfig

    @property
    def space(self) -> str:
        return self.adm.manifest.space

    @property
    def uid(self) -> str:
        return self.adm.records[self.name].lifecycle_uid

    @property
    def replicas(self) -> int:
        return replicas(self.req, self.broker)


async def import_inboxes(
    req: RestoreRequest,
    adm: admit.Admission,
    js: JetStreamContext,
    broker: BrokerRef,
    inboxes: dict[str, CarriedSpace],
    *,
    shared: bool,
    horizon_s: int,
    channels: registry.ChannelsConfig,
) -> list[InboxImported]:
    out: list[InboxImported] = []
    for name, record in adm.records.items():
        state = record.space_state
        if state is None:
            continue
        seat = _Import(req, adm, js, broker, inboxes[name], name, shared, horizon_s, channels)
        with phase(f"inbox import ({name})"):
            done = await import_inbox(
                js,
                seat.space,
                name,
                seat.uid,
                state.durable,
                seat.carried.inbox,
                attempt_id=adm.manifest.attempt_id,
                shared=shared,
                replicas=seat.replicas,
                # A stream made here is the one this root's manager runs on: made with the
                # duplicate window that manager keeps, so a rerun's republish and a resumed
                # turn's sends are dropped inside the same horizon.
                horizon_s=horizon_s,
            )
        if done.kept:
            _say(f"{name}: inbox durable already at this broker; kept")
        else:
            _say(
                f"{name}: inbox rebuilt at sequence {done.start_seq} with {done.republished} "
                f"carried message(s) ({done.duplicates} already here)"
            )
        await _import_dead(seat)
        await _import_sent(seat)
        frontiers = [await _import_frontier(seat, c) for c in state.channels]
        out.append(
            InboxImported(
                name=name,
                kept=done.kept,
                start_seq=done.start_seq,
                republished=done.republished,
                duplicates=done.duplicates,
                channels=frontiers,
            )
        )
    return out


async def _import_dead(seat: _Import) -> None:
    """The seat's carried dead letters kept as dead letters here (`import_dead_letters`)."""
    letters, name = seat.carried.dead, seat.name
    if not letters:
        return
    with phase(f"dead letters ({name})"):
        put, here = await import_dead_letters(
            seat.js, seat.space, name, seat.uid, letters, shared=seat.shared, replicas=seat.replicas
        )
    if seat.shared:
        _say(f"{name}: {len(letters)} dead letter(s) already at this broker; kept")
    else:
        _say(
            f"{name}: {put} dead letter(s) carried into this broker's dead letters "
            f"({here} already here); `cotal inbox {name}` lists them"
        )


async def _import_sent(seat: _Import) -> None:
    """The seat's carried sent ledger written into this broker's, before the seat runs, so a
    turn it runs again here has its sends and posts dropped as it would at the source. The
    broker the checkpoint was cut from still holds them."""
    entries = seat.carried.sent
    if seat.shared or not entries:
        return
    with phase(f"sent ledger ({seat.name})"):
        kv = await sent.ensure_ledger(
            seat.js, seat.space, replicas=seat.replicas, horizon_s=seat.horizon_s
        )
        await sent.import_entries(kv, seat.uid, entries)
    _say(f"{seat.name}: {len(entries)} sent id(s) carried into this broker's sent ledger")


async def _import_frontier(seat: _Import, c: ChannelState) -> ChannelImported:
    """One subscribed channel's unread posts, onto a subject of the seat's own."""
    name = seat.name
    with phase(f"channel import ({name} #{c.channel})"):
        got = await frontier.import_frontier(
            seat.js,
            seat.space,
            name,
            seat.uid,
            c,
            seat.carried.posts[c.channel],
            attempt_id=seat.adm.manifest.attempt_id,
            shared=seat.shared,
            history=seat.channels.history,
            max_age_s=seat.channels.max_age_s,
            replicas=seat.replicas,
            horizon_s=seat.horizon_s,
        )
    if got.kept:
        _say(f"{name}: #{c.channel} frontier already at this broker; kept")
    else:
        _say(
            f"{name}: #{c.channel} frontier rebuilt at sequence {got.start_seq} with "
            f"{got.republished} unread post(s), on the seat's own subject"
        )
    return ChannelImported(
        channel=c.channel,
        kept=got.kept,
        start_seq=got.start_seq,
        republished=got.republished,
        duplicates=got.duplicates,
    )


async def restore_all(layout: Layout, adm: admit.Admission) -> list[RestoredTree]:
    """Restore each distinct working tree once, then place every seat's session files.

    Seats that share a cwd were captured from the same stopped tree, so their records must
    agree; restoring it once per seat would only stack superseded copies beside it. Distinct
    trees are restored a few at once (`manager/concurrency.py`); what is printed and returned
    keeps seat order, and the refusal is the first failing tree in seat order.
    """
    first_of = _distinct_trees(adm)
    for cwd, name in first_of.items():
        _say(f"restoring {name} into {cwd}")
    restored = await _restore_trees(layout, adm, first_of)
    out = []
    for name in adm.records:
        # The identity gate confined every path this seat writes; restore exactly those.
        confined = adm.confined[name]
        cwd = confined.cwd
        if first_of[cwd] != name:
            _say(f"{name} shares {cwd} with {first_of[cwd]}: already restored")
        result = restored[cwd]
        seat_dir = adm.attempt_dir / _seat_dirs(adm)[name]
        placed = [
            place_session_file(
                seat_dir / entry.file.file, target, expected_sha256=entry.file.sha256
            )
            for entry, target in confined.sessions
        ]
        out.append(
            RestoredTree(
                name=name,
                cwd=str(cwd),
                superseded=str(result.superseded) if result.superseded else None,
                session_files=len(placed),
            )
        )
    return out


def _seat_dirs(adm: admit.Admission) -> dict[str, str]:
    return {s.name: s.dir for s in adm.manifest.seats}


def _distinct_trees(adm: admit.Admission) -> dict[Path, str]:
    """Each working tree, in seat order, with the first seat that works in it. Checked before
    any tree is touched: nothing is restored for a checkpoint whose shared trees disagree."""
    first_of: dict[Path, str] = {}
    for name, record in adm.records.items():
        cwd = adm.confined[name].cwd
        first = first_of.setdefault(cwd, name)
        if first == name:
            continue
        mine, other = record.repository, adm.records[first].repository
        if (mine.base, mine.files(), mine.status, mine.status_file) != (
            other.base,
            other.files(),
            other.status,
            other.status_file,
        ):
            raise Refusal(
                Code.INCONSISTENT_CHECKPOINT,
                f"seats {first} and {name} share {cwd} but their checkpoints record "
                "different trees",
                "cut the seats again; a shared tree is captured once, stopped",
            )
    return first_of


def _nested_groups(trees: list[Path]) -> list[list[Path]]:
    """A tree inside another (or around it) is restored in the same job, after the one before
    it in seat order, as from a loop: restoring one replaces the other's directory."""
    groups: list[list[Path]] = []
    for cwd in trees:
        nested = [
            g for g in groups if any(cwd.is_relative_to(t) or t.is_relative_to(cwd) for t in g)
        ]
        merged = [t for t in trees if t == cwd or any(t in g for g in nested)]
        groups = [g for g in groups if g not in nested] + [merged]
    groups.sort(key=lambda g: trees.index(g[0]))
    return groups


async def _restore_trees(
    layout: Layout, adm: admit.Admission, first_of: dict[Path, str]
) -> dict[Path, RestoreResult]:
    stamp = file_stamp()
    dirs = _seat_dirs(adm)

    async def restore_tree(cwd: Path) -> RestoreResult:
        name = first_of[cwd]
        keep = (".cotal",) if cwd == layout.root else ()
        result = await restore_repository(
            adm.attempt_dir / dirs[name],
            adm.records[name].repository,
            cwd,
            stamp=stamp,
            keep_paths=keep,
            confine_to=adm.confine_to or (layout.root,),
            dest_root=layout.root,
            maps=adm.maps,
            links=adm.chains.get(name, ()),
            scratch=adm.scratch.get(name),
        )
        if keep and result.superseded is not None:
            _keep_host_config(layout.root, result.superseded)
        return result

    async def restore_group(group: list[Path]) -> dict[Path, concurrency.Outcome[RestoreResult]]:
        done: dict[Path, concurrency.Outcome[RestoreResult]] = {}
        for cwd in group:
            try:
                done[cwd] = concurrency.Outcome(value=await restore_tree(cwd))
            except Exception as exc:
                done[cwd] = concurrency.Outcome(error=exc)
                break
        return done

    trees = list(first_of)
    outcomes = await concurrency.ordered_map(
        restore_group, _nested_groups(trees), concurrency.limiter()
    )
    # Each tree took its packs (or fell back); what is left, a shared tree's other seats'
    # copies included, is not needed past this point. Removed beside the event loop: in a
    # daemon restoring a move's seats, its other seats' deliveries must not wait on it.
    await anyio.to_thread.run_sync(admit.discard_scratch, adm)
    by_tree: dict[Path, concurrency.Outcome[RestoreResult]] = {}
    for outcome in outcomes:
        by_tree.update(outcome.unwrap())
    # The refusal is the first failing tree in seat order; a tree its group never reached
    # comes after one that failed.
    return {cwd: by_tree[cwd].unwrap() for cwd in trees}


def _keep_host_config(root: Path, aside: Path) -> None:
    """Put this host's cotal.toml back at the root after the root's tree was replaced.

    It holds this host's bindings (binary paths, endpoints, key sources), the ones admission
    just read; the seat's tree must not take them away. A tree that carries its own cotal.toml
    keeps it, and the operator is told whose bindings the manager now reads."""
    mine, restored = aside / registry.CONFIG_NAME, root / registry.CONFIG_NAME
    if not os.path.lexists(mine):
        return
    if os.path.lexists(restored):
        _say(
            f"note: the restored tree carries its own {restored}; this host's is kept at {mine}. "
            "Move it back if the manager should use this host's bindings"
        )
        return
    os.rename(mine, restored)
