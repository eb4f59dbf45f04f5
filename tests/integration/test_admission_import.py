"""Admission refuses, by name and before any custody claim, every carried inbox message the
import could not republish as it stands: a subject with an empty token, a header the broker acts
on at publish (`Nats-Rollup`, `Nats-TTL`, `Nats-Expected-*`), a message id carried twice (the
broker would keep one and drop the rest as duplicates).

Each checkpoint is cut by a real manager against a real nats-server, then its seat's inbox is
rewritten and the seat and manifest re-sealed by the source's own key, as a trusted but faulty
writer would; the destination is the source root, whose journal must stay `ready`.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from protocol import names
from protocol.checkpoint import INBOX_FILE, CarriedMessage, SeatCheckpoint, encode_inbox
from protocol.messages import DirectMessage, encode
from tests.ckpt import (
    Cut,
    broker_args,
    custody,
    file_ref,
    make_cut,
    manager_answers,
    reseal,
    snapshot,
    source_identity,
)
from tests.conftest import Cli, SharedBroker

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SEAT = "scribe1"
JOURNAL = ".cotal/maintenance/v1/journal.json"
CURE = "copy the attempt again from the source host, or cut the seat again there"

Headers = dict[str, str]


def message_id(n: int) -> str:
    return f"{n:032x}"


def dm_headers(n: int) -> Headers:
    return {"Nats-Msg-Id": message_id(n)}


def subject(seat: str = SEAT, sender: str = names.OPERATOR_ACTOR) -> str:
    return names.dm_subject("main", names.SEAT_OWNER, seat, names.SEAT_OWNER, sender)


def payload(seat: str, n: int) -> bytes:
    return encode(
        DirectMessage(
            id=message_id(n),
            sender=f"{names.SEAT_OWNER}.{names.OPERATOR_ACTOR}",
            recipient=f"{names.SEAT_OWNER}.{seat}",
            text=f"carried message {n}",
            sent_at="2026-12-03T08:00:00.000Z",
        )
    )


def carry(
    ckpt: Path, seat: str, messages: list[tuple[str, Headers]]
) -> Callable[[SeatCheckpoint], SeatCheckpoint]:
    """A seat-record edit that writes `messages` (subject, headers) as the seat's inbox.jsonl
    and describes them in its record: sequences from the durable's start on, the window, the
    count, the payload bytes and the file's digest."""

    def edit(record: SeatCheckpoint) -> SeatCheckpoint:
        if record.name != seat:
            return record
        state = record.space_state
        assert state is not None, "a cut against a broker carries the seat's space"
        start = state.durable.start_seq
        carried = [
            CarriedMessage(
                seq=start + i,
                subject=subj,
                headers=headers,
                payload=base64.b64encode(payload(seat, i)).decode(),
            )
            for i, (subj, headers) in enumerate(messages)
        ]
        path = ckpt / seat / INBOX_FILE
        path.write_bytes(encode_inbox(carried))
        last = max(state.durable.last_seq, start + len(carried) - 1)
        durable = msgspec.structs.replace(state.durable, last_seq=last)
        space = msgspec.structs.replace(
            state,
            durable=durable,
            messages=len(carried),
            message_bytes=sum(len(m.data()) for m in carried),
            inbox=file_ref(path),
        )
        return msgspec.structs.replace(record, space_state=space)

    return edit


def forged(cut: Cut, tmp_path: Path, messages: list[tuple[str, Headers]], seat: str = SEAT) -> Path:
    dst = tmp_path / "forged"
    return reseal(cut.copy, dst, source_identity(cut.root), edit=carry(dst, seat, messages))


def refusal_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 2, f"{proc.stdout}\n{proc.stderr}"
    assert proc.stdout == "", proc.stdout
    doc: dict[str, Any] = json.loads(proc.stderr.splitlines()[-1])
    return doc


async def refused(cli: Cli, cut: Cut, ckpt: Path, *, code: str, contains: list[str]) -> str:
    """`cotal up --restore` exits 2 with `code`, and nothing moved: the root's journal is still
    the cut's `ready`, the root is byte for byte as it was, no manager runs, and custody at the
    broker is the source's generation 0 with no claim for the attempt."""
    before = snapshot(cli.root)
    assert json.loads((cli.root / JOURNAL).read_text())["state"] == "ready"
    proc = cli.run(
        "up", "--restore", str(ckpt), "--json", *broker_args(cut.broker), *cut.trust, check=False
    )
    out = refusal_of(proc)
    assert out["ok"] is False and out["code"] == code, out
    for text in [*contains, CURE]:
        assert text in out["error"], f"{text!r} not in {out['error']!r}"
    assert "admitted:" not in proc.stderr and "claiming custody" not in proc.stderr
    assert snapshot(cli.root) == before
    journal = json.loads((cli.root / JOURNAL).read_text())
    assert journal["state"] == "ready" and journal["attemptId"] == cut.attempt_id
    assert not manager_answers(cli.root)
    for seat in cut.rows:
        record, attempt = await custody(cut.broker, seat, cut.uid(seat), cut.attempt_id)
        assert record is not None and record["generation"] == 0, record
        assert record["holder"] == cut.instance_id and "attemptId" not in record, record
        assert attempt is None, attempt
    return str(out["error"])


@pytest.fixture
def cut(cli: Cli, shared_broker: SharedBroker, tmp_path: Path) -> Cut:
    return make_cut(cli, shared_broker, tmp_path / "ckpt")


# Each case: the carried messages, the code, and what the message must name (seat, position).
CASES: dict[str, tuple[list[tuple[str, Headers]], str, list[str]]] = {
    "empty-token": (
        [
            (subject(), dm_headers(0)),
            (subject().replace(".operator", "..operator"), dm_headers(1)),
        ],
        "inbox-subject",
        [
            f"seat {SEAT}: {INBOX_FILE} line 2 (message ",
            f"{subject().replace('.operator', '..operator')!r}, which has an empty token",
        ],
    ),
    "rollup": (
        [(subject(), {**dm_headers(0), "Nats-Rollup": "sub"})],
        "inbox-header",
        [f"seat {SEAT}: {INBOX_FILE} line 1 (message ", "carries the Nats-Rollup header"],
    ),
    "ttl": (
        [(subject(), dm_headers(0)), (subject(), dm_headers(1)), (subject(), {"Nats-TTL": "5s"})],
        "inbox-header",
        [f"seat {SEAT}: {INBOX_FILE} line 3 (message ", "carries the Nats-TTL header"],
    ),
    "expected-sequence": (
        [(subject(), {**dm_headers(0), "Nats-Expected-Last-Subject-Sequence": "7"})],
        "inbox-header",
        [
            f"seat {SEAT}: {INBOX_FILE} line 1 (message ",
            "carries the Nats-Expected-Last-Subject-Sequence header",
        ],
    ),
    "duplicate-id": (
        [(subject(), dm_headers(0)), (subject(), dm_headers(1)), (subject(), dm_headers(1))],
        "inbox-duplicate-id",
        [
            f"seat {SEAT}: {INBOX_FILE} line 3 (message ",
            f"carries message id {message_id(1)!r}, as does {INBOX_FILE} line 2 (message ",
            "drops the other as a duplicate",
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_message_the_import_cannot_republish_is_refused_before_any_claim(
    cli: Cli, cut: Cut, tmp_path: Path, case: str
) -> None:
    messages, code, contains = CASES[case]
    error = await refused(cli, cut, forged(cut, tmp_path, messages), code=code, contains=contains)
    assert error.startswith("admission refused at the integrity gate: "), error


async def test_a_carried_inbox_the_import_can_republish_is_admitted(
    cli: Cli, cut: Cut, tmp_path: Path
) -> None:
    """The control: the same forgery with well-formed messages (ids distinct or absent, headers
    of the sender's own) passes every gate, so each refusal above is its fault's alone."""
    messages = [
        (subject(), dm_headers(0)),
        (subject(sender="scribe2"), {"Nats-Msg-Id": "redeliver-DEAD_main-4"}),
        (subject(), {"Cotal-Prior-Deliveries": "3"}),
        (subject(), {}),
    ]
    ckpt = forged(cut, tmp_path, messages)
    out = json.loads(
        cli.run(
            "checkpoint", "verify", str(ckpt), "--json", *broker_args(cut.broker), *cut.trust
        ).stdout
    )
    assert out["admitted"] is True
    assert out["gates"] == {"integrity": "pass", "identity": "pass", "recency": "pass"}


async def test_one_message_id_in_two_seats_inboxes_is_refused(
    cli: Cli, shared_broker: SharedBroker, tmp_path: Path
) -> None:
    """Every seat's inbox is republished into the space's one DM stream, within one duplicate
    window: the same id under two seats loses one of them just as within one inbox."""
    two = make_cut(cli, shared_broker, tmp_path / "ckpt", seats=("scribe1", "scribe2"))
    dst = tmp_path / "forged"
    first, second = (
        carry(dst, "scribe1", [(subject("scribe1"), dm_headers(5))]),
        carry(
            dst,
            "scribe2",
            [(subject("scribe2"), dm_headers(6)), (subject("scribe2"), dm_headers(5))],
        ),
    )
    ckpt = reseal(two.copy, dst, source_identity(two.root), edit=lambda r: second(first(r)))
    await refused(
        cli,
        two,
        ckpt,
        code="inbox-duplicate-id",
        contains=[
            f"seat scribe2: {INBOX_FILE} line 2 (message ",
            f"as does seat scribe1's {INBOX_FILE} line 1 (message ",
        ],
    )
