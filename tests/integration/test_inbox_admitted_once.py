"""A restore's admission reads each carried inbox for the import once, in its inbox check: the
messages it keeps are exactly what inbox.jsonl decodes to, and the restore imports those, not
whatever the file holds by then; an admission for a verify keeps none (real cut, real broker)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from manager.checkpoint import admit
from manager.coord.admission import CarriedSpace, read_inboxes
from protocol import names
from protocol.checkpoint import (
    INBOX_FILE,
    CarriedMessage,
    SeatCheckpoint,
    decode_inbox,
    encode_inbox,
)
from tests.ckpt import file_ref, make_cut, reseal, source_identity
from tests.conftest import Cli, SharedBroker

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SEAT = "scribe1"


def carried(start: int) -> list[CarriedMessage]:
    subject = names.dm_subject("main", names.SEAT_OWNER, SEAT, names.SEAT_OWNER, "operator")
    return [
        CarriedMessage(
            seq=start + i,
            subject=subject,
            headers={"Nats-Msg-Id": f"{i:032x}"} if i != 2 else {},
            payload=base64.b64encode(f"carried {i}".encode() * i).decode(),
        )
        for i in range(5)
    ]


def with_inbox(dst: Path) -> Callable[[SeatCheckpoint], SeatCheckpoint]:
    def edit(record: SeatCheckpoint) -> SeatCheckpoint:
        state = record.space_state
        assert state is not None
        messages = carried(state.durable.start_seq)
        path = dst / record.name / INBOX_FILE
        path.write_bytes(encode_inbox(messages))
        durable = msgspec.structs.replace(
            state.durable, last_seq=max(state.durable.last_seq, messages[-1].seq)
        )
        space = msgspec.structs.replace(
            state,
            durable=durable,
            messages=len(messages),
            message_bytes=sum(len(m.data()) for m in messages),
            inbox=file_ref(path),
        )
        return msgspec.structs.replace(record, space_state=space)

    return edit


def test_the_restore_imports_what_admission_read_and_proved(
    cli: Cli, shared_broker: SharedBroker, tmp_path: Path
) -> None:
    cut = make_cut(cli, shared_broker, tmp_path / "ckpt")
    dst = tmp_path / "forged"
    ckpt = reseal(cut.copy, dst, source_identity(cut.root), edit=with_inbox(dst))
    keys = [cut.signer_key]
    path = ckpt / SEAT / INBOX_FILE
    sealed = path.read_bytes()

    adm = admit.integrity(ckpt, trusted_keys=keys, keep_in=tmp_path / "scratch-parent")
    try:
        state = adm.records[SEAT].space_state
        assert state is not None
        assert list(adm.inboxes) == [SEAT] and list(adm.inboxes[SEAT]) == [INBOX_FILE]
        kept = adm.inboxes[SEAT][INBOX_FILE]
        assert kept == decode_inbox(sealed, state)
        assert [m.msg_id for m in kept] == [f"{i:032x}" if i != 2 else None for i in range(5)]
        # Whatever the file holds after admission, the import republishes the sealed bytes.
        path.write_bytes(b"")
        assert read_inboxes(adm) == {SEAT: CarriedSpace(inbox=kept, posts={})}
    finally:
        admit.discard_scratch(adm)

    path.write_bytes(sealed)
    verified = admit.integrity(ckpt, trusted_keys=keys)
    assert verified.inboxes == {}
    # An admission that kept none is read, re-hashed and proven here instead.
    assert read_inboxes(verified) == {
        SEAT: CarriedSpace(inbox=decode_inbox(sealed, state), posts={})
    }
