"""What a cut through the manager (`cut.py`) and a cut finished offline after the manager died
(`offline.py`) share: the operator's options for the cut, the record an offline finish returns
where the manager's commit would, and the proof that no seat process survived. Both
coordinators import this; neither imports the other's module for it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from manager.procs import processes_with_envs
from protocol import control
from protocol.control import SeatFailure
from protocol.errors import Refusal
from protocol.inventory import Inventory
from protocol.refusals import Code


@dataclass(frozen=True)
class CutOptions:
    """What the operator asked of this cut on the command line; a rerun passes them again."""

    stores: list[str]
    drain_timeout: float
    include: list[str]
    # `--since ATTEMPT`: each seat's bundle carries only what is new since that sealed attempt.
    since: str | None = None
    # `--seat NAME`: cut only these, while the rest of the mesh runs on.
    seats: tuple[str, ...] = ()
    # `cotal move`'s pre-copy, by seat: the history already at the destination.
    precopy: Mapping[str, control.PrecopyBase] = field(default_factory=dict)


class OfflineSeat(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """A seat of an offline finish: all of a fresh capture's summary, only the name of a seat
    read back from an attempt already sealed (the rest is `UNSET`, left out of `--json`)."""

    name: str
    since: str | None | msgspec.UnsetType = msgspec.UNSET
    bundle_bytes: int | msgspec.UnsetType = msgspec.UNSET
    continuity: str | msgspec.UnsetType = msgspec.UNSET
    session_id: str | None | msgspec.UnsetType = msgspec.UNSET
    lifecycle_uid: str | msgspec.UnsetType = msgspec.UNSET
    bytes: int | msgspec.UnsetType = msgspec.UNSET
    timings_ms: dict[str, int] | msgspec.UnsetType = msgspec.UNSET


class OfflineCut(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """What an offline finish returns in place of the manager's `CommitReply`: sealed, with no
    failure (an offline capture that fails refuses instead)."""

    attempt_id: str
    state: str
    checkpoint_dir: str
    sealed: bool
    seats: list[OfflineSeat]
    failures: list[SeatFailure]
    timings_ms: dict[str, int] | msgspec.UnsetType = msgspec.UNSET
    offline: bool | msgspec.UnsetType = msgspec.UNSET


def prove_no_seat_processes(inventory: Inventory) -> None:
    live = processes_with_envs(
        "COTAL_LIFECYCLE_UID", [agent.identity.lifecycle_uid for agent in inventory.agents]
    )
    for agent in inventory.agents:
        survivors = live[agent.identity.lifecycle_uid]
        if survivors:
            raise Refusal(
                Code.STOP_UNPROVEN,
                f"seat {agent.name} (uid {agent.identity.lifecycle_uid}) still has live "
                f"processes {survivors}",
                f"kill {' '.join(map(str, survivors))}, then rerun `cotal down --preserve-state`",
            )
