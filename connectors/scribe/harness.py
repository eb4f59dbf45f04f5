"""scribe: the built-in offline harness, a deterministic and continuable coding-agent stand-in.

Every answer is a pure function of the prompt and the transcript, so a reply proves which
history a reopened process holds (docs/design.md, "The harness connectors, in detail").
"""

from __future__ import annotations

import fcntl
import os
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Annotated, BinaryIO, Literal

import msgspec

from connectors import privatefs
from connectors.privatefs import create_private_exclusive, make_private_dirs
from protocol import instant, meshcall, names

EXIT_OK = 0
EXIT_REFUSED = 2
EXIT_CRASH = 3

LINE_CAP = 1024 * 1024
MESSAGE_ID_MAX = 256
ACK_CHARS = 200
SLOW_CAP_MS = 600_000

# A session id names a file in the store, so it must not be able to climb out of it.
_REMEMBER = re.compile(r"remember the phrase\s+([A-Za-z0-9-]+)", re.IGNORECASE)
_ASK = re.compile(r"what was the phrase", re.IGNORECASE)
_ERROR_ONCE = re.compile(r"#error-once:([A-Za-z0-9_-]{1,64})")
# Test aids for poison mail: every delivery fails, or each delivery up to the N-th does.
_ERROR_ALWAYS = re.compile(r"#error-always\b")
_ERROR_UNTIL = re.compile(r"#error-until:(\d{1,4})\b")
# ... and a provider outage: the first N attempts of a message in this process end as though
# its model provider were down (`provider-unavailable`), which is not the message's fault.
_UNAVAILABLE = re.compile(r"#unavailable:(\d{1,4})\b")
_CRASH = re.compile(r"#crash\b")
_SLOW = re.compile(r"#slow:(\d{1,9})")
# The mesh: each "Tell SEAT: TEXT" line is relayed as a direct message from this seat.
_TELL = re.compile(r"^Tell ([A-Za-z0-9_]{1,64}): (.+)$", re.MULTILINE)
_WHO = re.compile(r"who can you tell", re.IGNORECASE)
# ... and each "Post to #CHANNEL: TEXT" line as a post; both kinds are relayed in line order.
_RELAY = re.compile(
    r"^(?:Tell ([A-Za-z0-9_]{1,64})|Post to #([A-Za-z0-9_]{1,64})): (.+)$", re.MULTILINE
)
# Test aids for the mesh: a hostile seat's call that claims a sender, and a turn that dies once
# after its sends and before its reply (so it runs again and re-sends).
_FORGE = re.compile(r"#forge-sender:([A-Za-z0-9_]{1,64})")
_DIE_AFTER_TELL = re.compile(r"#die-after-tell:([A-Za-z0-9_-]{1,64})")
# A first delivery that relays, then takes this long (abortable, as `#slow` is): a cut that
# lands in it finds the sends made and the turn unfinished, so the resume delivers it again.
_SLOW_AFTER_TELL = re.compile(r"#slow-after-tell:(\d{1,9})")


# ---------------------------------------------------------------------------------------------
# The wire: one JSON object per line on stdin/stdout.

MessageId = Annotated[str, msgspec.Meta(min_length=1, max_length=MESSAGE_ID_MAX)]


class _Wire(msgspec.Struct, forbid_unknown_fields=True, tag_field="type", rename="camel"):
    pass


class PromptIn(_Wire, tag="prompt", omit_defaults=True):
    id: MessageId
    text: str
    # How many times the message has now been delivered; absent for the first.
    delivery: Annotated[int, msgspec.Meta(ge=1)] = 1


class GetStateIn(_Wire, tag="get_state"):
    id: MessageId


class QuitIn(_Wire, tag="quit"):
    pass


class MeshResultIn(_Wire, tag="mesh_result"):
    """The manager's answer to one `mesh` call of the turn in flight."""

    id: MessageId
    result: msgspec.Raw


Inbound = PromptIn | GetStateIn | QuitIn | MeshResultIn


class ReadyOut(_Wire, tag="ready"):
    session_id: str


class TurnStartOut(_Wire, tag="turn_start"):
    id: str


class DeltaOut(_Wire, tag="delta"):
    id: str
    text: str


class TurnEndOut(_Wire, tag="turn_end"):
    id: str
    # `provider-unavailable`: the turn reached no model (connectors.base.TurnOutcome).
    status: Literal["ok", "error", "aborted", "provider-unavailable"]
    reply: str
    detail: str


class StateOut(_Wire, tag="state"):
    id: str
    session_id: str


# `id` is present only when the refused line carried one, so a driver can fail exactly the
# request that was refused instead of guessing.
class ProtocolErrorOut(_Wire, tag="protocol_error", omit_defaults=True):
    detail: str
    id: str | None = None


class MeshOut(_Wire, tag="mesh"):
    """A call into the mesh (`protocol/meshcall.py`), made during a turn; it names no sender:
    the manager knows which seat's channel it came in on."""

    id: str
    call: msgspec.Raw


Outbound = ReadyOut | TurnStartOut | DeltaOut | TurnEndOut | StateOut | ProtocolErrorOut | MeshOut


class _IdProbe(msgspec.Struct):
    id: str | None = None


_inbound = msgspec.json.Decoder(Inbound, strict=True)
_outbound = msgspec.json.Decoder(Outbound, strict=True)
_id_probe = msgspec.json.Decoder(_IdProbe)
_encoder = msgspec.json.Encoder()


def decode_inbound(line: bytes) -> Inbound:
    """Strictly decode one driver line; raises `msgspec.DecodeError` when it is not a request."""
    return _inbound.decode(line)


def decode_outbound(line: bytes) -> Outbound:
    """Strictly decode one harness line; raises `msgspec.DecodeError` when it is not an event."""
    return _outbound.decode(line)


def probe_id(line: bytes) -> str | None:
    try:
        found = _id_probe.decode(line).id
    except msgspec.DecodeError:
        return None
    return found[:MESSAGE_ID_MAX] if found else None


# ---------------------------------------------------------------------------------------------
# The transcript records.


class SessionHeader(
    msgspec.Struct,
    forbid_unknown_fields=True,
    tag_field="type",
    tag="session",
    rename="camel",
    frozen=True,
):
    id: str
    parent: str | None
    created_at: str


class Message(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    role: Literal["user", "assistant"]
    text: str
    id: str
    at: str
    delivery: Annotated[int, msgspec.Meta(ge=1)] = 1


_header = msgspec.json.Decoder(SessionHeader, strict=True)
_message = msgspec.json.Decoder(Message, strict=True)


# ---------------------------------------------------------------------------------------------
# Answering and fault directives: pure functions of the prompt and the history.


def phrase_in(text: str) -> str | None:
    found = _REMEMBER.findall(text)
    return found[-1] if found else None


def recalled_phrase(history: Sequence[Message]) -> str | None:
    recalled = recalled_with_sender(history)
    return recalled[0] if recalled else None


def told_by(text: str) -> str | None:
    """Who a framed text came from as scribe says it: `a`, or `a on #plan` for a post."""
    sender = meshcall.frame_sender(text)
    channel = meshcall.frame_channel(text)
    return f"{sender} on #{channel}" if sender is not None and channel is not None else sender


def recalled_with_sender(history: Sequence[Message]) -> tuple[str, str | None] | None:
    """The last phrase the history was told, and the seat that told it (None: the operator)."""
    for message in reversed(history):
        if message.role == "user" and (phrase := phrase_in(message.text)) is not None:
            return phrase, told_by(message.text)
    return None


def answer(text: str, history: Sequence[Message]) -> str:
    # A new phrase wins over a question in the same text: the user is redefining the answer.
    if (phrase := phrase_in(text)) is not None:
        sender = told_by(text)
        return f"Noted: {phrase}." if sender is None else f"Noted: {phrase} (from {sender})."
    if _ASK.search(text):
        recalled = recalled_with_sender(history)
        if recalled is None:
            return "I do not know the phrase."
        phrase, sender = recalled
        told = "" if sender is None else f", from {sender}"
        return f"The phrase is {phrase}{told}."
    return f"ack: {text[:ACK_CHARS]}"


def tells_in(text: str) -> list[tuple[str, str]]:
    """Each "Tell SEAT: TEXT" line, in order; a text that is itself framed as a message from a
    seat is read below its frame."""
    return [(to, body.strip()) for to, body in _TELL.findall(text)]


def relays_in(text: str) -> list[tuple[str, str, str]]:
    """Each relay line, in order: ("send", SEAT, TEXT) for "Tell", ("post", CHANNEL, TEXT) for
    "Post to #"."""
    return [
        ("send", to, body.strip()) if to else ("post", channel, body.strip())
        for to, channel, body in _RELAY.findall(text)
    ]


def post_line(channel: str, result: object) -> str:
    """What the reply says of one post: delivered (stored in the channel), or refused."""
    if isinstance(result, dict) and result.get("status") == "posted":
        return f"Posted to #{channel}: delivered."
    if isinstance(result, dict) and result.get("status") == "refused":
        return (
            f"Could not post to #{channel}: refused {result.get('code')}: {result.get('message')}"
        )
    return (
        f"Could not post to #{channel}: the manager's answer was not understood ({result!r:.200})"
    )


def relay_line(to: str, result: object) -> str:
    """What the reply says of one relay: delivered, queued for a host that is gone (the
    manager's words), or refused with the refusal."""
    if isinstance(result, dict) and result.get("status") == "delivered":
        return f"Told {to}: delivered."
    if isinstance(result, dict) and result.get("status") == "queued":
        return f"Told {to}: {result.get('message')}."
    if isinstance(result, dict) and result.get("status") == "refused":
        return f"Could not tell {to}: refused {result.get('code')}: {result.get('message')}"
    return f"Could not tell {to}: the manager's answer was not understood ({result!r:.200})"


def seats_line(result: object) -> str:
    """What the reply says of a listing: the seats this one may tell, or the refusal."""
    if isinstance(result, dict) and result.get("status") == "listed":
        seats = result.get("seats") or []
        return f"I can tell: {', '.join(map(str, seats))}." if seats else "I can tell nobody."
    if isinstance(result, dict) and result.get("status") == "refused":
        return f"I cannot list the seats: refused {result.get('code')}: {result.get('message')}"
    return f"I cannot list the seats: the manager's answer was not understood ({result!r:.200})"


@dataclass(frozen=True)
class Directives:
    error_once: str | None = None
    crash: bool = False
    slow_ms: int = 0
    error_always: bool = False
    error_until: int = 0
    forge_sender: str | None = None
    die_after_tell: str | None = None
    slow_after_tell_ms: int = 0
    unavailable: int = 0


def parse_directives(text: str) -> Directives:
    error_once = _ERROR_ONCE.search(text)
    slow = _SLOW.search(text)
    until = _ERROR_UNTIL.search(text)
    forge = _FORGE.search(text)
    die = _DIE_AFTER_TELL.search(text)
    slow_after = _SLOW_AFTER_TELL.search(text)
    unavailable = _UNAVAILABLE.search(text)
    return Directives(
        unavailable=int(unavailable.group(1)) if unavailable else 0,
        error_once=error_once.group(1) if error_once else None,
        crash=_CRASH.search(text) is not None,
        slow_ms=min(int(slow.group(1)), SLOW_CAP_MS) if slow else 0,
        error_always=_ERROR_ALWAYS.search(text) is not None,
        error_until=int(until.group(1)) if until else 0,
        forge_sender=forge.group(1) if forge else None,
        die_after_tell=die.group(1) if die else None,
        slow_after_tell_ms=min(int(slow_after.group(1)), SLOW_CAP_MS) if slow_after else 0,
    )


def chunks(reply: str) -> list[str]:
    """Split a reply into word-sized deltas whose concatenation is the reply."""
    return re.findall(r"\S+\s*|\s+", reply)


now_iso = instant.now_iso


# ---------------------------------------------------------------------------------------------
# Durable files.


class StoreError(Exception):
    """The store or the requested session cannot be used; the harness refuses to start."""


def ensure_dir(path: Path) -> None:
    """Create `path` and any missing parents 0700, so transcripts never sit in a shared dir."""
    make_private_dirs(path)
    if not path.is_dir():
        raise StoreError(f"{path} is not a directory")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_pointer(path: Path, session_id: str, status: Literal["running", "quit"]) -> None:
    ensure_dir(path.parent)
    privatefs.write_pointer(path, session_id, status)


def _line(record: msgspec.Struct) -> bytes:
    return _encoder.encode(record) + b"\n"


@dataclass(frozen=True)
class Transcript:
    header: SessionHeader
    messages: list[Message]
    # Bytes up to the end of the last complete line; anything after it is a torn append.
    intact: int


def parse_transcript(data: bytes, *, session_id: str, where: Path) -> Transcript:
    intact = data.rfind(b"\n") + 1
    lines = data[:intact].splitlines()
    if not lines:
        raise StoreError(f"transcript {where} has no session header")
    try:
        header = _header.decode(lines[0])
        messages = [_message.decode(line) for line in lines[1:]]
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise StoreError(f"transcript {where} is malformed: {exc}") from None
    if header.id != session_id:
        raise StoreError(f"transcript {where} names session {header.id!r}, not {session_id!r}")
    return Transcript(header, messages, intact)


class Session:
    """An open session: its transcript fd, held under an exclusive lock, and its history."""

    def __init__(self, session_id: str, path: Path, fd: int, messages: list[Message]) -> None:
        self.id = session_id
        self.path = path
        self._fd = fd
        self.history = messages
        self._replies = {m.id: m.text for m in messages if m.role == "assistant"}

    def recorded_reply(self, message_id: str) -> str | None:
        return self._replies.get(message_id)

    def commit_turn(self, message_id: str, text: str, reply: str, delivery: int = 1) -> None:
        at = now_iso()
        user = Message(role="user", text=text, id=message_id, at=at, delivery=delivery)
        assistant = Message(role="assistant", text=reply, id=message_id, at=at)
        # One write for both lines: a kill between them cannot leave a question without its
        # answer that a later open would have to explain.
        _write_all(self._fd, _line(user) + _line(assistant))
        os.fsync(self._fd)
        self.history.extend((user, assistant))
        self._replies[message_id] = reply


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def open(cls, root: Path) -> Store:
        ensure_dir(root)
        return cls(root)

    def transcript_path(self, session_id: str) -> Path:
        if not names.SCRIBE_SESSION_ID.matches(session_id):
            raise StoreError(
                f"session id {session_id[:80]!r} is not usable as a file name "
                "(1-128 of A-Z a-z 0-9 . _ -, starting with a letter or digit)"
            )
        return self.root / f"{session_id}.jsonl"

    def read(self, session_id: str) -> Transcript:
        path = self.transcript_path(session_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise StoreError(f"no session {session_id!r} in store {self.root}") from None
        return parse_transcript(data, session_id=session_id, where=path)

    def create(self, session_id: str, parent: str | None, messages: Sequence[Message]) -> bool:
        header = SessionHeader(id=session_id, parent=parent, created_at=now_iso())
        body = _line(header) + b"".join(_line(m) for m in messages)
        return create_private_exclusive(self.transcript_path(session_id), body)

    def attach(self, session_id: str) -> Session:
        path = self.transcript_path(session_id)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreError(
                    f"session {session_id!r} is open in another scribe process"
                ) from None
            transcript = self.read(session_id)
            if transcript.intact != os.fstat(fd).st_size:
                # A kill mid-append left a partial line; the turn was never acknowledged, so
                # cutting it off loses nothing and keeps the next append parseable.
                os.ftruncate(fd, transcript.intact)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        return Session(session_id, path, fd, transcript.messages)

    def claim_fault(self, tag: str) -> bool:
        faults = self.root / "faults"
        ensure_dir(faults)
        return create_private_exclusive(faults / tag, b"")


def open_session(store: Store, *, session_id: str | None, fork: str | None) -> Session:
    if fork is not None:
        try:
            source = store.read(fork)
        except StoreError as exc:
            raise StoreError(f"cannot fork session {fork[:80]!r}: {exc}") from None
        new_id = str(uuid.uuid4())
        store.create(new_id, fork, source.messages)
        return store.attach(new_id)
    if session_id is None:
        session_id = str(uuid.uuid4())
    if not store.transcript_path(session_id).exists():
        store.create(session_id, None, ())
    return store.attach(session_id)


# ---------------------------------------------------------------------------------------------
# The serving loop.


class TurnAborted(Exception):
    pass


def send_call(to: str, text: str, directives: Directives) -> dict[str, str]:
    """A send names no sender; the forge aid adds one, which the manager refuses."""
    call = {"op": "send", "to": to, "text": text}
    if directives.forge_sender is not None:
        call["sender"] = directives.forge_sender
    return call


def post_call(channel: str, text: str, directives: Directives) -> dict[str, str]:
    """A post names no sender either; the forge aid adds one, which the manager refuses."""
    call = {"op": "post", "channel": channel, "text": text}
    if directives.forge_sender is not None:
        call["sender"] = directives.forge_sender
    return call


_json = msgspec.json.Decoder()


class Harness:
    def __init__(self, store: Store, session: Session, out: BinaryIO, pointer: Path | None) -> None:
        self.store = store
        self.session = session
        self.out = out
        self.pointer = pointer
        self._in_turn = False
        self._abortable = False
        self._abort_requested = False
        # `#unavailable:N` attempts seen per message id, in this process only.
        self._outages: dict[str, int] = {}
        # The driver's lines, shared by the serving loop and a turn waiting on a mesh answer.
        self.lines: Iterator[bytes | None] | None = None

    def emit(self, message: _Wire) -> None:
        self.out.write(_line(message))
        self.out.flush()

    def on_sigint(self, signum: int, frame: FrameType | None) -> None:
        # SIGINT aborts the turn in flight, like Esc in an interactive harness; between turns
        # it is ignored because the seat's lifetime belongs to the manager (SIGTERM/SIGKILL).
        if not self._in_turn:
            return
        self._abort_requested = True
        # Raising is safe only while the turn is pure computation; during I/O it would tear a
        # line on stdout or in the transcript, so the request is honoured at the next check.
        if self._abortable:
            raise TurnAborted

    def _think(self, slow_ms: int) -> None:
        self._abortable = True
        try:
            if self._abort_requested:
                raise TurnAborted
            if slow_ms:
                time.sleep(slow_ms / 1000)
        finally:
            self._abortable = False

    def _provider_down(self, message_id: str, times: int) -> bool:
        """The `#unavailable:N` aid: True for the first N attempts of this message here."""
        if not times:
            return False
        seen = self._outages.get(message_id, 0)
        if seen >= times:
            return False
        self._outages[message_id] = seen + 1
        return True

    def run_turn(self, message_id: str, text: str, delivery: int = 1) -> None:
        self._in_turn, self._abort_requested = True, False
        try:
            self._turn(message_id, text, delivery)
        finally:
            self._in_turn = False

    def _turn(self, message_id: str, text: str, delivery: int) -> None:
        self.emit(TurnStartOut(id=message_id))
        recorded = self.session.recorded_reply(message_id)
        if recorded is not None:
            self._finish(message_id, recorded, "duplicate delivery: replayed the recorded reply")
            return
        directives = parse_directives(text)
        try:
            self._think(directives.slow_ms)
        except TurnAborted:
            self.emit(
                TurnEndOut(
                    id=message_id, status="aborted", reply="", detail="interrupted by SIGINT"
                )
            )
            return
        if directives.crash:
            self.out.flush()
            os._exit(EXIT_CRASH)
        if directives.error_once and self.store.claim_fault(directives.error_once):
            detail = f"injected fault error-once:{directives.error_once}"
            self.emit(TurnEndOut(id=message_id, status="error", reply="", detail=detail))
            return
        if self._provider_down(message_id, directives.unavailable):
            detail = f"injected outage unavailable:{directives.unavailable} (503)"
            self.emit(
                TurnEndOut(id=message_id, status="provider-unavailable", reply="", detail=detail)
            )
            return
        if directives.error_always or delivery <= directives.error_until:
            which = "always" if directives.error_always else f"until:{directives.error_until}"
            detail = f"injected fault error-{which} (delivery {delivery})"
            self.emit(TurnEndOut(id=message_id, status="error", reply="", detail=detail))
            return
        if self._abort_requested:
            self.emit(
                TurnEndOut(
                    id=message_id, status="aborted", reply="", detail="interrupted by SIGINT"
                )
            )
            return
        relays = relays_in(text)
        if relays:
            reply = "\n".join(
                relay_line(to, self.call_mesh(f"{message_id}-{n}", send_call(to, body, directives)))
                if kind == "send"
                else post_line(
                    to, self.call_mesh(f"{message_id}-{n}", post_call(to, body, directives))
                )
                for n, (kind, to, body) in enumerate(relays)
            )
            if directives.die_after_tell and self.store.claim_fault(
                f"die-{directives.die_after_tell}"
            ):
                self.out.flush()
                os._exit(EXIT_CRASH)
            if directives.slow_after_tell_ms and delivery == 1:
                try:
                    self._think(directives.slow_after_tell_ms)
                except TurnAborted:
                    self.emit(
                        TurnEndOut(
                            id=message_id,
                            status="aborted",
                            reply="",
                            detail="interrupted by SIGINT after its relays",
                        )
                    )
                    return
        elif _WHO.search(text):
            reply = seats_line(self.call_mesh(f"{message_id}-seats", {"op": "seats"}))
        else:
            reply = answer(text, self.session.history)
        self.session.commit_turn(message_id, text, reply, delivery)
        self._finish(message_id, reply, "")

    def call_mesh(self, call_id: str, call: dict[str, str]) -> object:
        """One call through the manager, answered before the turn goes on."""
        self.emit(MeshOut(id=call_id, call=msgspec.Raw(_encoder.encode(call))))
        if self.lines is None:
            return None
        for line in self.lines:
            if line is None:
                self.emit(ProtocolErrorOut(detail=f"line exceeds the {LINE_CAP}-byte cap"))
                continue
            if not line.strip():
                continue
            try:
                request = decode_inbound(line)
            except msgspec.DecodeError as exc:
                self.emit(ProtocolErrorOut(detail=f"refused line: {exc}", id=probe_id(line)))
                continue
            match request:
                case MeshResultIn(id=answered, result=result) if answered == call_id:
                    return _json.decode(result)
                case GetStateIn(id=request_id):
                    self.emit(StateOut(id=request_id, session_id=self.session.id))
                case _:
                    self.emit(
                        ProtocolErrorOut(
                            detail="refused line: a turn is waiting on a mesh answer",
                            id=probe_id(line),
                        )
                    )
        # The driver is gone mid-turn: nobody is left to answer or to hear the reply.
        raise BrokenPipeError("the driver closed its end during a mesh call")

    def _finish(self, message_id: str, reply: str, detail: str) -> None:
        for piece in chunks(reply):
            self.emit(DeltaOut(id=message_id, text=piece))
        self.emit(TurnEndOut(id=message_id, status="ok", reply=reply, detail=detail))

    def handle_line(self, line: bytes) -> bool:
        """Act on one driver line; False when the driver asked the harness to quit."""
        try:
            request = decode_inbound(line)
        except msgspec.DecodeError as exc:
            self.emit(ProtocolErrorOut(detail=f"refused line: {exc}", id=probe_id(line)))
            return True
        match request:
            case PromptIn(id=message_id, text=text, delivery=delivery):
                self.run_turn(message_id, text, delivery)
            case GetStateIn(id=request_id):
                self.emit(StateOut(id=request_id, session_id=self.session.id))
            case QuitIn():
                if self.pointer is not None:
                    write_pointer(self.pointer, self.session.id, "quit")
                return False
            case MeshResultIn(id=request_id):
                # An answer to no call in flight (a late one): said so, never taken for another.
                self.emit(ProtocolErrorOut(detail="no mesh call is waiting", id=request_id))
        return True

    def serve(self, inp: BinaryIO) -> int:
        if self.lines is None:
            self.lines = read_lines(inp, LINE_CAP)
        for line in self.lines:
            if line is None:
                self.emit(ProtocolErrorOut(detail=f"line exceeds the {LINE_CAP}-byte cap"))
            elif line.strip() and not self.handle_line(line):
                return EXIT_OK
        return EXIT_OK


def read_lines(inp: BinaryIO, cap: int) -> Iterator[bytes | None]:
    """Yield each line without its newline, or None for a line longer than `cap` (skipped)."""
    while True:
        line = inp.readline(cap + 1)
        if not line:
            return
        if line.endswith(b"\n") or len(line) <= cap:
            yield line.rstrip(b"\r\n")
            continue
        while line and not line.endswith(b"\n"):
            line = inp.readline(cap)
        yield None
