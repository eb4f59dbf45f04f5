"""Typed refusals: a stable code, a message that names what was wrong, and the cure."""

from __future__ import annotations

from protocol.refusals import Code


class Refusal(Exception):
    """A request that was refused and changed nothing.

    `code` is stable and machine-readable; `message` names the problem; `cure` names what the
    operator can do about it. `str()` joins both so a log line or a CLI error is complete.
    """

    def __init__(self, code: str, message: str, cure: str = "") -> None:
        self.code = code
        self.message = message
        self.cure = cure
        super().__init__(self.text)

    @property
    def text(self) -> str:
        return f"{self.message}; {self.cure}" if self.cure else self.message


class DecodeError(Refusal):
    """Bytes that do not parse as the record they claim to be."""

    def __init__(self, what: str, detail: str, cure: str = "") -> None:
        super().__init__(Code.MALFORMED, f"{what} is malformed: {detail}", cure)
