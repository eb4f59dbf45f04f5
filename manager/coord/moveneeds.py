"""What `cotal move`'s probe tells the destination it must have for each seat, before the fence.

Per seat (`protocol/move.py`'s `ProbedSeat`): the launch profile the cut will record (the
connector, the model resolved from this root's settings, the permission lists, and the digest
they make here), the harness version the seat runs here (its connector's `doctor`), and how
many bytes its history and carried files weigh (`git count-objects` for the history, the size
of each changed or untracked file the cut captures). The destination checks each against its
own root (`manager/daemon/movecheck.py`) and refuses by name before anything is fenced.

The profile is checked here too: the cut's plan derives it from this root's `cotal.toml` and
refuses `profile-drift` when that changed since the seat was spawned, which after the fence
would be a cut refused with the seats fenced; before it, the seat just runs on.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec

from connectors.base import harness_check
from connectors.doctorkit import Pins
from manager import registry
from manager.checkpoint.gitstate import EXCLUDE_CONTROL, EXCLUDE_STAGING, run_git
from manager.registry import FileConfig
from manager.workspace.layout import Layout
from manager.workspace.private import read_stable
from protocol.errors import DecodeError, Refusal
from protocol.lifecycle import SEAT_RECORD_CAP, SeatRecord, decode_seat_record
from protocol.move import ProbedSeat
from protocol.refusals import Code


async def needs_of(
    layout: Layout, rows: Mapping[str, Any], seats: Sequence[str]
) -> list[ProbedSeat]:
    """Each of `seats` (their `ps` rows in `rows`) as the probe names it."""
    config = await anyio.to_thread.run_sync(registry.load_config, layout.root)
    agents = {rows[name].agent for name in seats}
    versions = await anyio.to_thread.run_sync(_harness_versions, config, agents)
    needs = []
    for name in seats:
        row = rows[name]
        record = await anyio.to_thread.run_sync(_record, layout, name, row.lifecycle_uid)
        needs.append(
            msgspec.structs.replace(
                _profiled(config, row, record),
                harness_version=versions.get(row.agent),
                bytes=await footprint(Path(row.cwd)),
            )
        )
    return needs


def _profiled(config: FileConfig, row: Any, record: SeatRecord | None) -> ProbedSeat:
    """The profile the cut's plan will record (`daemon/seat.py`'s `profiled_settings`): the
    seat's own model, else this root's setting, with the seat's permission lists."""
    settings = registry.agent_settings(config, row.agent)
    model = (record.model if record is not None else None) or settings.get("model")
    allow_send = list(record.allow_send if record is not None else row.allow_send)
    subscribe = list(record.subscribe if record is not None else row.subscribe)
    allow_post = list(record.allow_post if record is not None else row.allow_post)
    now = registry.profile_digest(row.agent, model, settings, allow_send, subscribe, allow_post)
    if record is not None and record.profile is not None and record.profile != now:
        raise Refusal(
            Code.PROFILE_DRIFT,
            f"seat {row.name}: this root's launch profile for {row.agent} is now revision "
            f"{now}, not the {record.profile} the seat was started under (cotal.toml changed), "
            "so its cut would refuse",
            f"put cotal.toml's [agents.{row.agent}] back as it was, then rerun `cotal move`; "
            "nothing was fenced",
        )
    return ProbedSeat(
        name=row.name,
        agent=row.agent,
        model=model,
        profile=now,
        allow_send=allow_send,
        subscribe=subscribe,
        allow_post=allow_post,
    )


def _record(layout: Layout, name: str, uid: str) -> SeatRecord | None:
    """The seat's persisted record (its model and profile are not in `ps`), or None when it
    cannot be read: the probe then names what `ps` and this root's settings say."""
    path = layout.seat_record(name, uid)
    try:
        data = read_stable(path, cap=SEAT_RECORD_CAP, what="seat record").data
        return decode_seat_record(data, where=str(path))
    except (DecodeError, Refusal, OSError):
        return None


def _harness_versions(config: FileConfig, agents: Iterable[str]) -> dict[str, str]:
    """Each agent's harness version as the cut will record it (`harness_check`: `cotal
    doctor`'s reading, or a built-in harness's own version); an agent whose check cannot tell
    is left out, and the destination then compares no version for it."""
    pins = Pins.load()
    versions: dict[str, str] = {}
    for agent in sorted(agents):
        try:
            check = harness_check(
                registry.load_connector(agent), registry.agent_settings(config, agent), pins
            )
        except Refusal:
            continue
        if check.version:
            versions[agent] = check.version[:128]
    return versions


async def footprint(cwd: Path) -> int:
    """About what a seat ships: its history (the pre-copied bundle is about the size of the
    repository's packed objects) and each changed or untracked file the cut captures, at its
    size on disk as `stat` says (a sparse file is carried at its whole length). A cwd git
    cannot read counts nothing: the cut refuses it by name."""
    try:
        counted = await run_git(cwd, "count-objects", "-v", background=True)
        listed = await run_git(
            cwd,
            "ls-files", "-z", "--others", "--modified", "--exclude-standard",
            "--", ".", EXCLUDE_CONTROL, *EXCLUDE_STAGING,
            background=True,
        )  # fmt: skip
    except Refusal:
        return 0
    history = 0
    for line in counted.stdout.decode(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key in ("size", "size-pack") and value.strip().isdigit():
            history += int(value) * 1024
    paths = [p for p in listed.stdout.split(b"\0") if p]
    return history + await anyio.to_thread.run_sync(_sizes, cwd, paths)


def _sizes(cwd: Path, paths: list[bytes]) -> int:
    total = 0
    for rel in dict.fromkeys(paths):
        try:
            total += os.lstat(os.path.join(os.fsencode(cwd), rel)).st_size
        except OSError:
            # Deleted since it was listed (or a deletion `--modified` names): nothing to carry.
            continue
    return total
