"""Token rules and broker names keyed by space, principal and lifecycle uid.

The uid is the key of a seat's lifecycle-keyed broker footprint: the `dm_` durable is named from
it, so a resume that recovers the uid binds the same inbox with its frontier, and a wrong uid
names a durable that does not exist.
"""

from __future__ import annotations

import re
import secrets

from protocol.errors import Refusal

LIFECYCLE_UID_RE = re.compile(r"^[a-z0-9]{26,32}$")
SPACE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Seat names become the actor half of a principal, which is joined with '-' in JetStream names
# and '.' in subjects, so neither separator may appear inside one.
SEAT_NAME_RE = re.compile(r"^[A-Za-z0-9_]{1,64}$")
ATTEMPT_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
INSTANCE_ID_RE = re.compile(r"^[a-z0-9]{26,32}$")

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
            "bad-uid",
            f"lifecycle uid {uid!r} is not a lifecycle token (^[a-z0-9]{{26,32}}$)",
            "use the uid exactly as `cotal ps --wide` or the checkpoint recorded it",
        )
    return uid


def check_seat_name(name: str) -> str:
    if not isinstance(name, str) or not SEAT_NAME_RE.fullmatch(name):
        raise Refusal(
            "bad-name",
            f"seat name {name!r} is not a safe label (letters, digits and _, 1-64 characters)",
            "choose a name such as `default` or `worker_2`",
        )
    return name


def check_space(space: str) -> str:
    if not isinstance(space, str) or not SPACE_RE.fullmatch(space):
        raise Refusal(
            "bad-space",
            f"space {space!r} is not a safe label (letters, digits, _ and -, 1-64 characters)",
            "pass --space with a name such as `main`",
        )
    return space


def check_attempt_id(attempt_id: str) -> str:
    if not isinstance(attempt_id, str) or not ATTEMPT_ID_RE.fullmatch(attempt_id):
        raise Refusal(
            "bad-attempt",
            "attemptId must be a safe token (letters, digits, _, -; max 128)",
            "use the attempt id the cut printed",
        )
    return attempt_id


def mint_attempt_id() -> str:
    import time

    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(4)


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


def presence_bucket(space: str) -> str:
    return f"cotal_presence_{check_space(space)}"


def manager_bucket(space: str) -> str:
    return f"cotal_manager_{check_space(space)}"


def custody_bucket(space: str) -> str:
    return f"cotal_custody_{check_space(space)}"


def presence_key(owner: str, actor: str, uid: str) -> str:
    return f"{owner}.{actor}.{check_lifecycle_uid(uid)}"


def lease_key(instance_id: str) -> str:
    return f"lease.{instance_id}"


PRESENCE_TTL_S = 6.0
PRESENCE_HEARTBEAT_S = 2.0
MANAGER_LEASE_TTL_S = 10.0
MANAGER_LEASE_RENEW_S = 2.5
ACK_WAIT_S = 60.0
MAX_SEATS = 50
SESSION_RESTART_LIMIT = 3
SESSION_RESTART_WINDOW_S = 120.0
