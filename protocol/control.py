"""Control-socket frames: a 4-byte big-endian length, then one JSON object.

The first frame of every connection is `hello` with the control token; after it, requests
`{id, op, args}` get replies `{id, ok, result}` or `{id, ok:false, error:{code, message}}`.
Each op has its own argument record and its own size cap, checked before decoding.
"""

from __future__ import annotations

import struct
from collections.abc import Collection
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeVar

import msgspec

from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError, Refusal
from protocol.names import ObjectIdField, SeatNameField, Sha256Field
from protocol.refusals import Code

FRAME_CAP = 1024 * 1024
HELLO_TIMEOUT_S = 5.0
LENGTH = struct.Struct(">I")
TOKEN_HEX_LEN = 64
# What one caller may cost the daemon: connections open at once, connections that have not yet
# said hello (the oldest is dropped for a newcomer), how deep a frame may nest, and how long a
# string argument other than free text may be (a path or a name; PATH_MAX is 4096).
MAX_CONNECTIONS = 256
MAX_UNAUTHENTICATED = 64
MAX_DEPTH = 64
ARG_STRING_CAP = 4096
FREE_TEXT_ARGS = frozenset({"text", "prompt"})


class Hello(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    op: Literal["hello"]
    token: str


class Request(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    id: int
    op: str
    args: msgspec.Raw = msgspec.Raw(b"{}")


class ErrorBody(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    code: str
    message: str


class Reply(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    id: int
    ok: bool
    result: Any = None
    error: ErrorBody | None = None


# -- per-op arguments --------------------------------------------------------------------------


class NoArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    pass


class SpawnArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: str
    agent: str = "scribe"
    prompt: str | None = None
    model: str | None = None
    cwd: str | None = None
    resume: str | None = None
    # The seats it may send to: names, or `*` for every other seat; none by default.
    allow_send: list[str] = []
    # The channels whose posts it gets as turns, and those it may post to; none by default.
    subscribe: list[str] = []
    allow_post: list[str] = []


class StopSeatArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`stop-seat` keeps the seat (durable, session, custody, record); `remove-seat` is the one
    that deprovisions it."""

    name: str


class BudgetLiftArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`budget-lift`: waive the budget limits this seat has reached, for their current window."""

    name: str


class BudgetLiftReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """The limits lifted (`seat.tokens_per_day`, `root.turns_per_hour`; none when the seat was
    not at its budget) and when each would have resumed by itself."""

    name: str
    lifted: list[str] = []
    resets_at: list[str] = []


class StartSeatArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: str


class RestartSeatArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: str


class RemoveSeatArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: str


class SendArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: str
    text: str
    wait: bool = False
    timeout_s: float = 120.0


class DeadLettersArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`dead-letters`: list one seat's dead letters."""

    name: str


class RedeliverAllArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`redeliver-all-dead-letters`: put every dead letter of one seat back into its inbox."""

    name: str


# A dead letter's id is its sequence in the space's dead-letter stream.
DeadLetterId = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]


class DeadLetterArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`redeliver-dead-letter` puts one back into the seat's inbox; `drop-dead-letter` deletes
    it. Either refuses an id that is not one of this seat's dead letters."""

    name: str
    id: DeadLetterId


class AttemptArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    attempt_id: str


class PrepareArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    attempt_id: str
    # The seats to cut while the rest of the mesh runs on; empty: every seat, and the mesh
    # goes down after the seal. A repeat of a prepared attempt joins it whatever it names.
    seats: Annotated[list[str], msgspec.Meta(max_length=256)] = []


DRAIN_TIMEOUT_MAX_S = 3600.0


class PrecopyBase(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One seat's pre-copied history as the coordinator names it: the bundle's digest and size,
    and its tips, which the seat's bundle may leave out where the repository still holds them
    (the sealed record keeps those as `RepositoryRecord.precopy`)."""

    bundle_sha256: Sha256Field
    bundle_bytes: Annotated[int, msgspec.Meta(ge=0)]
    tips: Annotated[list[ObjectIdField], msgspec.Meta(max_length=2048)]


class CommitPreservationArgs(
    msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True
):
    """`drain_timeout_s` bounds how long commit waits, per seat and concurrently, for the turn
    in flight to reach its terminal boundary before the seat is stopped; a seat still mid-turn
    then is cut anyway and its message stays unacknowledged."""

    attempt_id: str
    session_stores: list[str] = []
    # `--include`: ignored paths under each seat's repository carried for this cut, beside the
    # root's `[carry] include`; each is validated again where it is used.
    include: list[Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]] = []
    drain_timeout_s: Annotated[float, msgspec.Meta(ge=0.0, le=DRAIN_TIMEOUT_MAX_S)] = 120.0
    # `--since`: a sealed attempt of this root; each seat's bundle carries only what is new
    # since that attempt's record of it (docs/design.md, "Incremental cuts").
    since: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,128}$")] | None = None
    # `cotal move`'s pre-copy, by seat name: the history it shipped before the fence, which
    # that seat's bundle then leaves out (docs/design.md, "Pre-copy"). Not with `since`.
    precopy: Annotated[dict[SeatNameField, PrecopyBase], msgspec.Meta(max_length=256)] = {}

    def __post_init__(self) -> None:
        if self.since is not None and self.precopy:
            raise ValueError("since and precopy: a cut builds on one base, not two")


class ResumeArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    attempt_id: str
    inventory: msgspec.Raw


class FinalizeArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    attempt_id: str
    durable_commit_token: str


class ProgressArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """Poll the progress of one maintenance attempt: every record with `seq > after`."""

    attempt_id: str
    after: int = 0


# OPS and the per-op records it names are below the results, which they refer to.


def decode_hello(body: bytes) -> Hello:
    return decode_json(body, Hello, what="hello frame", cap=FRAME_CAP)


def decode_request(body: bytes) -> Request:
    return decode_json(body, Request, what="request frame", cap=FRAME_CAP)


def decode_args(request: Request) -> Any:
    """Decode `request.args` under the op's own record and cap; refuse unknown ops by name."""
    entry = OPS.get(request.op)
    if entry is None:
        raise Refusal(
            Code.UNKNOWN_OP,
            f"unknown op {request.op!r}",
            "use one of: " + ", ".join(sorted(OPS)),
        )
    kind, cap = entry.args, entry.cap
    raw = bytes(request.args)
    if len(raw) > cap:
        raise DecodeError(f"{request.op} args", f"{len(raw)} bytes exceeds the {cap}-byte cap")
    return decode_json(raw, kind, what=f"{request.op} args", cap=cap)


def encode_frame(obj: Any) -> bytes:
    body = encode_json(obj)
    if len(body) > FRAME_CAP:
        raise DecodeError("frame", f"{len(body)} bytes exceeds the {FRAME_CAP}-byte cap")
    return LENGTH.pack(len(body)) + body


def ok_reply(request_id: int, result: Any) -> Reply:
    return Reply(id=request_id, ok=True, result=result)


def error_reply(request_id: int, code: str, message: str) -> Reply:
    return Reply(id=request_id, ok=False, error=ErrorBody(code=code, message=message))


def decode_reply(body: bytes) -> Reply:
    return decode_json(body, Reply, what="reply frame", cap=FRAME_CAP)


# -- results -----------------------------------------------------------------------------------


class SeatRow(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One row of `ps`: what an operator needs to find, address and verify a seat."""

    name: str
    agent: str
    state: str
    pid: int | None
    cwd: str
    lifecycle_uid: str
    instance_id: str
    session_id: str | None
    continuity: str
    restarts: int
    started_at: str
    durable: str
    # A turn in flight: a message handed to the harness and not yet settled at the broker.
    busy: bool = False
    turn_started_at: str | None = None
    # Why a seat is not running when the manager knows (a re-adoption it refused).
    reason: str | None = None
    # How the seat's last process ended: its exit code ("0") or the signal ("SIGTERM").
    last_exit: str | None = None
    # What keeps the seat from the manager's authority: "mount-ns+landlock", ..., "none".
    isolation: str | None = None
    # The harness's own permission mode where it has one (Claude Code), as the seat was launched.
    permission_mode: str | None = None
    # Messages this seat's inbox gave up on and keeps aside (`cotal inbox NAME`).
    dead_letters: int = 0
    # The seats it may send to (`--allow-send`); empty: none.
    allow_send: list[str] = []
    # The channels it subscribes to (`--subscribe`) and may post to (`--allow-post`).
    subscribe: list[str] = []
    allow_post: list[str] = []
    # What its turns used as its harness reported them, over its ledger (carried with its
    # session): every input token (cache reads and writes included) and the output; None when
    # no turn reported any. The cost is estimated in US dollars from the root's `[prices]`,
    # None when a model it used has no price (docs/operations.md, "What each seat costs").
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None
    # Why no message is delivered to it now, when it reached its budget (`at budget: ...`).
    budget: str | None = None


class DeadLetterRow(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One dead letter as `dead-letters` lists it. `sender`, `message_id` and `sent_at` are the
    message's own when it decodes as a DM; `head` is the start of its text (or of its bytes)."""

    id: int
    subject: str
    deliveries: int
    reason: str
    dead_at: str
    bytes: int
    head: str
    sender: str | None = None
    message_id: str | None = None
    sent_at: str | None = None


class DeadLetters(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`dead-letters`' result: `count` is the seat's whole number; `letters` the oldest, up to
    the listing bound (`truncated` then)."""

    name: str
    lifecycle_uid: str
    count: int
    letters: list[DeadLetterRow]
    truncated: bool = False


ProgressPhase = Literal[
    "fenced",
    "drained",
    "planned",
    "turn-wait",
    "stopping",
    "stopped",
    "capture",
    "sealed",
    "failed",
]


class ProgressRecord(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One step of a maintenance attempt, as the daemon saw it.

    This is the coordinator's view of a cut in flight: it polls `progress` while `commit`
    runs, so no log event name is an interface. `seat` is absent for attempt-wide steps;
    `turn-wait` is a seat's turn in flight at commit (`detail` says whether it reached its
    boundary or was cut mid-turn, and names the message);
    `step` names the part of a seat's capture (bundle, index-diff, worktree-diff, untracked,
    session, seal) and `bytes` what that part has written so far.
    """

    seq: int
    at: str
    phase: ProgressPhase
    seat: str | None = None
    step: str | None = None
    bytes: int | None = None
    detail: str | None = None


class ProgressResult(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    attempt_id: str
    records: list[ProgressRecord]
    done: bool


# -- replies of the other ops --------------------------------------------------------------------
# Each names today's wire keys exactly (the CLI reads them as JSON). A key that only some replies
# carry is `UNSET` in the others, so it is left out of the frame rather than sent as null.


class PartialCutRow(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    attempt_id: str
    state: str
    seats: list[str]
    commit_started: bool


class StatusReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    pid: int
    space: str
    root: str
    instance_id: str
    state: str
    seats: int
    seat_states: dict[str, int]
    server: str
    started_at: str
    in_flight: int
    # A coordinator that died leaves its attempt here: a rerun joins it by this id, and
    # `--abort` may lift the fence only while the commit has not begun.
    attempt_id: str | None
    commit_started: bool
    activated: bool
    dead_letters: dict[str, int]
    # The attempt an active manager is adopting into its mesh, until its finalize.
    adopting: str | None = None
    # A cut of some seats in an active manager: the attempt, its state and its seats.
    partial_cut: PartialCutRow | None = None


class StartedSeatRow(SeatRow, kw_only=True, frozen=True):
    already_running: bool


class StopSeatReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: str
    lifecycle_uid: str
    exit_code: int | None
    last_exit: str | None
    state: str
    already_stopped: bool
    kept: bool


class RemoveSeatReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: str
    lifecycle_uid: str
    exit_code: int | None
    last_exit: str | None
    state: str
    footprint_deleted: bool
    dead_letters_deleted: int


class SendReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    id: str
    seq: int
    seat: str
    # Only for `wait`: the harness's reply and how many deliveries it took.
    reply: str | msgspec.UnsetType = msgspec.UNSET
    attempts: int | msgspec.UnsetType = msgspec.UNSET


class DropDeadLetterReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: str
    lifecycle_uid: str
    id: int
    message_id: str | None


class RedeliverDeadLetterReply(
    msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True
):
    name: str
    lifecycle_uid: str
    id: int
    message_id: str | None
    seq: int
    # What the harness is told: its next delivery's number.
    delivery: int


class RedeliverAllReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`redeliver-all-dead-letters`: every dead letter of the seat put back into its inbox, in
    dead-letter order; `count` is all of them, `letters` the first `REDELIVER_ALL_LISTED`."""

    name: str
    lifecycle_uid: str
    count: int
    letters: list[RedeliverDeadLetterReply]
    truncated: bool


# What one `redeliver-all-dead-letters` reply lists of the letters it put back: a seat holds up
# to 10,000, more than a control frame carries.
REDELIVER_ALL_LISTED = 1000


class TeardownRow(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: str
    lifecycle_uid: str
    exit_code: int | None
    durable_deleted: bool
    durable_error: str | None
    footprint_owned: bool


class ShutdownReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    stopped: list[TeardownRow]
    # Outside `active` the seats' footprint is the cut's or the resume's: kept, and said so.
    footprint_kept: bool | msgspec.UnsetType = msgspec.UNSET
    state: str | msgspec.UnsetType = msgspec.UNSET


class AttemptState(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`abort-preservation` and `finalize-resume`: where the attempt stands now."""

    attempt_id: str
    state: str


class SeatFailure(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: str
    error: str
    code: str | msgspec.UnsetType = msgspec.UNSET


class PrepareReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    attempt_id: str
    state: str
    # The inventory and the resume descriptor, as their own records encode them.
    inventory: msgspec.Raw
    resume: msgspec.Raw
    failures: list[SeatFailure]


class IgnoredPath(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One ignored path a cut leaves behind: a file, or a directory git lists whole (`dir/`)."""

    path: str
    files: int
    bytes: int


class IgnoredSurvey(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """The ignored files of a seat's tree no declared path carries (manager/checkpoint/
    ignored.py): how many, their bytes, the largest paths; `complete` false when the survey
    stopped at its budget of entries, and the figures are then lower bounds."""

    files: int
    bytes: int
    largest: list[IgnoredPath]
    complete: bool


class CutSeat(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: str
    since: str | None
    bundle_bytes: int
    continuity: str
    session_id: str | None
    lifecycle_uid: str
    bytes: int
    timings_ms: dict[str, int]
    mid_turn: str | None
    # What stays behind: surveyed before any seat stopped (absent when the survey could not
    # run, e.g. a manager restarted between the prepare and the commit).
    ignored: IgnoredSurvey | msgspec.UnsetType = msgspec.UNSET


class MidTurn(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: str
    message_id: str


class CommitReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    attempt_id: str
    state: str
    checkpoint_dir: str
    sealed: bool
    seats: list[CutSeat]
    failures: list[SeatFailure]
    mid_turn: list[MidTurn]
    timings_ms: dict[str, int]
    # A commit that could not seal: where what it wrote was kept aside.
    evidence: str | msgspec.UnsetType = msgspec.UNSET
    # A cut of some seats: the manager and the rest of its mesh run on.
    partial: bool | msgspec.UnsetType = msgspec.UNSET


class TakeoverArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`takeover`: these seats of a lost host, each from its standing checkpoint. `from_instance`,
    when given, is the holder the operator means: a seat held by any other is refused."""

    names: Annotated[list[str], msgspec.Meta(min_length=1, max_length=64)]
    from_instance: Annotated[str, msgspec.Meta(max_length=128)] | None = None


class TakenSeat(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """One seat taken over: from whom, at which generation now, from which standing checkpoint
    (and when it was captured), and how long the takeover waited out the holder's self-fence."""

    name: str
    lifecycle_uid: str
    from_instance: str
    generation: int
    attempt_id: str
    captured_at: str
    waited_s: float


class TakeoverReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    seats: list[TakenSeat]


class ResumedSeat(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    name: str
    lifecycle_uid: str
    continuity: str
    session_before: str | None
    session_after: str | None
    observation: str
    pid: int | None


class ResumeReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    attempt_id: str
    state: str
    seats: list[ResumedSeat]


class CommitResumeReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    attempt_id: str
    state: str
    durable_commit_token: str


class FleetReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`fleet`: every seat of this manager's space across every manager on its broker, read by
    the manager over the connection it holds (`cotal ps --fleet`). `rows` is a JSON array of
    `FleetRow`s (manager/broker/fleet.py), as that record encodes them."""

    rows: msgspec.Raw


class InboxDepth(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`inbox-depths`: one seat's inbox as the broker counts it (its durable's consumer info):
    `pending` messages not yet delivered to the seat, `in_flight` delivered and not yet
    acknowledged (a turn under way, or a message held at a budget or a fence). What the
    console's INBOX column shows."""

    name: str
    lifecycle_uid: str
    pending: int
    in_flight: int


class MetricsReply(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`metrics`: this manager's metrics in the Prometheus text exposition format (0.0.4),
    the same text `[metrics] listen` serves at `GET /metrics` (docs/operations.md,
    "Monitoring")."""

    text: str


# -- the op table ----------------------------------------------------------------------------------

A = TypeVar("A")
R = TypeVar("R")


@dataclass(frozen=True)
class Op(Generic[A, R]):
    """One op: its wire name, its argument record, its reply record and its argument cap."""

    name: str
    args: type[A]
    reply: type[R]
    cap: int


_KIB = 1024
STATUS = Op("status", NoArgs, StatusReply, 1 * _KIB)
PS: Op[NoArgs, list[SeatRow]] = Op("ps", NoArgs, list[SeatRow], 1 * _KIB)
SPAWN = Op("spawn", SpawnArgs, SeatRow, 64 * _KIB)
STOP_SEAT = Op("stop-seat", StopSeatArgs, StopSeatReply, 1 * _KIB)
START_SEAT = Op("start-seat", StartSeatArgs, StartedSeatRow, 1 * _KIB)
RESTART_SEAT = Op("restart-seat", RestartSeatArgs, SeatRow, 1 * _KIB)
REMOVE_SEAT = Op("remove-seat", RemoveSeatArgs, RemoveSeatReply, 1 * _KIB)
BUDGET_LIFT = Op("budget-lift", BudgetLiftArgs, BudgetLiftReply, 1 * _KIB)
SEND = Op("send", SendArgs, SendReply, 160 * _KIB)
DEAD_LETTERS = Op("dead-letters", DeadLettersArgs, DeadLetters, 1 * _KIB)
REDELIVER_DEAD_LETTER = Op(
    "redeliver-dead-letter", DeadLetterArgs, RedeliverDeadLetterReply, 1 * _KIB
)
DROP_DEAD_LETTER = Op("drop-dead-letter", DeadLetterArgs, DropDeadLetterReply, 1 * _KIB)
REDELIVER_ALL_DEAD_LETTERS = Op(
    "redeliver-all-dead-letters", RedeliverAllArgs, RedeliverAllReply, 1 * _KIB
)
SHUTDOWN = Op("shutdown", NoArgs, ShutdownReply, 1 * _KIB)
PREPARE_PRESERVATION = Op("prepare-preservation", PrepareArgs, PrepareReply, 32 * _KIB)
COMMIT_PRESERVATION = Op("commit-preservation", CommitPreservationArgs, CommitReply, 64 * _KIB)
ABORT_PRESERVATION = Op("abort-preservation", AttemptArgs, AttemptState, 1 * _KIB)
RESUME_PRESERVED = Op("resume-preserved", ResumeArgs, ResumeReply, 512 * _KIB)
COMMIT_RESUME = Op("commit-resume", AttemptArgs, CommitResumeReply, 1 * _KIB)
FINALIZE_RESUME = Op("finalize-resume", FinalizeArgs, AttemptState, 1 * _KIB)
PROGRESS = Op("progress", ProgressArgs, ProgressResult, 1 * _KIB)
METRICS = Op("metrics", NoArgs, MetricsReply, 1 * _KIB)
FLEET = Op("fleet", NoArgs, FleetReply, 1 * _KIB)
TAKEOVER = Op("takeover", TakeoverArgs, TakeoverReply, 4 * _KIB)
INBOX_DEPTHS: Op[NoArgs, list[InboxDepth]] = Op("inbox-depths", NoArgs, list[InboxDepth], 1 * _KIB)

OPS: dict[str, Op[Any, Any]] = {
    op.name: op
    for op in (
        STATUS,
        PS,
        SPAWN,
        STOP_SEAT,
        START_SEAT,
        RESTART_SEAT,
        REMOVE_SEAT,
        BUDGET_LIFT,
        SEND,
        DEAD_LETTERS,
        REDELIVER_DEAD_LETTER,
        DROP_DEAD_LETTER,
        REDELIVER_ALL_DEAD_LETTERS,
        SHUTDOWN,
        PREPARE_PRESERVATION,
        COMMIT_PRESERVATION,
        ABORT_PRESERVATION,
        RESUME_PRESERVED,
        COMMIT_RESUME,
        FINALIZE_RESUME,
        PROGRESS,
        METRICS,
        FLEET,
        INBOX_DEPTHS,
        TAKEOVER,
    )
}


def check_handlers(handled: Collection[str]) -> None:
    """Refuse to serve with an op nobody answers or a handler no op names: the daemon runs this
    over its handler table before its control socket opens."""
    missing = sorted(set(OPS) - set(handled))
    extra = sorted(set(handled) - set(OPS))
    if missing or extra:
        said = [f"no handler for op(s) {', '.join(missing)}"] if missing else []
        said += [f"handler(s) {', '.join(extra)} answer no op in OPS"] if extra else []
        raise Refusal(
            Code.UNSUPPORTED_OP,
            f"control ops and handlers disagree: {'; '.join(said)}; the daemon will not serve",
            "this cotal installation is inconsistent: reinstall it, or register each op of "
            "protocol/control.py OPS in manager/daemon/handlers",
        )


def decode_result(op: Op[Any, R], raw: bytes) -> R:
    return decode_json(raw, op.reply, what=f"{op.name} result", cap=FRAME_CAP)


class RawReply(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    """A reply whose result is kept as bytes, to be decoded into the op's own reply record."""

    id: int
    ok: bool
    result: msgspec.Raw = msgspec.Raw(b"null")
    error: ErrorBody | None = None


def decode_raw_reply(body: bytes) -> RawReply:
    return decode_json(body, RawReply, what="reply frame", cap=FRAME_CAP)
