"""The maintenance ops: the cut's prepare, commit, abort and progress, and the resume's
resume-preserved, commit-resume and finalize-resume. The work is `Preservation`'s and
`Resumption`'s; what is decided here is what may not begin at all."""

from __future__ import annotations

from typing import Protocol

from manager.daemon.handlers.mail import DeadLetterCheckOwner, refuse_dead_letters
from manager.daemon.handlers.table import Table
from manager.daemon.incarnation import Incarnations
from manager.daemon.preserve import Preservation
from manager.daemon.resume import Resumption
from manager.daemon.seat import Seat
from protocol import control
from protocol.errors import Refusal
from protocol.maintenance import Maintenance
from protocol.refusals import Code


class PreservationOpsOwner(DeadLetterCheckOwner, Protocol):
    """What the maintenance ops ask of the Manager: the cut's and the resume's work, the
    maintenance state that decides what may begin, a seat by name (refused when unknown), and
    the dead-letter check a cut passes before its fence."""

    @property
    def preservation(self) -> Preservation: ...

    @property
    def resumption(self) -> Resumption: ...

    @property
    def maintenance(self) -> Maintenance: ...

    @property
    def incarnations(self) -> Incarnations:
        """Whose start of a stopped seat an abort after a failed commit uses."""
        ...

    def seat(self, name: str) -> Seat: ...


class PreservationHandlers:
    def __init__(self, mgr: PreservationOpsOwner) -> None:
        self.mgr = mgr

    def register(self, table: Table) -> None:
        cut, resume = self.mgr.preservation, self.mgr.resumption
        table.add(control.PROGRESS, self.progress)
        table.add(control.PREPARE_PRESERVATION, self.prepare)
        table.add(control.COMMIT_PRESERVATION, cut.commit)
        table.add(control.ABORT_PRESERVATION, self.abort)
        table.add(control.RESUME_PRESERVED, resume.resume)
        table.add(control.COMMIT_RESUME, resume.commit)
        table.add(control.FINALIZE_RESUME, resume.finalize)

    async def abort(self, args: control.AttemptArgs) -> control.AttemptState:
        """A cut whose commit failed is abandoned by starting its stopped seats again, as
        `cotal start` would: under the uid, into the session, in the tree the capture only
        read."""
        mgr = self.mgr
        return await mgr.preservation.abort(args, start=mgr.incarnations.start_stopped)

    async def progress(self, args: control.ProgressArgs) -> control.ProgressResult:
        return self.mgr.preservation.progress.read(args)

    async def prepare(self, args: control.PrepareArgs) -> control.PrepareReply:
        mgr = self.mgr
        named = frozenset(args.seats)
        joining = mgr.maintenance.cut.holds(args.attempt_id)
        if mgr.maintenance.state == "active" and not joining:
            for name in sorted(named):
                mgr.seat(name)
            # A cut carries running seats and resumes them running; a stopped seat would come
            # back started behind the operator's back, so the operator decides first. Checked
            # before the fence, so the refusal changes nothing.
            kept = sorted(
                s.name
                for s in mgr.seats.values()
                if s.state == "stopped" and (not named or s.name in named)
            )
            if kept:
                raise Refusal(
                    Code.SEAT_STOPPED,
                    f"preservation refused: seat(s) {', '.join(kept)} stopped; a cut carries "
                    "running seats only",
                    f"`cotal start {kept[0]}` or `cotal rm {kept[0]}` first (each stopped seat), "
                    "then cut again; nothing was stopped",
                )
            await refuse_dead_letters(mgr, only=named)
        return await mgr.preservation.prepare(args)
