"""The control ops table and the daemon's handlers: one handler per op in OPS, checked before the
daemon serves; replies are the ops' own records, on the wire under the same camelCase keys the
CLI reads; the typed client decodes them back into those records.

A real Manager (no broker connection: the ops used here read only its table) behind a real
ControlServer on a Unix socket, and the real client."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import msgspec
import pytest
from nats.aio.client import Client

from manager.control.client import ControlClient, ControlError
from manager.control.server import ControlServer
from manager.daemon import handlers
from manager.daemon.core import Manager
from manager.workspace.identity import load_or_create_identity
from manager.workspace.layout import Layout
from protocol import control
from protocol.codec import encode_json
from protocol.errors import DecodeError, Refusal

SPACE = "unit"
TOKEN = "cd" * 32


def _manager(root: Path) -> Manager:
    layout = Layout.at(root)
    identity = load_or_create_identity(layout, SPACE)
    return Manager(layout, SPACE, Client(), identity, "nats://127.0.0.1:1")


def test_the_daemon_answers_exactly_the_ops_in_ops(tmp_path: Path) -> None:
    built = handlers.build(_manager(tmp_path))
    assert sorted(built) == sorted(control.OPS)


def test_an_op_without_a_handler_is_refused_at_start_up(tmp_path: Path) -> None:
    built = handlers.build(_manager(tmp_path))
    del built["send"]
    with pytest.raises(Refusal) as refused:
        handlers.serving(built)
    assert refused.value.code == "unsupported-op"
    assert "no handler for op(s) send" in refused.value.message
    assert "will not serve" in refused.value.message


def test_a_handler_no_op_names_is_refused_at_start_up(tmp_path: Path) -> None:
    built = handlers.build(_manager(tmp_path))

    async def stray(_args: object) -> None:
        return None

    with pytest.raises(Refusal) as refused:
        handlers.serving({**built, "reboot": stray})
    assert refused.value.code == "unsupported-op"
    assert "handler(s) reboot answer no op in OPS" in refused.value.message


def test_an_op_registered_twice_is_refused(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    table = handlers.Table()
    handlers.seats.SeatHandlers(mgr).register(table)
    with pytest.raises(Refusal) as refused:
        table.add(control.STATUS, handlers.seats.SeatHandlers(mgr).status)
    assert refused.value.code == "unsupported-op"
    assert "'status' has two handlers" in refused.value.message


def _keys(record: msgspec.Struct) -> list[str]:
    return sorted(msgspec.json.decode(encode_json(record)))


def test_replies_keep_the_wire_keys_the_cli_reads() -> None:
    """The records are the JSON the handlers sent as dicts before: same keys, and a key only
    some replies carry is absent (not null) in the others."""
    assert _keys(control.SendReply(id="m", seq=1, seat="a")) == ["id", "seat", "seq"]
    assert _keys(control.SendReply(id="m", seq=1, seat="a", reply="r", attempts=1)) == [
        "attempts",
        "id",
        "reply",
        "seat",
        "seq",
    ]
    stop = control.StopSeatReply(
        name="a",
        lifecycle_uid="u",
        exit_code=None,
        last_exit="0",
        state="stopped",
        already_stopped=False,
        kept=True,
    )
    assert _keys(stop) == [
        "alreadyStopped",
        "exitCode",
        "kept",
        "lastExit",
        "lifecycleUid",
        "name",
        "state",
    ]
    assert _keys(control.ShutdownReply(stopped=[])) == ["stopped"]
    assert _keys(control.ShutdownReply(stopped=[], footprint_kept=True, state="resuming")) == [
        "footprintKept",
        "state",
        "stopped",
    ]
    failed = control.CommitReply(
        attempt_id="t",
        state="preserving",
        checkpoint_dir="/x",
        sealed=False,
        seats=[],
        failures=[control.SeatFailure(name="a", error="e", code="capture-failed")],
        mid_turn=[control.MidTurn(name="a", message_id="m")],
        timings_ms={},
        evidence="/x",
    )
    assert msgspec.json.decode(encode_json(failed)) == {
        "attemptId": "t",
        "state": "preserving",
        "checkpointDir": "/x",
        "evidence": "/x",
        "sealed": False,
        "seats": [],
        "failures": [{"name": "a", "error": "e", "code": "capture-failed"}],
        "midTurn": [{"name": "a", "messageId": "m"}],
        "timingsMs": {},
    }


def test_a_reply_of_the_wrong_shape_is_refused_by_the_typed_decode() -> None:
    with pytest.raises(DecodeError) as refused:
        control.decode_result(control.STATUS, b'{"pid": 1}')
    assert refused.value.code == "malformed"
    assert "status result" in refused.value.message


@pytest.mark.anyio
async def test_the_typed_client_decodes_each_reply_into_its_record(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    path = tmp_path / "c.sock"
    server = ControlServer(path, TOKEN, mgr.handle, refuse_marked=False)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            client = await ControlClient.connect(path, TOKEN)
            try:
                status = await client.request(control.STATUS, control.NoArgs())
                raw = await client.call("status")
                rows = await client.request(control.PS, control.NoArgs())
                with pytest.raises(ControlError) as refused:
                    await client.request(control.STOP_SEAT, control.StopSeatArgs(name="nobody"))
                # The server stops before the client hangs up, so no read of its is woken by
                # the hang-up while it is being cancelled.
                tg.cancel_scope.cancel()
            finally:
                await client.aclose()
    assert isinstance(status, control.StatusReply)
    assert (status.pid, status.space, status.state) == (os.getpid(), SPACE, "active")
    assert status.seats == 0
    assert (status.instance_id, status.in_flight, status.attempt_id) == (
        mgr.identity.instance_id,
        0,
        None,
    )
    # The raw call still hands the CLI the same object, under the same keys.
    assert raw == msgspec.json.decode(encode_json(status))
    assert sorted(raw) == [
        "activated",
        "adopting",
        "attemptId",
        "commitStarted",
        "deadLetters",
        "inFlight",
        "instanceId",
        "partialCut",
        "pid",
        "root",
        "seatStates",
        "seats",
        "server",
        "space",
        "startedAt",
        "state",
    ]
    assert rows == []
    assert refused.value.code == "no-such-seat"
    assert refused.value.message == "no seat named 'nobody'; see `cotal ps`"
