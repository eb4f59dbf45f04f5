"""The channel calls and rules as records (protocol/meshcall.py, protocol/names.py): the strict
`post` and `history` calls, the derived ids, the frame a subscriber is handed, the checked
`--subscribe` / `--allow-post` lists, and the records that carry them."""

from __future__ import annotations

import msgspec
import pytest

from connectors.scribe import harness
from manager import registry
from protocol import meshcall, names
from protocol.errors import Refusal
from protocol.inventory import Launch
from protocol.lifecycle import SeatRecord


def test_post_and_history_calls_are_strict() -> None:
    call = meshcall.decode_call(b'{"op": "post", "channel": "plan", "text": "hi"}')
    assert call == meshcall.PostCall(channel="plan", text="hi")
    assert meshcall.decode_call(b'{"op": "history", "channel": "plan"}') == (
        meshcall.HistoryCall(channel="plan", limit=20)
    )
    for bad in (
        b'{"op": "post", "channel": "plan", "text": "hi", "sender": "b"}',
        b'{"op": "post", "channel": "#plan", "text": "hi"}',
        b'{"op": "post", "channel": "a.b", "text": "hi"}',
        b'{"op": "history", "channel": "plan", "limit": 0}',
        b'{"op": "history", "channel": "plan", "limit": 1001}',
    ):
        with pytest.raises(Refusal) as err:
            meshcall.decode_call(bad)
        assert err.value.code == "mesh-call-invalid"


def test_ids_are_derived_and_apart() -> None:
    uid, inbound = "0" * 26, "a" * 32
    assert meshcall.post_message_id(uid, inbound, 0) == meshcall.post_message_id(uid, inbound, 0)
    assert meshcall.post_message_id(uid, inbound, 0) != meshcall.post_message_id(uid, inbound, 1)
    assert meshcall.post_message_id(uid, inbound, 0) != meshcall.send_message_id(uid, inbound, 0)
    post = meshcall.post_message_id(uid, inbound, 0)
    # Two subscribers' turns for one post are two ids, so neither's reply is a duplicate.
    assert meshcall.post_turn_id("1" * 26, post) != meshcall.post_turn_id("2" * 26, post)
    assert names.MESSAGE_ID.matches(meshcall.post_turn_id("1" * 26, post))


def test_the_frame_names_channel_and_sender() -> None:
    text = meshcall.framed_post("plan", "a", "remember the phrase x-1")
    assert text == "[cotal: post on #plan by seat a]\n\nremember the phrase x-1"
    assert (meshcall.frame_sender(text), meshcall.frame_channel(text)) == ("a", "plan")
    dm = meshcall.framed("a", "hi")
    assert (meshcall.frame_sender(dm), meshcall.frame_channel(dm)) == ("a", None)
    assert harness.answer(text, []) == "Noted: x-1 (from a on #plan)."


def test_scribe_relays_tells_and_posts_in_line_order() -> None:
    text = "Post to #plan: one\nTell b: two\nPost to #a.b: no\nPost to #review: three"
    assert harness.relays_in(text) == [
        ("post", "plan", "one"),
        ("send", "b", "two"),
        ("post", "review", "three"),
    ]
    assert harness.post_line("plan", {"status": "posted"}) == "Posted to #plan: delivered."
    refusal = {"status": "refused", "code": "post-not-allowed", "message": "no"}
    assert harness.post_line("plan", refusal) == (
        "Could not post to #plan: refused post-not-allowed: no"
    )


def test_channel_lists_are_checked() -> None:
    assert meshcall.check_channels(["#plan", "plan", "review"], "--subscribe") == [
        "plan",
        "review",
    ]
    for bad in (["a.b"], [""], ["#"], [f"c{n}" for n in range(65)]):
        with pytest.raises(Refusal) as err:
            meshcall.check_channels(bad, "--subscribe")
        assert err.value.code == "bad-name"
    cfg = registry.FileConfig(seats={"a": registry.SeatConfig(subscribe=["plan"])})
    assert registry.seat_channels(cfg, "a", [], ["x"]) == (["plan"], ["x"])
    assert registry.seat_channels(cfg, "a", ["other"], []) == (["other"], [])


def test_records_carry_the_lists_and_older_ones_name_none() -> None:
    launch = Launch(
        connector="scribe",
        cwd="/w",
        unresolved_launch_option_keys=[],
        profile_sha256="0" * 64,
        session_stores=[],
        subscribe=["plan"],
        allow_post=["review"],
    )
    data = msgspec.json.encode(launch)
    assert b'"subscribe":["plan"]' in data and b'"allowPost":["review"]' in data
    plain = msgspec.json.encode(msgspec.structs.replace(launch, subscribe=[], allow_post=[]))
    assert b"subscribe" not in plain and b"allowPost" not in plain
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(data.replace(b'["plan"]', b'["a.b"]'), type=Launch)
    assert {"subscribe", "allow_post"} <= set(SeatRecord.__struct_fields__)
