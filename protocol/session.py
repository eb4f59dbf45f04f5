"""The session pointer a continuation-capable harness writes where the manager tells it.

It names the session; it is never the transcript and never holds a credential.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError

POINTER_CAP = 8 * 1024
SESSION_ID_MAX = 4096


class SessionPointer(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    version: Literal[1]
    session_id: str
    status: Literal["running", "quit"]

    def __post_init__(self) -> None:
        if not self.session_id.strip():
            raise msgspec.ValidationError("sessionId must be a non-blank string")
        if len(self.session_id) > SESSION_ID_MAX:
            raise msgspec.ValidationError(f"sessionId exceeds {SESSION_ID_MAX} characters")


def decode_pointer(data: bytes, *, where: str = "session pointer") -> SessionPointer:
    try:
        return decode_json(data, SessionPointer, what=where, cap=POINTER_CAP)
    except DecodeError:
        raise
    except msgspec.ValidationError as exc:  # raised from __post_init__
        raise DecodeError(where, str(exc)) from None


def encode_pointer(session_id: str, status: Literal["running", "quit"]) -> bytes:
    return encode_json(SessionPointer(version=1, session_id=session_id, status=status))
