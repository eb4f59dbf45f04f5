"""Properties of everything that reads bytes a remote host or another process wrote.

Every decoder in `protocol/` is fed random bytes, byte-level mutations of a valid record and
JSON-level mutations of one (a field removed, replaced by any JSON value, an unknown field
added): the only exception it may raise is the named refusal (`DecodeError`/`Refusal`). The two
pure text parsers the record decoders use internally (`parse_refs_list`, `parse_porcelain_z`)
and `parse_instant` promise `ValueError`, which the record decoders turn into a refusal.

The restore's path and archive checks are fed random relpaths and random tar members
(symlinks, hard links, `..`, absolute names, devices, fifos, long names): they refuse by name
or place the file inside the staging directory, and never create anything beside it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from manager.checkpoint.confine import SeatPaths, confine_cwd, place_session_file, session_target
from manager.checkpoint.restore import _extract_untracked
from protocol import checkpoint, control, custody, inventory, maintenance, mesh, messages, session
from protocol.errors import DecodeError, Refusal
from protocol.instant import parse_instant
from tests.unit.test_checkpoint_record import seat, wire
from tests.unit.test_inventory import ATTEMPT, inventory_doc

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

SHA = hashlib.sha256(b"x").hexdigest()
UID = "0123456789abcdefghijklmnop"
WHEN = "2026-11-29T14:00:00.123Z"

# -- seeds: one valid document per decoder --------------------------------------------------------


def _manifest() -> dict[str, Any]:
    ref = {"file": "checkpoint.json", "bytes": 10, "sha256": SHA}
    return {
        "format": checkpoint.MANIFEST_FORMAT,
        "attemptId": "att-1",
        "space": "main",
        "createdAt": WHEN,
        "seats": [{"name": "default", "dir": "default", "checkpoint": ref}],
        "resume": {"file": "resume.json", "bytes": 10, "sha256": SHA},
        "signer": {"publicKey": base64.b64encode(bytes(32)).decode(), "instanceId": "k" * 26},
        "signature": base64.b64encode(bytes(64)).decode(),
    }


def _journal() -> dict[str, Any]:
    return {
        "version": 1,
        "revision": 1,
        "attemptId": "att-1",
        "kind": "cut",
        "state": "cut-intent",
        "updatedAt": WHEN,
        "resume": {
            "version": "cotal-manager-resume/v2",
            "file": "resume.json",
            "bytes": 10,
            "sha256": SHA,
        },
        "consents": [],
    }


SEEDS: dict[str, dict[str, Any]] = {
    "seat-checkpoint": wire(seat()),
    "manifest": _manifest(),
    "inventory": inventory_doc(),
    "journal": _journal(),
    "hello": {"op": "hello", "token": "c3" * 32},
    "request": {"id": 1, "op": "spawn", "args": {"name": "alice", "agent": "scribe"}},
    "reply": {"id": 1, "ok": False, "error": {"code": "x", "message": "y"}},
    "custody": {
        "seat": "alice",
        "lifecycleUid": UID,
        "generation": 0,
        "holder": "k" * 26,
        "claimedAt": WHEN,
    },
    "mesh": {"version": 1, "space": "main", "server": "nats://127.0.0.1:4222", "creds": None},
    "dm": {
        "id": "9" * 32,
        "sender": "local.operator",
        "recipient": "local.alice",
        "text": "hi",
        "sentAt": WHEN,
    },
    "pointer": {"version": 1, "sessionId": "s-1", "status": "running"},
}


def _request_args(data: bytes) -> Any:
    return control.decode_args(control.decode_request(data))


DECODERS: dict[str, tuple[Callable[[bytes], Any], str]] = {
    "decode_seat_checkpoint": (checkpoint.decode_seat_checkpoint, "seat-checkpoint"),
    "decode_manifest": (checkpoint.decode_manifest, "manifest"),
    "decode_inventory": (lambda b: inventory.decode_inventory(b, attempt_id=ATTEMPT), "inventory"),
    "parse_resume_args": (
        lambda b: inventory.parse_resume_args(ATTEMPT, b, space="main"),
        "inventory",
    ),
    "inventory_version": (inventory.inventory_version, "inventory"),
    "decode_journal": (maintenance.decode_journal, "journal"),
    "decode_hello": (control.decode_hello, "hello"),
    "decode_request": (control.decode_request, "request"),
    "decode_args": (_request_args, "request"),
    "decode_reply": (control.decode_reply, "reply"),
    "decode_custody": (custody.decode_custody, "custody"),
    "decode_mesh": (mesh.decode_mesh, "mesh"),
    "decode_dm": (messages.decode_dm, "dm"),
    "decode_pointer": (session.decode_pointer, "pointer"),
}


def test_every_seed_is_a_valid_document() -> None:
    """The mutations start from records the decoders accept, so they probe the edges."""
    for name, (decode, seed) in DECODERS.items():
        assert decode(msgspec.json.encode(SEEDS[seed])) is not None, name


# -- mutations --------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def mutate(data: st.DataObject, doc: Any) -> Any:
    """One JSON-level change somewhere in `doc`: a field dropped, replaced, added, or deeper."""
    if isinstance(doc, dict) and doc:
        key = data.draw(st.sampled_from(sorted(doc)))
        action = data.draw(st.sampled_from(["drop", "replace", "add", "deeper"]))
        out = dict(doc)
        if action == "drop":
            del out[key]
        elif action == "replace":
            out[key] = data.draw(json_values)
        elif action == "add":
            out[data.draw(st.text(min_size=1, max_size=12))] = data.draw(json_values)
        else:
            out[key] = mutate(data, doc[key])
        return out
    if isinstance(doc, list) and doc:
        i = data.draw(st.integers(0, len(doc) - 1))
        out_list = list(doc)
        action = data.draw(st.sampled_from(["drop", "dup", "deeper"]))
        if action == "drop":
            del out_list[i]
        elif action == "dup":
            out_list.append(doc[i])
        else:
            out_list[i] = mutate(data, doc[i])
        return out_list
    if isinstance(doc, str) and doc and data.draw(st.booleans()):
        # Token edges: a trailing newline, a NUL, a path climb, a doubled character.
        edit = data.draw(st.sampled_from(["\n", "\x00", "/..", "//", "é", doc[-1]]))
        return doc + edit
    return data.draw(json_values)


def flip_bytes(data: st.DataObject, raw: bytes) -> bytes:
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        cut = data.draw(st.integers(0, len(buf)))
        del buf[cut:]
    return bytes(buf)


def only_refusals(decode: Callable[[bytes], Any], raw: bytes) -> None:
    try:
        decode(raw)
    except (DecodeError, Refusal):
        pass


@pytest.mark.parametrize("name", sorted(DECODERS))
@settings(SETTINGS, max_examples=100)
@given(data=st.data())
def test_decoders_refuse_by_name_whatever_they_are_fed(name: str, data: st.DataObject) -> None:
    decode, seed = DECODERS[name]
    doc = SEEDS[seed]
    how = data.draw(st.sampled_from(["random", "bytes", "json", "json-twice"]))
    if how == "random":
        raw = data.draw(st.binary(max_size=2048))
    elif how == "bytes":
        raw = flip_bytes(data, msgspec.json.encode(doc))
    else:
        mutated = mutate(data, doc)
        if how == "json-twice":
            mutated = mutate(data, mutated)
        raw = msgspec.json.encode(mutated)
    only_refusals(decode, raw)


@SETTINGS
@given(raw=st.binary(max_size=512))
def test_refs_list_parser_only_says_value_error(raw: bytes) -> None:
    try:
        refs = checkpoint.parse_refs_list(raw)
    except ValueError:
        return
    assert checkpoint.format_refs_list(refs) == raw


@SETTINGS
@given(text=st.text(max_size=300))
def test_porcelain_and_instant_parsers_only_say_value_error(text: str) -> None:
    for parse in (checkpoint.parse_porcelain_z, parse_instant):
        try:
            parse(text)
        except ValueError:
            pass


def test_an_oversized_document_is_refused_before_parsing() -> None:
    for decode, _ in DECODERS.values():
        with pytest.raises((DecodeError, Refusal)):
            decode(b"[" * (2 * 1024 * 1024))


# -- restore: session paths ------------------------------------------------------------------------

path_parts = st.sampled_from(
    ["..", ".", "", ".git", ".GIT", ".cotal", "sessions", "scribe", "a\x00b", "a\\b", "x" * 300]
) | st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
relpaths = st.lists(path_parts, min_size=0, max_size=6).map("/".join) | st.text(max_size=80)


def _sentinel(tmp: Path) -> tuple[Path, Path, dict[str, Any]]:
    """A root inside a parent whose every other entry is watched."""
    parent = tmp / "parent"
    root = parent / "root"
    root.mkdir(parents=True)
    (parent / "beside.txt").write_bytes(b"keep\n")
    return parent, root, _listing(parent, root)


def _listing(parent: Path, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(parent):
        here = Path(dirpath)
        if here == root or root in here.parents:
            continue
        for name in dirnames + filenames:
            p = here / name
            if p == root:
                continue
            st_ = os.lstat(p)
            out[str(p.relative_to(parent))] = (st_.st_mode, st_.st_size, st_.st_mtime_ns)
    return out


@SETTINGS
@given(
    anchor=st.sampled_from(["cwd", "workspace-root", "home"]),
    rel=relpaths,
    pointer=st.booleans(),
)
def test_session_paths_refuse_by_name_or_land_inside_the_seats_store(
    tmp_path: Path, anchor: str, rel: str, pointer: bool
) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        parent, root, before = _sentinel(Path(tmp))
        store = root / ".cotal/sessions/scribe" / f"default-{UID}.store"
        paths = SeatPaths(
            "default", root / ".cotal/sessions/scribe" / f"default-{UID}.json", (store,)
        )
        src = Path(tmp) / "store-0000.jsonl"
        src.write_bytes(b"{}\n")
        try:
            entry = checkpoint.SessionFile(
                anchor=anchor,  # type: ignore[arg-type]
                relpath=rel,
                file=checkpoint.FileRef(file="store-0000.jsonl", bytes=3, sha256=SHA),
            )
        except ValueError:
            return  # the record itself refuses it (check_relpath); the decoder says DecodeError
        try:
            target = session_target(
                entry, paths, pointer=pointer, cwd=root, root=root, home=parent / "home"
            )
        except Refusal as exc:
            assert exc.code in ("unsafe-session-path", "session-outside-store"), exc.code
            assert _listing(parent, root) == before
            return
        assert target.path == paths.pointer or target.path.is_relative_to(store)
        assert place_session_file(src, target) == "placed"
        assert _listing(parent, root) == before


@SETTINGS
@given(cwd=st.text(max_size=60) | relpaths.map(lambda r: "/ROOT/" + r))
def test_a_cwd_is_confined_or_refused_by_name(tmp_path: Path, cwd: str) -> None:
    root = tmp_path / "root"
    cwd = cwd.replace("/ROOT", str(root), 1)
    try:
        here = confine_cwd("default", cwd, root=root)
    except Refusal as exc:
        assert exc.code == "cwd-outside-root"
        return
    assert here.is_relative_to(root)
    assert ".git" not in [p.casefold() for p in here.parts] and ".cotal" not in here.parts


# -- restore: the untracked archive ----------------------------------------------------------

member_names = st.one_of(
    relpaths,
    st.sampled_from(["../escape", "/etc/cotal-escape", "a/../../b", ".git/hooks/x", "lnk/x"]),
    st.text(min_size=101, max_size=300, alphabet="ab/"),
)
members = st.tuples(
    member_names,
    st.sampled_from(
        [
            tarfile.REGTYPE,
            tarfile.SYMTYPE,
            tarfile.LNKTYPE,
            tarfile.CHRTYPE,
            tarfile.BLKTYPE,
            tarfile.FIFOTYPE,
            tarfile.DIRTYPE,
        ]
    ),
    st.sampled_from(["../outside", "/etc/passwd", "target", "lnk", "../../x", ""]),
    st.binary(max_size=64),
)


def _tar(items: list[tuple[str, bytes, str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, link, body in items:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = link
            if kind == tarfile.REGTYPE:
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
            else:
                tar.addfile(info)
    return buf.getvalue()


@SETTINGS
@given(items=st.lists(members, max_size=5))
def test_an_untracked_archive_refuses_by_name_and_writes_only_inside_staging(
    tmp_path: Path, items: list[tuple[str, bytes, str, bytes]]
) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        parent, staging, before = _sentinel(Path(tmp))
        archive = Path(tmp) / "untracked.tar"
        try:
            archive.write_bytes(_tar(items))
        except (ValueError, UnicodeEncodeError):
            return  # tarfile itself cannot write such a member
        try:
            _extract_untracked(archive, staging)
        except Refusal as exc:
            assert exc.code == "unsafe-archive", exc.code
        assert _listing(parent, staging) == before
        for dirpath, _dirs, files in os.walk(staging):
            for name in files:
                p = Path(dirpath) / name
                assert p.resolve().is_relative_to(staging.resolve()) or p.is_symlink()
