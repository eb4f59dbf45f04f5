"""The relocation map: the source root onto the destination root, `--map` pairs, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from connectors.base import Relocation, relocate_session
from connectors.claude_code import ClaudeCodeConnector
from connectors.pi import PiConnector, relocated_header
from connectors.scribe.connector import ScribeConnector
from manager.checkpoint.relocate import check_maps, map_store, parse_maps, relocation
from protocol.errors import Refusal

SRC = Path("/hostA/ws")
DST = Path("/hostB/work/ws2")


def test_the_source_root_maps_onto_the_destination_root() -> None:
    r = relocation(SRC, DST, {}, old_cwd=SRC / "sub")
    assert r.new_cwd == DST / "sub" and r.moves
    assert relocation(SRC, DST, {}, old_cwd=SRC).new_cwd == DST
    assert map_store("s", "/hostA/ws/.cotal/sessions/pi/s-u.store", r) == Path(
        "/hostB/work/ws2/.cotal/sessions/pi/s-u.store"
    )
    # Prefixes are whole path components, never string prefixes.
    assert r.map(Path("/hostA/wsx")) is None


def test_the_longest_old_prefix_wins() -> None:
    maps = {Path("/srv"): Path("/data"), Path("/srv/deep/er"): Path("/fast")}
    r = relocation(SRC, DST, maps, old_cwd=Path("/srv/deep/er/x"))
    assert r.new_cwd == Path("/fast/x")
    assert r.map(Path("/srv/deep/other")) == Path("/data/deep/other")
    # An operator's pair for a directory inside the source root beats the root's pair.
    inner = relocation(SRC, DST, {SRC / "big": Path("/disk2/big")}, old_cwd=SRC / "big/a")
    assert inner.new_cwd == Path("/disk2/big/a")
    # And one naming the source root itself overrides the implicit pair.
    assert relocation(SRC, DST, {SRC: Path("/else")}, old_cwd=SRC).new_cwd == Path("/else")


def test_a_cwd_or_store_under_no_prefix_is_refused_by_name() -> None:
    with pytest.raises(Refusal) as err:
        relocation(SRC, DST, {}, old_cwd=Path("/elsewhere/proj"))
    assert err.value.code == "cwd-unmapped"
    assert "/elsewhere/proj" in err.value.message and "--map" in (err.value.cure or "")
    r = relocation(SRC, DST, {}, old_cwd=SRC)
    with pytest.raises(Refusal) as err:
        map_store("s", "/home/op/.pi/sessions", r)
    assert err.value.code == "cwd-unmapped" and "/home/op/.pi/sessions" in err.value.message


@pytest.mark.parametrize(
    "value",
    [
        "relative/old=/new",
        "/old=relative/new",
        "/old\x00=/new",
        "/old=/new/../etc",
        "/old/./x=/new",
        "/old/=/new",
        "//old=/new",
        "/old",
    ],
)
def test_malformed_maps_are_refused(value: str) -> None:
    with pytest.raises(Refusal) as err:
        parse_maps([value])
    assert err.value.code == "bad-map"
    assert err.value.cure


def test_a_map_splits_at_the_first_equals_and_names_an_old_once() -> None:
    assert parse_maps(["/a=/b=c"]) == {Path("/a"): Path("/b=c")}
    assert parse_maps(["/a=/b", "/a=/b"]) == {Path("/a"): Path("/b")}
    with pytest.raises(Refusal) as err:
        parse_maps(["/a=/b", "/a=/c"])
    assert err.value.code == "bad-map" and "twice" in err.value.message


def test_new_is_under_the_root_or_an_existing_directory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    check_maps({Path("/x"): root / "not-yet"}, dest_root=root)
    check_maps({Path("/x"): tmp_path}, dest_root=root)
    with pytest.raises(Refusal) as err:
        check_maps({Path("/x"): tmp_path / "missing"}, dest_root=root)
    assert err.value.code == "bad-map" and "missing" in err.value.message
    (tmp_path / "file").write_text("x")
    with pytest.raises(Refusal):
        check_maps({Path("/x"): tmp_path / "file"}, dest_root=root)
    (tmp_path / "link").symlink_to(tmp_path)
    with pytest.raises(Refusal):
        check_maps({Path("/x"): tmp_path / "link"}, dest_root=root)


# -- per harness --------------------------------------------------------------------------------


def _reloc(cwd: str = "") -> Relocation:
    return relocation(SRC, DST, {}, old_cwd=SRC / cwd if cwd else SRC)


def test_pi_rewrites_the_header_cwd_and_nothing_else() -> None:
    r = _reloc("sub")
    line = json.dumps(
        {
            "type": "session",
            "version": 3,
            "id": "01a2278a-387f-7559-b3e4-684e516dbf2f",
            "timestamp": "t",
            "cwd": "/hostA/ws/sub",
            "parentSession": "/hostA/ws/.cotal/sessions/pi/x.store/a.jsonl",
        },
        separators=(",", ":"),
    ).encode()
    out = json.loads(relocated_header(line, r))
    assert out["cwd"] == "/hostB/work/ws2/sub"
    assert out["parentSession"] == "/hostB/work/ws2/.cotal/sessions/pi/x.store/a.jsonl"
    assert list(out) == list(json.loads(line))  # pi's key order is kept
    message = b'{"type":"message","cwd":"/hostA/ws"}'
    assert relocated_header(message, r) == message
    assert relocated_header(b"not json", r) == b"not json"
    move = relocate_session(PiConnector(), ["a_1.jsonl", "notes.txt"], r, "1")
    assert set(move.files) == {"a_1.jsonl"} and move.continuity is None


def test_claude_moves_the_project_dir_to_the_new_encoding() -> None:
    r = _reloc("sub")
    sid = "0aba288b-a1da-4a2a-8a69-b7710d665ddc"
    files = [
        f"projects/-hostA-ws-sub/{sid}.jsonl",
        "projects/-hostA-ws/memory/MEMORY.md",
        "cotal-launch.json",
    ]
    move = relocate_session(ClaudeCodeConnector(), files, r, sid)
    assert move.continuity is None
    assert move.files[files[0]].relpath == f"projects/-hostB-work-ws2-sub/{sid}.jsonl"
    assert move.files[files[1]].relpath == "projects/-hostB-work-ws2/memory/MEMORY.md"
    assert files[2] not in move.files


def test_claude_says_fresh_when_its_transcript_cannot_follow() -> None:
    sid = "0aba288b-a1da-4a2a-8a69-b7710d665ddc"
    # A name Claude Code shortened with a hash cannot be recomputed: the session is stranded.
    long_dir = "-" + "x" * 210 + "-abc123"
    move = relocate_session(
        ClaudeCodeConnector(), [f"projects/{long_dir}/{sid}.jsonl"], _reloc(), sid
    )
    assert move.continuity == "fresh" and sid in move.why


def test_scribe_and_an_unmoved_seat_change_nothing() -> None:
    assert relocate_session(ScribeConnector(), ["s.jsonl"], _reloc(), "x").files == {}
    same = relocation(SRC, SRC, {}, old_cwd=SRC)
    assert not same.moves
    assert relocate_session(PiConnector(), ["a.jsonl"], same, "x").files == {}
