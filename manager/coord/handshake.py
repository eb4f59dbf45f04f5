"""The manager's three resume ops as a coordinator drives them, each journaled as soon as it
answers (`resume-preserved`, `commit-resume`, `finalize-resume`), and the continuity
observations of record 6 step 9 read back from the manager after them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec

from manager import failpoint
from manager.checkpoint import admit
from manager.coord import mesh
from manager.coord.admission import relocation_of
from manager.coord.port import ManagerPort
from manager.coord.records import Observation
from manager.coord.report import say as _say
from manager.workspace.journal import Journal
from protocol import control
from protocol.inventory import Inventory, encode_inventory
from protocol.maintenance import (
    RESUME_ACTIVE,
    RESUME_COMMITTED,
    RETIRED,
    Consent,
    ResumeDescriptor,
)

RESUME_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class Resumed:
    """A seat as the manager's `resume-preserved` reported it (or as a rerun after finalize
    recalls it from the checkpoint): what the observations compare against `ps`."""

    name: str
    continuity: str
    observation: str


async def seat_rows(session: ManagerPort) -> dict[str, control.SeatRow]:
    rows = await session.request(control.PS, control.NoArgs(), timeout=RESUME_TIMEOUT_S)
    return {row.name: row for row in rows}


def observations(
    adm: admit.Admission, resumed: list[Resumed], rows: dict[str, control.SeatRow]
) -> list[Observation]:
    """Record 6 step 9: what each seat was before the cut against what the manager runs now."""
    out = []
    for seat in resumed:
        rec = adm.records[seat.name]
        row = rows.get(seat.name)
        session_after = row.session_id if row is not None else None
        uid_after = row.lifecycle_uid if row is not None else None
        moved = relocation_of(adm, seat.name)
        out.append(
            Observation(
                name=seat.name,
                continuity=seat.continuity,
                observation=moved.note or seat.observation,
                session_before=rec.session.session_id,
                session_after=session_after,
                uid_before=rec.lifecycle_uid,
                uid_after=uid_after,
                same_session=rec.session.session_id is not None
                and rec.session.session_id == session_after,
                same_uid=rec.lifecycle_uid == uid_after,
                relocated=moved.relocated,
                relocation_note=moved.note,
                map_landing=moved.landing,
            )
        )
    return out


async def resume_and_commit(
    session: ManagerPort,
    journal: Journal,
    attempt: str,
    inventory: Inventory,
    descriptor: ResumeDescriptor | None,
    consents: list[Consent],
    *,
    root: Path,
    advance_active: bool = True,
) -> tuple[list[Resumed], str]:
    """`resume-preserved`, then `commit-resume`, each journaled as soon as it answers: a rerun
    after a death at any point continues from what the journal says."""
    resume = control.ResumeArgs(
        attempt_id=attempt, inventory=msgspec.Raw(encode_inventory(inventory))
    )
    result = await session.request(control.RESUME_PRESERVED, resume, timeout=RESUME_TIMEOUT_S)
    failpoint.reached("resume.after-resume-preserved", root)
    if advance_active:
        journal.advance(attempt, RESUME_ACTIVE, resume=descriptor, consents=consents)
    failpoint.reached("resume.after-resume-active", root)
    commit = await session.request(
        control.COMMIT_RESUME, control.AttemptArgs(attempt_id=attempt), timeout=RESUME_TIMEOUT_S
    )
    failpoint.reached("resume.after-commit-resume", root)
    token = commit.durable_commit_token
    journal.advance(
        attempt,
        RESUME_COMMITTED,
        resume=descriptor,
        consents=consents,
        durable_commit_token=token,
    )
    failpoint.reached("resume.after-resume-committed", root)
    return [Resumed(s.name, s.continuity, s.observation) for s in result.seats], token


async def finalize(
    session: ManagerPort,
    journal: Journal,
    attempt: str,
    descriptor: ResumeDescriptor | None,
    consents: list[Consent],
    token: str,
) -> control.AttemptState:
    """Only `finalize-resume` with the journaled token releases the fence; then `retired`.

    A broker that died since the commit is started again first and after: the resume must not
    report a mesh as running whose broker is gone."""
    await mesh.revive_embedded_broker(journal.layout, _say)
    final = await session.request(
        control.FINALIZE_RESUME,
        control.FinalizeArgs(attempt_id=attempt, durable_commit_token=token),
        timeout=RESUME_TIMEOUT_S,
    )
    failpoint.reached("resume.after-finalize", journal.layout.root)
    journal.advance(
        attempt, RETIRED, resume=descriptor, consents=consents, durable_commit_token=token
    )
    await mesh.revive_embedded_broker(journal.layout, _say)
    return final
