"""What a cut through the manager (`cut.py`) and a cut finished offline after the manager died
(`offline.py`) share: the operator's options for the cut, and the proof that no seat process
survived. Both coordinators import this; neither imports the other's module for it."""

from __future__ import annotations

from dataclasses import dataclass

from manager.procs import processes_with_envs
from protocol.errors import Refusal
from protocol.inventory import Inventory


@dataclass(frozen=True)
class CutOptions:
    """What the operator asked of this cut on the command line; a rerun passes them again."""

    stores: list[str]
    drain_timeout: float
    include: list[str]
    # `--since ATTEMPT`: each seat's bundle carries only what is new since that sealed attempt.
    since: str | None = None


def prove_no_seat_processes(inventory: Inventory) -> None:
    live = processes_with_envs(
        "COTAL_LIFECYCLE_UID", [agent.identity.lifecycle_uid for agent in inventory.agents]
    )
    for agent in inventory.agents:
        survivors = live[agent.identity.lifecycle_uid]
        if survivors:
            raise Refusal(
                "stop-unproven",
                f"seat {agent.name} (uid {agent.identity.lifecycle_uid}) still has live "
                f"processes {survivors}",
                f"kill {' '.join(map(str, survivors))}, then rerun `cotal down --preserve-state`",
            )
