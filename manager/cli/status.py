"""`cotal status`: what is up in a root and what is waiting there, whether or not a manager runs.

A report, never a refusal: nothing up is an answer (exit 0). Every fact is read from where it
lives: the manager answers for itself over the control socket; the broker is the mesh record;
the signing key is the instance identity file; what waits is the maintenance journal (a sealed
cut not yet restored, an attempt cut short) and the seat records a manager started here would
take back. Nothing here writes, takes a lock or mints anything.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import NotRequired, TypedDict

import msgspec

from manager.coord import mesh
from manager.procs import alive
from manager.workspace import identity, trust
from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from manager.workspace.private import read_stable
from protocol import control
from protocol.control import StatusReply
from protocol.errors import DecodeError, Refusal
from protocol.lifecycle import SEAT_RECORD_CAP, decode_seat_record
from protocol.maintenance import (
    CUT_UNDER_WAY,
    DEGRADED,
    READY,
    RESUME_UNDER_WAY,
    JournalRecord,
    rerun,
)
from protocol.mesh import MeshRecord
from protocol.refusals import Code

_IDENTITY_FILE = re.compile(r"^manager-instance\.([0-9a-f]+)\.json\Z")

# The report's sections, typed as the JSON document `cotal status --json` prints: a report read
# from many places, each section as its source has it, so dictionaries of known keys rather than
# records (the manager section is the manager's own status under its wire keys, plus what this
# root's files say of it).
Section = dict[str, object]


class Broker(TypedDict):
    url: str | None
    embedded: bool | None
    pid: int | None
    alive: bool | None
    error: NotRequired[str | None]


class Seats(TypedDict):
    count: int
    byState: dict[str, int]
    source: str
    # `[failover]`: each seat its manager killed when its lease went silent, with the reason.
    selfFenced: NotRequired[dict[str, str]]


class Waiting(TypedDict):
    what: str
    detail: str
    next: list[str]
    attemptId: NotRequired[str]
    journalState: NotRequired[str]
    checkpointDir: NotRequired[str | None]
    updatedAt: NotRequired[str]


class HandedOff(TypedDict):
    attemptId: str
    packedAt: str
    sha256: str
    seats: list[str]


class Custody(TypedDict):
    holder: object


class PartialCut(TypedDict):
    attemptId: str
    state: str
    seats: list[str]
    commitStarted: bool


class Clock(TypedDict):
    synchronized: bool
    # `kernel`, the operator's declaration in cotal.toml, or the test hook.
    source: str
    detail: str


class Status(TypedDict):
    root: str
    up: bool
    manager: Section
    broker: Broker
    seats: Seats
    custody: Custody
    waiting: list[Waiting]
    handedOff: list[HandedOff]
    boxKey: str | None
    boxKeyError: NotRequired[str]
    partialCut: PartialCut | None
    clock: Clock
    # The keys `cotal status --json` always had, at the top for scripts that read them.
    state: object
    pid: object
    space: object
    instanceId: object
    startedAt: object
    server: object
    seatCount: int


def gather(root: Path) -> Status:
    layout = Layout.at(root)
    try:
        # Read first: a root without a token never had a manager, and anything else wrong with
        # the control directory is reported as what it is.
        mesh.read_token(layout)
        has_token = True
    except Refusal as exc:
        if exc.code != Code.NOT_UP:
            raise
        has_token = False
    record, record_error = _mesh_record(layout)
    answered, manager = _manager(layout, record, has_token)
    space = (answered.space if answered is not None else None) or (
        record.space if record is not None else None
    )
    manager.update(_identity(layout, space))
    broker = _broker(record, record_error)
    seats = _seats(layout, answered)
    box_key, box_error = _box_key(layout)
    doc: Status = {
        "root": str(layout.root),
        "up": manager["state"] not in ("down", "unresponsive"),
        "manager": manager,
        "broker": broker,
        "seats": seats,
        "custody": {"holder": manager.get("instanceId")},
        "waiting": waiting(layout),
        "handedOff": handed_off(layout),
        "boxKey": box_key,
        "partialCut": _partial_cut(answered),
        "clock": _clock(layout),
        "state": manager.get("state"),
        "pid": manager.get("pid"),
        "space": manager.get("space"),
        "instanceId": manager.get("instanceId"),
        "startedAt": manager.get("startedAt"),
        "server": manager.get("server") or broker.get("url"),
        "seatCount": seats["count"],
    }
    if box_error is not None:
        doc["boxKeyError"] = box_error
    return doc


def _clock(layout: Layout) -> Clock:
    """Whether a resume here could judge a checkpoint's age, and who vouches for the clock."""
    from manager import registry
    from manager.checkpoint import clock

    try:
        declared = registry.trusted_clock_reason(registry.load_config(layout.root).recency)
    except Refusal:
        # A cotal.toml that does not parse declares nothing; `up` and `doctor` name the fault.
        declared = None
    reading = clock.read_clock(declared)
    return {
        "synchronized": reading.synchronized,
        "source": reading.source,
        "detail": reading.detail,
    }


def _partial_cut(answered: StatusReply | None) -> PartialCut | None:
    some = answered.partial_cut if answered is not None else None
    if some is None:
        return None
    return {
        "attemptId": some.attempt_id,
        "state": some.state,
        "seats": some.seats,
        "commitStarted": some.commit_started,
    }


def _mesh_record(layout: Layout) -> tuple[MeshRecord | None, str | None]:
    try:
        return mesh.read_mesh(layout), None
    except (Refusal, DecodeError) as exc:
        return None, str(exc)


def _manager(
    layout: Layout, record: MeshRecord | None, has_token: bool
) -> tuple[StatusReply | None, Section]:
    """The manager's own status when it answers, and the report's `manager` section: that
    status under its wire keys, or what the mesh record says of a manager that does not."""
    answered: StatusReply | None = None
    error: str | None = None
    if has_token:
        try:
            answered = mesh.daemon_status(layout)
        except Refusal as exc:
            error = exc.text
    if answered is not None:
        return answered, {**msgspec.to_builtins(answered), "answering": True}
    ref = record.manager if record is not None else None
    if ref is not None and alive(ref):
        return None, {
            "state": "unresponsive",
            "pid": ref.pid,
            "answering": False,
            "error": error or f"manager pid {ref.pid} is alive but does not answer",
        }
    return None, {"state": "down", "pid": None, "answering": False}


def _identity(layout: Layout, space: str | None) -> Section:
    """The instance id and its signing public key: what a destination pins with `cotal trust
    add`. Read from the file, never minted: a status that created one would invent an
    authority."""
    spaces = [space] if space else _identity_spaces(layout)
    if not spaces:
        return {"publicKey": None}
    found = spaces[0]
    path = layout.instance_identity(found)
    if not path.exists():
        return {"publicKey": None, "space": found}
    try:
        ident = identity._load(path, found)
    except Refusal as exc:
        return {"publicKey": None, "space": found, "identityError": exc.text}
    return {
        "space": found,
        "instanceId": ident.instance_id,
        "publicKey": ident.public_key_b64,
        # What an untrusted-signer refusal at a destination tells its operator to compare.
        "fingerprint": trust.fingerprint(ident.public_key_b64),
    }


def _box_key(layout: Layout) -> tuple[str | None, str | None]:
    """The key a pack is sealed to for this root (`checkpoint pack --to`), made on first ask at
    a root that has a control directory; a directory that is no root yet stays untouched."""
    if not layout.control.is_dir():
        return None, None
    from manager.workspace.boxkey import box_public_key

    try:
        return box_public_key(layout), None
    except Refusal as exc:
        return None, exc.text


def _identity_spaces(layout: Layout) -> list[str]:
    if not layout.auth.is_dir():
        return []
    spaces: list[str] = []
    for path in sorted(layout.auth.iterdir()):
        match = _IDENTITY_FILE.match(path.name)
        if match is None:
            continue
        try:
            spaces.append(bytes.fromhex(match.group(1)).decode())
        except (ValueError, UnicodeDecodeError):
            continue
    return spaces


def _broker(record: MeshRecord | None, error: str | None) -> Broker:
    if record is None:
        return {"url": None, "embedded": None, "pid": None, "alive": None, "error": error}
    ref = record.embedded_broker
    live = alive(ref) if ref is not None else None
    return {
        "url": record.server,
        "embedded": ref is not None,
        "pid": ref.pid if ref is not None and live else None,
        "alive": live,
    }


def _seats(layout: Layout, answered: StatusReply | None) -> Seats:
    """By state: the manager's table when it answers, else the records on disk, which are the
    seats the next `cotal up` takes back (running ones relaunched, stopped ones kept)."""
    if answered is not None:
        table = dict(answered.seat_states)
        count = answered.seats
        if not table and count:
            table = {"unknown": count}
        found: Seats = {"count": count, "byState": table, "source": "manager"}
        # Only when there are some: a status without fenced seats reads as it always did.
        fenced = _self_fenced(layout) if table.get("stopped") else {}
        if fenced:
            found["selfFenced"] = fenced
        return found
    states: dict[str, int] = {}
    unreadable = 0
    directory = layout.seats
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    for path in files:
        try:
            data = read_stable(path, cap=SEAT_RECORD_CAP, what="seat record").data
            state = decode_seat_record(data, where=str(path)).state
        except (DecodeError, Refusal, OSError):
            unreadable += 1
            continue
        states[state] = states.get(state, 0) + 1
    if unreadable:
        states["unreadable"] = unreadable
    return {"count": len(files), "byState": dict(sorted(states.items())), "source": "records"}


def _self_fenced(layout: Layout) -> dict[str, str]:
    """The stopped seats whose manager fenced itself (`[failover]`), each with its reason, as
    `ps` shows them; none when the manager does not answer the ask."""
    from manager.control.oneshot import run_request

    try:
        rows = run_request(layout.root, control.PS, control.NoArgs(), 10.0)
    except Refusal:
        return {}
    return {
        row.name: row.reason
        for row in rows
        if row.reason is not None and row.reason.startswith("self-fenced")
    }


def waiting(layout: Layout) -> list[Waiting]:
    """What a plain `cotal up` does not finish, each with the exact command that does."""
    try:
        record = Journal(layout).load()
    except Refusal as exc:
        return [
            {
                "what": "journal-unreadable",
                "detail": exc.message,
                "next": [exc.cure],
            }
        ]
    if record is None:
        return []
    return [item] if (item := _waiting_on(record, layout)) is not None else []


def handed_off(layout: Layout) -> list[HandedOff]:
    """Attempts this root packed and handed off, not taken back: their seats are not this
    root's to resume."""
    if not layout.handoffs.is_dir():
        # Most roots never packed anything: `up` asks here, and need not import the packing.
        return []
    from manager.coord.checkpoints import standing_handoffs

    return [
        {
            "attemptId": h.attempt_id,
            "packedAt": h.packed_at,
            "sha256": h.sha256,
            "seats": [s.name for s in h.seats],
        }
        for h in standing_handoffs(layout)
    ]


def _waiting_on(record: JournalRecord, layout: Layout) -> Waiting | None:
    """The attempt a plain `cotal up` warns of, with the command that finishes it."""
    if not rerun(record.state, "up").warns:
        return None
    found = _finishing(record, layout)
    if found is None:
        return None
    what, detail, steps = found
    return {
        "attemptId": record.attempt_id,
        "journalState": record.state,
        "checkpointDir": record.checkpoint_dir,
        "updatedAt": record.updated_at,
        "what": what,
        "detail": detail,
        "next": steps,
    }


def _finishing(record: JournalRecord, layout: Layout) -> tuple[str, str, list[str]] | None:
    """What waits, in words, and the commands that finish it, first the one to run."""
    restore = f"cotal up --restore {record.checkpoint_dir or 'DIR'}"
    discard = f"cotal checkpoint discard {record.attempt_id}"
    if record.state == READY and any(
        h["attemptId"] == record.attempt_id for h in handed_off(layout)
    ):
        # Packed and carried away: resuming here would run the seats twice; what is left is
        # tidying up, or an explicit take-back.
        return (
            "handed-off",
            f"cut {record.attempt_id} was packed and handed off; its seats run "
            "wherever the packed copy is resumed",
            [discard, f"{restore} --take-back"],
        )
    if record.state == READY:
        return (
            "sealed-cut",
            f"cut {record.attempt_id} is sealed and not restored",
            [restore, discard],
        )
    if record.state in CUT_UNDER_WAY:
        return (
            "cut-under-way",
            f"cut {record.attempt_id} stopped at {record.state}",
            ["cotal down --preserve-state"],
        )
    if record.state in RESUME_UNDER_WAY:
        return (
            "resume-under-way",
            f"resume {record.attempt_id} stopped at {record.state}",
            [restore],
        )
    if record.state == DEGRADED:
        degraded = record.degraded
        # The waiting item is named for the journal state it reports.
        return (
            DEGRADED,
            f"attempt {record.attempt_id} is degraded"
            + (f": {degraded.reason}" if degraded is not None else ""),
            ([degraded.recourse] if degraded is not None else []) + [discard],
        )
    return None


_NEXT_LABELS = {
    "sealed-cut": ("restore", "discard"),
    DEGRADED: ("recourse", "discard"),
    "handed-off": ("discard", "take back"),
}


def warning_lines(items: list[Waiting]) -> list[str]:
    """What `cotal up` says on stderr about an attempt it will not finish itself."""
    lines: list[str] = []
    for item in items:
        lines.append(f"warning: {item['detail']}; a plain `cotal up` starts a fresh mesh beside it")
        labels = _NEXT_LABELS.get(item["what"], ())
        for i, step in enumerate(item["next"]):
            label = labels[i] if i < len(labels) else "continue"
            lines.append(f"  {label + ':':<9} {step}")
        if item["what"] in ("sealed-cut", "handed-off"):
            lines.append(
                "  next cut: `cotal down --preserve-state` refuses (sealed-cut-waiting) while "
                f"cut {item['attemptId']} waits and this mesh runs a seat; discard it first "
                "(after packing it, to keep it)"
            )
    return lines


def print_human(doc: Status, say: Callable[[str], None]) -> None:
    say(f"root      {doc['root']}")
    _print_manager(doc["manager"], say)
    _print_rest(doc, say)


def _print_manager(manager: Section, say: Callable[[str], None]) -> None:
    if manager["state"] == "down":
        say("manager   not running")
    else:
        line = f"manager   {manager['state']}  pid {manager['pid']}"
        if manager.get("startedAt"):
            line += f"  since {manager['startedAt']}"
        say(line)
        if manager.get("error"):
            say(f"          {manager['error']}")
    if manager.get("instanceId"):
        say(f"instance  {manager['instanceId']}  space {manager.get('space')}")
    if manager.get("publicKey"):
        say(f"signer    {manager['publicKey']}  (carry it: cotal trust add KEY)")
        say(f"          fingerprint {manager['fingerprint']}")
    if manager.get("identityError"):
        say(f"signer    unreadable: {manager['identityError']}")


def _print_rest(doc: Status, say: Callable[[str], None]) -> None:
    manager, broker, seats = doc["manager"], doc["broker"], doc["seats"]
    some = doc["partialCut"]
    if some is not None:
        say(
            f"cutting   seat(s) {', '.join(some['seats'])} (attempt {some['attemptId']}, "
            f"{some['state']}); the rest of the mesh runs on"
        )
    fenced = seats.get("selfFenced")
    if fenced:
        say(
            f"fenced    seat(s) {', '.join(sorted(fenced))} killed: "
            f"{next(iter(fenced.values()))}; started again once the broker answers"
        )
    time = doc["clock"]
    trusted = "synchronized" if time["synchronized"] else "NOT synchronized (a resume here refuses)"
    source = "" if time["source"] == "kernel" else f", by {time['source']}"
    say(f"clock     {trusted}{source}: {time['detail']}")
    if doc.get("boxKey"):
        say(f"box key   {doc['boxKey']}  (seal a pack to this root: checkpoint pack --to KEY)")
    elif doc.get("boxKeyError"):
        say(f"box key   unreadable: {doc['boxKeyError']}")
    if broker["url"] is None:
        say("broker    none recorded" + (f" ({broker['error']})" if broker.get("error") else ""))
    elif broker["embedded"]:
        state = f"pid {broker['pid']}" if broker["alive"] else "not running"
        say(f"broker    {broker['url']}  embedded, {state}")
    else:
        say(f"broker    {broker['url']}  external")
    by_state = ", ".join(f"{n} {s}" for s, n in seats["byState"].items())
    where = "" if seats["source"] == "manager" else " recorded (taken back by `cotal up`)"
    say(f"seats     {seats['count']}{where}" + (f": {by_state}" if by_state else ""))
    if seats["source"] == "manager":
        # Each seat's dead letters (`cotal inbox SEAT`), as the manager counts them.
        dead = manager.get("deadLetters") or {}
        assert isinstance(dead, dict)
        listed = ", ".join(f"{name} {n}" for name, n in dead.items())
        say(f"dead      {listed} (see cotal inbox SEAT)" if dead else "dead      none")
    if doc["custody"]["holder"]:
        say(f"custody   held by this instance ({doc['custody']['holder']})")
    for h in doc["handedOff"]:
        say(f"handed    {h['attemptId']} off at {h['packedAt']} (seats {', '.join(h['seats'])})")
    if not doc["waiting"]:
        say("waiting   nothing")
    for item in doc["waiting"]:
        say(f"waiting   {item['detail']}")
        if item.get("checkpointDir"):
            say(f"          checkpoint {item['checkpointDir']}")
        labels = _NEXT_LABELS.get(item["what"], ())
        for i, step in enumerate(item["next"]):
            label = labels[i] if i < len(labels) else "continue"
            say(f"          {label + ':':<9} {step}")
    if not doc["up"] and not doc["waiting"]:
        say(f"nothing is up in {doc['root']}")
