"""Control-socket frames: a 4-byte big-endian length, then one JSON object.

The first frame of every connection is `hello` with the control token; after it, requests
`{id, op, args}` get replies `{id, ok, result}` or `{id, ok:false, error:{code, message}}`.
Each op has its own argument record and its own size cap, checked before decoding.
"""

from __future__ import annotations

import struct
from typing import Annotated, Any, Literal

import msgspec

from protocol.codec import convert, decode_json, encode_json
from protocol.errors import DecodeError, Refusal

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


class StopSeatArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`stop-seat` keeps the seat (durable, session, custody, record); `remove-seat` is the one
    that deprovisions it."""

    name: str


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


# A dead letter's id is its sequence in the space's dead-letter stream.
DeadLetterId = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]


class DeadLetterArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """`redeliver-dead-letter` puts one back into the seat's inbox; `drop-dead-letter` deletes
    it. Either refuses an id that is not one of this seat's dead letters."""

    name: str
    id: DeadLetterId


class AttemptArgs(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    attempt_id: str


DRAIN_TIMEOUT_MAX_S = 3600.0


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


_KIB = 1024
OPS: dict[str, tuple[type[Any], int]] = {
    "status": (NoArgs, 1 * _KIB),
    "ps": (NoArgs, 1 * _KIB),
    "spawn": (SpawnArgs, 64 * _KIB),
    "stop-seat": (StopSeatArgs, 1 * _KIB),
    "start-seat": (StartSeatArgs, 1 * _KIB),
    "restart-seat": (RestartSeatArgs, 1 * _KIB),
    "remove-seat": (RemoveSeatArgs, 1 * _KIB),
    "send": (SendArgs, 160 * _KIB),
    "dead-letters": (DeadLettersArgs, 1 * _KIB),
    "redeliver-dead-letter": (DeadLetterArgs, 1 * _KIB),
    "drop-dead-letter": (DeadLetterArgs, 1 * _KIB),
    "shutdown": (NoArgs, 1 * _KIB),
    "prepare-preservation": (AttemptArgs, 1 * _KIB),
    "commit-preservation": (CommitPreservationArgs, 64 * _KIB),
    "abort-preservation": (AttemptArgs, 1 * _KIB),
    "resume-preserved": (ResumeArgs, 512 * _KIB),
    "commit-resume": (AttemptArgs, 1 * _KIB),
    "finalize-resume": (FinalizeArgs, 1 * _KIB),
    "progress": (ProgressArgs, 1 * _KIB),
}


def decode_hello(body: bytes) -> Hello:
    return decode_json(body, Hello, what="hello frame", cap=FRAME_CAP)


def decode_request(body: bytes) -> Request:
    return decode_json(body, Request, what="request frame", cap=FRAME_CAP)


def decode_args(request: Request) -> Any:
    """Decode `request.args` under the op's own record and cap; refuse unknown ops by name."""
    entry = OPS.get(request.op)
    if entry is None:
        raise Refusal(
            "unknown-op",
            f"unknown op {request.op!r}",
            "use one of: " + ", ".join(sorted(OPS)),
        )
    kind, cap = entry
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


def seat_rows(obj: Any) -> list[SeatRow]:
    return convert(obj, list[SeatRow], what="ps result")


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


def dead_letters(obj: Any) -> DeadLetters:
    return convert(obj, DeadLetters, what="dead-letters result")


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


def progress_result(obj: Any) -> ProgressResult:
    return convert(obj, ProgressResult, what="progress result")
