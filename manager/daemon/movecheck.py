"""A move's destination, at the probe: what its admission and its launch would refuse after the
cut, asked before the source fences anything.

The source names, per seat, the launch profile its cut will record, the harness version the seat
runs and how many bytes it will ship (`protocol/move.py`'s `ProbedSeat`). This manager answers
with the checks its own restore coordinator makes later, against the same `cotal.toml`: the
agent is one this build knows and can import (`unknown-agent`, `agent-unavailable`), the
profile digest its identity gate will compute is the one the source records (`profile-drift`),
the harness's own `doctor` finds it installed and runnable here, at a version this host's
connector was measured against, as is the one the seat runs (`agent-unavailable`,
`harness-version`; the restore's admission decides the same way, `admit.harness_refusal`),
and the root's disk holds what the pre-copy and the checkpoint will write (`no-space`). Every
refusal names the destination and says nothing was fenced; the source's `cotal move` prints it
whole.

What the probe cannot foresee stays the admission's: a `cotal.toml` edited, a harness removed
or the disk filled between the probe and the offer is refused there, and the source takes the
seats back (docs/cli.md, `cotal move`).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import anyio

from connectors.base import harness_check, measured_versions
from connectors.doctorkit import HarnessCheck, Pins
from manager import registry
from manager.checkpoint import admit
from manager.registry import FileConfig
from protocol.errors import Refusal
from protocol.move import ProbedSeat
from protocol.refusals import Code

# What a seat's shipped bytes cost this root: the pre-copied bundle and the seed indexed from
# it, then the carried checkpoint (its tar and what the restore unpacks and checks out).
DISK_FACTOR = 3
# Room left over besides, for the journal, the logs and the harnesses' own sessions.
DISK_MARGIN_BYTES = 64 * 1024 * 1024
UNFENCED = "nothing was fenced"


async def check_needs(root: Path, instance: str, needs: Sequence[ProbedSeat]) -> None:
    """Every check of `needs`, cheapest first; the first refusal is raised whole."""
    if not needs:
        # A rerun whose source manager died: the seats are cut already, and the admission
        # checks all of this after the offer.
        return
    config = await anyio.to_thread.run_sync(registry.load_config, root)
    for need in needs:
        _check_profile(config, instance, need)
    await anyio.to_thread.run_sync(_check_disk, root, instance, needs)
    await anyio.to_thread.run_sync(_check_harnesses, config, instance, needs)


def _check_profile(config: FileConfig, instance: str, need: ProbedSeat) -> None:
    """The identity gate's profile comparison (`manager/checkpoint/admit.py`), made now: this
    root's settings for the agent, with the model and lists the source's cut will record."""
    try:
        registry.load_connector(need.agent)
    except Refusal as exc:
        raise Refusal(
            exc.code,
            f"seat {need.name}: destination {instance} cannot run it: {exc.message}",
            f"{exc.cure}; {UNFENCED}",
        ) from None
    here = registry.profile_digest(
        need.agent,
        need.model,
        registry.agent_settings(config, need.agent),
        need.allow_send,
        need.subscribe,
        need.allow_post,
    )
    if here != need.profile:
        raise Refusal(
            Code.PROFILE_DRIFT,
            f"seat {need.name}: destination {instance}'s launch profile for {need.agent} has "
            f"revision {here}, the seat runs under {need.profile} at the source",
            f"make the destination's cotal.toml [agents.{need.agent}] match the source's "
            "(its model, permission and sandbox settings), then rerun `cotal move`; "
            f"{UNFENCED}",
        )


def _check_disk(root: Path, instance: str, needs: Sequence[ProbedSeat]) -> None:
    shipped = sum(need.bytes for need in needs)
    wanted = DISK_FACTOR * shipped + DISK_MARGIN_BYTES
    free = shutil.disk_usage(root).free
    if free < wanted:
        raise Refusal(
            Code.NO_SPACE,
            f"destination {instance} has {free} bytes free in {root}; the seats ship "
            f"{shipped} bytes, and their pre-copy and checkpoint need {wanted} there "
            f"({DISK_FACTOR} times that and {DISK_MARGIN_BYTES} besides)",
            f"free space in the destination's root, or move fewer seats, then rerun `cotal "
            f"move`; {UNFENCED}",
        )


def _check_harnesses(config: FileConfig, instance: str, needs: Sequence[ProbedSeat]) -> None:
    """Each agent's harness as its connector's check finds it here (`harness_check`: a
    `--version` run of its program, once per agent; off the event loop), judged by the restore
    admission's own decision (`admit.harness_refusal`) against the versions this host's
    connector was measured with."""
    pins = Pins.load()
    checked: dict[str, HarnessCheck] = {}
    for need in needs:
        if need.agent not in checked:
            checked[need.agent] = _doctor(config, instance, need.agent, pins)
        refusal = admit.harness_refusal(
            need.name,
            need.agent,
            need.harness_version,
            checked[need.agent],
            measured_versions(registry.load_connector(need.agent), pins),
            where=f"destination {instance}",
            ran="runs",
            elsewhere="move to a manager that has it",
            tail=f"; {UNFENCED}",
        )
        if refusal is not None:
            raise refusal


def _doctor(config: FileConfig, instance: str, agent: str, pins: Pins) -> HarnessCheck:
    connector = registry.load_connector(agent)
    try:
        return harness_check(connector, registry.agent_settings(config, agent), pins)
    except Refusal as exc:
        # A setting the connector cannot take: its launch would refuse it the same way.
        raise Refusal(
            exc.code,
            f"destination {instance}'s settings for {agent}: {exc.message}",
            f"{exc.cure}; {UNFENCED}",
        ) from None
