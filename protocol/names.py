"""Token rules and broker names keyed by space, principal and lifecycle uid.

The uid is the key of a seat's lifecycle-keyed broker footprint: the `dm_` durable is named from
it, so a resume that recovers the uid binds the same inbox with its frontier, and a wrong uid
names a durable that does not exist.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Annotated, TypeGuard

import msgspec

from protocol.errors import Refusal
from protocol.instant import INSTANT_BODY, file_stamp
from protocol.refusals import Code

# -- token rules ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenRule:
    """One kind of token: its rule, written once, and the example a test proves it with.

    `pattern` is what a msgspec `Meta(pattern=...)` takes. msgspec matches with `re.search`, and
    `$` also matches before a trailing newline, so every pattern is anchored with `\\Z`: a token
    with a newline in it is exactly what these rules keep out of file names, subjects and logs.
    """

    what: str
    body: str
    example: str
    pattern: str = field(init=False)
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", rf"^(?:{self.body})\Z")
        object.__setattr__(self, "regex", re.compile(self.pattern))

    def matches(self, value: object) -> TypeGuard[str]:
        return isinstance(value, str) and self.regex.fullmatch(value) is not None


# Seat names become the actor half of a principal, which is joined with '-' in JetStream names
# and '.' in subjects, so neither separator may appear inside one.
SEAT_NAME = TokenRule("seat name", r"[A-Za-z0-9_]{1,64}", "worker_2")
SPACE = TokenRule("space", r"[A-Za-z0-9_-]{1,64}", "main-2")
LIFECYCLE_UID = TokenRule("lifecycle uid", r"[a-z0-9]{26,32}", "0" * 6 + "abcdefghij0123456789")
INSTANCE_ID = TokenRule("instance id", r"[a-z0-9]{26,32}", "k" * 26)
ATTEMPT_ID = TokenRule("attempt id", r"[A-Za-z0-9_-]{1,128}", "20261129T140000Z-0a1b2c3d")
# Inventory labels (launch option keys) and tokens (harness-level words such as an agent kind).
LABEL = TokenRule("label", r"[A-Za-z0-9_-]{1,128}", "reasoning-effort")
WORD = TokenRule("token", r"[A-Za-z0-9_]{1,128}", "claude_code")
SHA256_HEX = TokenRule("sha256 digest", r"[0-9a-f]{64}", "ab" * 32)
# The durable commit token a maintenance attempt hands back: 32 random bytes in hex.
COMMIT_TOKEN = TokenRule("commit token", r"[0-9a-f]{64}", "0f" * 32)
# The control socket's shared secret, written by the daemon as 32 random bytes in hex.
CONTROL_TOKEN = TokenRule("control token", r"[0-9a-f]{64}", "c3" * 32)
# A full git object id: SHA-1 repositories give 40 hex, SHA-256 repositories 64.
OBJECT_ID = TokenRule("object id", r"[0-9a-f]{40}|[0-9a-f]{64}", "1" * 40)
# git check-ref-format forbids spaces and control characters, which is what lets refs.txt be
# one "<oid> <refname>" per line.
REF_NAME = TokenRule("ref name", r"refs/[^\x00-\x20\x7f~^:?*\[\\]+", "refs/stash")
HEAD_REF = TokenRule("branch ref", r"refs/heads/[^\x00-\x20\x7f~^:?*\[\\]+", "refs/heads/main")
# `protocol.instant.format_instant`'s form.
INSTANT = TokenRule("instant", INSTANT_BODY, "2026-11-29T14:00:00.123Z")
# A file a checkpoint names: a plain basename that cannot be hidden or climb out.
FILE_NAME = TokenRule("checkpoint file name", r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}", "repo.bundle")
# The suffix of a directory set aside by a restore (`<target>.superseded.<stamp>`).
STAMP = TokenRule("stamp", r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", "20261129T140000Z")
DEPENDENCY_KIND = TokenRule("dependency kind", r"[a-z][a-z0-9-]{0,63}", "profile")
# A writer generation's file name: a positive decimal without leading zeros that fits an i64.
GENERATION = TokenRule("generation", r"[1-9][0-9]{0,17}", "42")
# The session id pi and Claude Code mint: a lowercase RFC 4122 UUID.
SESSION_UUID = TokenRule(
    "session id",
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "0b9e3f52-7c1d-4a8e-9f20-5d6c7b8a9e01",
)
# The id of a direct message (uuid4 hex); it doubles as the JetStream Nats-Msg-Id.
MESSAGE_ID = TokenRule("message id", r"[0-9a-f]{32}", "9" * 32)
ENV_NAME = TokenRule("environment variable name", r"[A-Za-z_][A-Za-z0-9_]*", "ANTHROPIC_API_KEY")
# What an operator may name as a harness's model or provider: it reaches the harness's argv, so it
# may not begin with '-' or hold a space. Claude Code's model ids also carry a `[1m]` context tag.
HARNESS_MODEL = TokenRule("model", r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}", "openai/gpt-4o-mini")
CLAUDE_MODEL = TokenRule(
    "Claude model", r"[A-Za-z0-9][A-Za-z0-9._:/@\[\]+-]{0,199}", "claude-sonnet-4-5[1m]"
)
PROVIDER = TokenRule("provider", r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", "openai")
# The scribe's own session ids name a file in its store, so they may not climb out of it.
SCRIBE_SESSION_ID = TokenRule("scribe session id", r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", "s-1.a")

TOKEN_RULES: tuple[TokenRule, ...] = (
    SEAT_NAME,
    SPACE,
    LIFECYCLE_UID,
    INSTANCE_ID,
    ATTEMPT_ID,
    LABEL,
    WORD,
    SHA256_HEX,
    COMMIT_TOKEN,
    CONTROL_TOKEN,
    OBJECT_ID,
    REF_NAME,
    HEAD_REF,
    INSTANT,
    FILE_NAME,
    STAMP,
    DEPENDENCY_KIND,
    GENERATION,
    SESSION_UUID,
    MESSAGE_ID,
    ENV_NAME,
    HARNESS_MODEL,
    CLAUDE_MODEL,
    PROVIDER,
    SCRIBE_SESSION_ID,
)

# The compiled rules under the names callers already use.
LIFECYCLE_UID_RE = LIFECYCLE_UID.regex
SPACE_RE = SPACE.regex
SEAT_NAME_RE = SEAT_NAME.regex
ATTEMPT_ID_RE = ATTEMPT_ID.regex
INSTANCE_ID_RE = INSTANCE_ID.regex

# Field types for msgspec records.
SeatNameField = Annotated[str, msgspec.Meta(pattern=SEAT_NAME.pattern)]
SpaceField = Annotated[str, msgspec.Meta(pattern=SPACE.pattern)]
LifecycleUidField = Annotated[str, msgspec.Meta(pattern=LIFECYCLE_UID.pattern)]
InstanceIdField = Annotated[str, msgspec.Meta(pattern=INSTANCE_ID.pattern)]
AttemptIdField = Annotated[str, msgspec.Meta(pattern=ATTEMPT_ID.pattern)]
LabelField = Annotated[str, msgspec.Meta(pattern=LABEL.pattern)]
WordField = Annotated[str, msgspec.Meta(pattern=WORD.pattern)]
Sha256Field = Annotated[str, msgspec.Meta(pattern=SHA256_HEX.pattern)]
CommitTokenField = Annotated[str, msgspec.Meta(pattern=COMMIT_TOKEN.pattern)]
ObjectIdField = Annotated[str, msgspec.Meta(pattern=OBJECT_ID.pattern)]
HeadRefField = Annotated[str, msgspec.Meta(pattern=HEAD_REF.pattern, max_length=1024)]
InstantField = Annotated[str, msgspec.Meta(pattern=INSTANT.pattern)]
FileNameField = Annotated[str, msgspec.Meta(pattern=FILE_NAME.pattern)]
DependencyKindField = Annotated[str, msgspec.Meta(pattern=DEPENDENCY_KIND.pattern)]

DEFAULT_SPACE = "main"
SEAT_OWNER = "local"
OPERATOR_ACTOR = "operator"

_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def base36(n: int) -> str:
    if n == 0:
        return "0"
    out: list[str] = []
    while n:
        n, r = divmod(n, 36)
        out.append(_B36[r])
    return "".join(reversed(out))


def mint_lifecycle_uid() -> str:
    """20 CSPRNG bytes in base36, left-padded with '0' to 26 characters."""
    return base36(int.from_bytes(secrets.token_bytes(20), "big")).rjust(26, "0")


def mint_instance_id() -> str:
    return mint_lifecycle_uid()


def check_lifecycle_uid(uid: str) -> str:
    if not isinstance(uid, str) or not LIFECYCLE_UID_RE.fullmatch(uid):
        raise Refusal(
            Code.BAD_UID,
            f"lifecycle uid {uid!r} is not a lifecycle token (^[a-z0-9]{{26,32}}$)",
            "use the uid exactly as `cotal ps --wide` or the checkpoint recorded it",
        )
    return uid


def check_seat_name(name: str) -> str:
    if not isinstance(name, str) or not SEAT_NAME_RE.fullmatch(name):
        raise Refusal(
            Code.BAD_NAME,
            f"seat name {name!r} is not a safe label (letters, digits and _, 1-64 characters)",
            "choose a name such as `default` or `worker_2`",
        )
    return name


# A seat's subjects and the operator's share one owner (`local`): a seat named as the operator's
# actor would receive the operator's mail and send as the operator.
RESERVED_SEAT_NAMES = frozenset({OPERATOR_ACTOR})


def check_new_seat_name(name: str) -> str:
    """`check_seat_name`, and not a name the mesh keeps for itself (a spawn, a resumed seat)."""
    check_seat_name(name)
    if name in RESERVED_SEAT_NAMES:
        raise Refusal(
            Code.RESERVED_NAME,
            f"seat name {name!r} is the operator's own address on the broker",
            "choose another name, such as `operator_1`",
        )
    return name


def check_space(space: str) -> str:
    if not isinstance(space, str) or not SPACE_RE.fullmatch(space):
        raise Refusal(
            Code.BAD_SPACE,
            f"space {space!r} is not a safe label (letters, digits, _ and -, 1-64 characters)",
            "pass --space with a name such as `main`",
        )
    return space


def check_attempt_id(attempt_id: str) -> str:
    if not isinstance(attempt_id, str) or not ATTEMPT_ID_RE.fullmatch(attempt_id):
        raise Refusal(
            Code.BAD_ATTEMPT,
            "attemptId must be a safe token (letters, digits, _, -; max 128)",
            "use the attempt id the cut printed",
        )
    return attempt_id


def mint_attempt_id() -> str:
    return file_stamp() + "-" + secrets.token_hex(4)


def space_hex(space: str) -> str:
    """Space as a filesystem key: hex never collides or changes case across locales."""
    return check_space(space).encode().hex()


def principal(owner: str, actor: str) -> str:
    return f"{owner}.{actor}"


# -- JetStream names --------------------------------------------------------------------------


def dm_stream(space: str) -> str:
    return f"DM_{check_space(space)}"


def subject_prefix(space: str) -> str:
    return f"cotal.{check_space(space)}"


def dm_subject(space: str, owner: str, actor: str, sender_owner: str, sender_actor: str) -> str:
    return f"{subject_prefix(space)}.inst.{owner}.{actor}.{sender_owner}.{sender_actor}"


def dm_filter(space: str, owner: str, actor: str) -> str:
    return f"{subject_prefix(space)}.inst.{owner}.{actor}.>"


def dm_stream_subjects(space: str) -> str:
    return f"{subject_prefix(space)}.inst.>"


def dm_durable(owner: str, actor: str, uid: str) -> str:
    return f"dm_{owner}-{actor}-{check_lifecycle_uid(uid)}"


def chan_stream(space: str) -> str:
    return f"CHAN_{check_space(space)}"


def chan_stream_subjects(space: str) -> str:
    return f"{subject_prefix(space)}.chan.>"


def chan_subject(space: str, channel: str) -> str:
    """One channel's posts; a channel name is a seat-name token (`SEAT_NAME`)."""
    return f"{subject_prefix(space)}.chan.{check_seat_name(channel)}"


def chan_carried_subject(space: str, channel: str, uid: str) -> str:
    """The posts of `channel` one subscriber's frontier carried from another broker: under the
    channel stream's subjects, read by that subscriber's durable alone."""
    return f"{chan_subject(space, channel)}.carried.{check_lifecycle_uid(uid)}"


def chan_fence_subject(space: str, owner: str, actor: str) -> str:
    """The seat's post fence in the channel stream: the marker its holder writes on winning
    custody, which every post of the seat names as the expected last write. A `-` is never in
    a channel name, so no channel's posts land here."""
    return f"{subject_prefix(space)}.chan.-fence.{owner}.{check_seat_name(actor)}"


def chathist_durable(owner: str, actor: str, uid: str, channel: str) -> str:
    """A subscribed seat's frontier in one channel, keyed by its lifecycle uid as its inbox is."""
    return f"chathist_{owner}-{actor}-{check_lifecycle_uid(uid)}-{check_seat_name(channel)}"


def dead_stream(space: str) -> str:
    """The space's dead letters (manager/broker/deadletter.py), one subject per seat lifecycle."""
    return f"DEAD_{check_space(space)}"


def dead_subjects(space: str) -> str:
    return f"{subject_prefix(space)}.dead.>"


def dead_subject(space: str, owner: str, actor: str, uid: str) -> str:
    return f"{subject_prefix(space)}.dead.{owner}.{actor}.{check_lifecycle_uid(uid)}"


def presence_bucket(space: str) -> str:
    return f"cotal_presence_{check_space(space)}"


def manager_bucket(space: str) -> str:
    return f"cotal_manager_{check_space(space)}"


def custody_bucket(space: str) -> str:
    return f"cotal_custody_{check_space(space)}"


def sent_bucket(space: str) -> str:
    """The space's sent ledger (manager/broker/sent.py): the ids its seats sent and posted."""
    return f"cotal_sent_{check_space(space)}"


def sent_key(uid: str, msg_id: str) -> str:
    """One id a seat lifecycle sent or posted, in `sent_bucket`."""
    return f"{check_lifecycle_uid(uid)}.{msg_id}"


def presence_key(owner: str, actor: str, uid: str) -> str:
    return f"{owner}.{actor}.{check_lifecycle_uid(uid)}"


def lease_key(instance_id: str) -> str:
    return f"lease.{instance_id}"


def manager_mark_key(instance_id: str) -> str:
    """A manager's up/down mark (`protocol.messages.ManagerMark`), in the custody bucket: that
    bucket has no TTL, and two parts never read as a seat's `owner.seat.uid` key."""
    return f"manager.{instance_id}"


def move_bucket(space: str) -> str:
    """The Object Store bucket a `cotal move` carries its checkpoint through."""
    return f"cotal_move_{check_space(space)}"


def standing_bucket(space: str) -> str:
    """The Object Store bucket holding each failover seat's standing checkpoint (the newest
    capture at a turn boundary), one object per seat lifecycle, each put superseding the last."""
    return f"cotal_standing_{check_space(space)}"


def standing_object(seat: str, uid: str) -> str:
    """A seat lifecycle's standing checkpoint in `standing_bucket`: one name per lifecycle, so a
    put replaces the one before and a standby finds it from the custody record alone."""
    return f"{seat}.{uid}"


def standing_base_object(seat: str, uid: str) -> str:
    """The full capture a lifecycle's incremental standing checkpoints build on."""
    return f"{seat}.{uid}.base"


def move_subject(space: str, instance_id: str, verb: str) -> str:
    """Where a destination manager answers `cotal move` (`probe`, `offer`): its own instance."""
    return f"cotal.{check_space(space)}.move.{instance_id}.{verb}"


PRESENCE_TTL_S = 6.0
PRESENCE_HEARTBEAT_S = 2.0
MANAGER_LEASE_TTL_S = 10.0
MANAGER_LEASE_RENEW_S = 2.5
ACK_WAIT_S = 60.0
MAX_SEATS = 50
SESSION_RESTART_LIMIT = 3
SESSION_RESTART_WINDOW_S = 120.0
