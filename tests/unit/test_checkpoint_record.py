"""The checkpoint record format: strict decoding, field rules, signing payload, continuity cap."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest

from protocol.checkpoint import (
    CHECKPOINT_CAP,
    MANIFEST_FORMAT,
    SEAT_CHECKPOINT_FORMAT,
    UNTRACKED_SELECTION,
    AttemptManifest,
    FileRef,
    ManifestSeat,
    RepositoryRecord,
    SeatCheckpoint,
    SessionFile,
    SessionRecord,
    Signer,
    checkpoint_files,
    continuity_capped,
    decode_manifest,
    decode_seat_checkpoint,
    format_refs_list,
    parse_porcelain_z,
    parse_refs_list,
    porcelain_by_path,
    signing_payload,
    with_signature,
)
from protocol.codec import decode_json, encode_json
from protocol.errors import DecodeError
from protocol.instant import format_instant, parse_instant

SHA = hashlib.sha256(b"x").hexdigest()
OID = "a" * 40
PUB = base64.b64encode(bytes(32)).decode()
SIG = base64.b64encode(bytes(64)).decode()


def ref(name: str) -> FileRef:
    return FileRef(file=name, bytes=10, sha256=SHA)


def repository(**changes: Any) -> RepositoryRecord:
    fields: dict[str, Any] = dict(
        base=OID,
        head="refs/heads/main",
        untracked_selection=UNTRACKED_SELECTION,
        status="MM README.md\x00 A ita.txt\x00?? new.txt\x00",
        bundle=ref("repo.bundle"),
        index_diff=ref("index.diff"),
        worktree_diff=ref("worktree.diff"),
        untracked=ref("untracked.tar"),
        intent_to_add=["ita.txt"],
        refs=ref("refs.txt"),
    )
    fields.update(changes)
    return RepositoryRecord(**fields)


def seat(**changes: Any) -> SeatCheckpoint:
    fields: dict[str, Any] = dict(
        format=SEAT_CHECKPOINT_FORMAT,
        entry={"name": "default", "launch": {"connector": "scribe", "capabilities": ["x"]}},
        space="main",
        name="default",
        lifecycle_uid="0123456789abcdefghijklmnop",
        generation=0,
        captured_at="2026-11-29T14:00:00.123Z",
        profile=SHA,
        repository=repository(),
        session=SessionRecord(
            continuity="exact",
            session_id="sess-1",
            pointer=SessionFile(
                anchor="workspace-root",
                relpath=".cotal/sessions/p.json",
                file=ref("session-pointer.json"),
            ),
            store=[
                SessionFile(
                    anchor="home", relpath=".scribe/store/log.jsonl", file=ref("session-store.0")
                )
            ],
        ),
        signer=Signer(public_key=PUB, instance_id="m" * 26),
        signature=SIG,
    )
    fields.update(changes)
    return SeatCheckpoint(**fields)


def wire(record: object) -> dict[str, Any]:
    return msgspec.json.decode(encode_json(record))  # type: ignore[no-any-return]


def refused(data: dict[str, Any], *needles: str) -> str:
    with pytest.raises(DecodeError) as err:
        decode_seat_checkpoint(msgspec.json.encode(data))
    assert err.value.code == "malformed"
    for needle in needles:
        assert needle in err.value.message, err.value.message
    return err.value.message


def test_round_trip_is_exact_and_camel_case() -> None:
    record = seat()
    data = wire(record)
    assert set(data) >= {"lifecycleUid", "capturedAt", "recencyHorizonMs", "repository", "signer"}
    assert set(data["repository"]) >= {
        "untrackedSelection",
        "indexDiff",
        "worktreeDiff",
        "intentToAdd",
        "head",
        "refs",
    }
    assert data["signer"] == {"publicKey": PUB, "instanceId": "m" * 26}
    assert data["recencyHorizonMs"] == 86_400_000
    assert decode_seat_checkpoint(encode_json(record)) == record


@pytest.mark.parametrize(
    ("path", "value", "needles"),
    [
        (("extra",), 1, ("unknown field `extra`",)),
        (("repository", "bundle", "file"), "../repo.bundle", ("$.repository.bundle.file",)),
        (("repository", "bundle", "file"), "checkpoint.json", ("reserved",)),
        (("repository", "bundle", "sha256"), "ABC", ("$.repository.bundle.sha256",)),
        (("repository", "bundle", "bytes"), -1, ("$.repository.bundle.bytes",)),
        (("repository", "base"), "abc", ("$.repository.base",)),
        (("repository", "head"), "main", ("$.repository.head",)),
        (
            ("repository", "untrackedSelection"),
            "git ls-files --others",
            ("untrackedSelection", "reproduces"),
        ),
        (("repository", "intentToAdd"), ["new.txt"], ("intentToAdd entry 'new.txt'",)),
        (("repository", "intentToAdd"), ["../x"], ("intentToAdd entry",)),
        (("repository", "status"), "MM README.md", ("status",)),
        (("lifecycleUid",), "UPPER", ("$.lifecycleUid",)),
        (("space",), "bad space", ("$.space",)),
        (("generation",), -1, ("$.generation",)),
        (("recencyHorizonMs",), 0, ("$.recencyHorizonMs",)),
        (("capturedAt",), "2026-11-29T14:00:00Z", ("$.capturedAt",)),
        (("capturedAt",), "2026-13-29T14:00:00.000Z", ("capturedAt",)),
        (("profile",), "not-a-digest", ("$.profile",)),
        (("format",), "cotal-seat-checkpoint/v2", ("$.format",)),
        (("session", "continuity"), "continued", ("$.session.continuity",)),
        (("session", "store"), [], ("continuity 'exact' requires",)),
        (("session", "pointer", "relpath"), "/etc/passwd", ("relpath", "absolute")),
        (("session", "store", 0, "relpath"), "a/../../b", ("relpath",)),
        (("session", "store", 0, "anchor"), "root", ("$.session.store[0].anchor",)),
        (("signer", "publicKey"), "AAAA", ("publicKey",)),
        (("signature",), "not base64!", ("signature",)),
        (("entry",), [], ("$.entry",)),
    ],
)
def test_each_rule_refuses_by_field(
    path: tuple[Any, ...], value: object, needles: tuple[str, ...]
) -> None:
    data = wire(seat())
    node: Any = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    refused(data, *needles)


def test_file_names_must_be_distinct() -> None:
    data = wire(seat())
    data["repository"]["indexDiff"]["file"] = "repo.bundle"
    refused(data, "repo.bundle appear twice")


def test_the_cap_is_checked_before_parsing() -> None:
    data = encode_json(seat()) + b" " * CHECKPOINT_CAP
    with pytest.raises(DecodeError) as err:
        decode_seat_checkpoint(data)
    assert "cap" in err.value.message


def test_signing_payload_is_normalized_and_ignores_the_signature() -> None:
    record = seat()
    payload = signing_payload(record)
    assert payload == signing_payload(msgspec.structs.replace(record, signature=""))
    assert b'"signature":""' in payload and b"\n" not in payload
    # A differently laid-out file decodes to the same record and hence the same payload.
    pretty = msgspec.json.format(encode_json(record), indent=2)
    assert signing_payload(decode_seat_checkpoint(pretty)) == payload
    assert signing_payload(seat(generation=1)) != payload
    resigned = with_signature(record, Signer(public_key=PUB, instance_id="n" * 26), b"\x01" * 64)
    assert resigned.signature == base64.b64encode(b"\x01" * 64).decode()
    assert resigned.signer is not None and resigned.signer.instance_id == "n" * 26


def test_checkpoint_files_lists_every_named_file_once() -> None:
    names = [r.file for r in checkpoint_files(seat())]
    assert names == [
        "repo.bundle",
        "index.diff",
        "worktree.diff",
        "untracked.tar",
        "refs.txt",
        "session-pointer.json",
        "session-store.0",
    ]
    bare = seat(repository=repository(refs=None), session=SessionRecord(continuity="fresh"))
    assert [r.file for r in checkpoint_files(bare)] == [
        "repo.bundle",
        "index.diff",
        "worktree.diff",
        "untracked.tar",
    ]


def test_manifest_rules() -> None:
    manifest = AttemptManifest(
        format=MANIFEST_FORMAT,
        attempt_id="20261129T140000Z-ab12cd34",
        space="main",
        created_at="2026-11-29T14:00:01.000Z",
        seats=[ManifestSeat(name="default", dir="default", checkpoint=ref("checkpoint.json"))],
        resume=ref("resume.json"),
        signer=Signer(public_key=PUB, instance_id="m" * 26),
        signature=SIG,
    )
    assert decode_manifest(encode_json(manifest)) == manifest
    data = wire(manifest)
    assert set(data) >= {"attemptId", "createdAt", "seats", "resume"}

    def refuse(mutate: Any, needle: str) -> None:
        bad = wire(manifest)
        mutate(bad)
        with pytest.raises(DecodeError) as err:
            decode_manifest(msgspec.json.encode(bad))
        assert needle in err.value.message, err.value.message

    refuse(lambda d: d["seats"].append(d["seats"][0]), "each seat once")
    refuse(lambda d: d["seats"][0].update(dir="other"), "directory of its own name")
    refuse(lambda d: d["seats"][0]["checkpoint"].update(file="record.json"), "checkpoint must be")
    refuse(lambda d: d["resume"].update(file="manifest.json"), "collides")
    refuse(lambda d: d.update(attemptId="../x"), "$.attemptId")
    refuse(lambda d: d.update(format=SEAT_CHECKPOINT_FORMAT), "$.format")


@pytest.mark.parametrize(
    ("declared", "pointer", "stores", "fresh", "expected"),
    [
        ("exact", True, 1, True, "exact"),
        ("exact", True, 0, True, "fresh"),
        ("exact", False, 2, False, "drain-only"),
        ("fork", True, 3, False, "fork"),
        ("fork", False, 0, True, "fresh"),
        ("fresh", False, 0, True, "fresh"),
        ("drain-only", True, 1, False, "drain-only"),
    ],
)
def test_continuity_is_capped_by_the_bytes_carried(
    declared: Any, pointer: bool, stores: int, fresh: bool, expected: str
) -> None:
    assert continuity_capped(declared, pointer, stores, fresh) == expected


def test_instants_are_utc_with_milliseconds() -> None:
    when = datetime(2026, 11, 29, 15, 0, 0, 123456, tzinfo=timezone(timedelta(hours=1)))
    assert format_instant(when) == "2026-11-29T14:00:00.123Z"
    assert parse_instant("2026-11-29T14:00:00.123Z") == datetime(
        2026, 11, 29, 14, 0, 0, 123000, tzinfo=UTC
    )
    with pytest.raises(ValueError):
        format_instant(datetime(2026, 1, 1))
    with pytest.raises(ValueError):
        parse_instant("2026-11-29 14:00:00.123Z")


def test_porcelain_and_refs_lists() -> None:
    status = "R  new name.txt\x00old name.txt\x00 D gone\x00?? a b\x00"
    assert parse_porcelain_z(status) == [("R ", "new name.txt"), (" D", "gone"), ("??", "a b")]
    assert porcelain_by_path(status) == {"new name.txt": "R ", "gone": " D", "a b": "??"}
    assert parse_porcelain_z("") == []
    for bad in ("MM README.md", "R  new\x00", "X\x00"):
        with pytest.raises(ValueError):
            parse_porcelain_z(bad)

    refs = {"refs/stash": "b" * 40, "refs/heads/main": "a" * 40}
    text = format_refs_list(refs)
    assert text == f"{'a' * 40} refs/heads/main\n{'b' * 40} refs/stash\n".encode()
    assert parse_refs_list(text) == refs
    for bad in (b"x refs/heads/main\n", b"a" * 40 + b" refs/heads/main", b"a" * 40 + b" HEAD\n"):
        with pytest.raises(ValueError):
            parse_refs_list(bad)


_SHA = "0" * 64
_MINIMAL = {
    "base": "1" * 40,
    "untrackedSelection": "git ls-files --others --exclude-standard -z, excluding .cotal/",
    "bundle": {"file": "repo.bundle", "bytes": 1, "sha256": _SHA},
    "indexDiff": {"file": "index.diff", "bytes": 0, "sha256": _SHA},
    "worktreeDiff": {"file": "worktree.diff", "bytes": 0, "sha256": _SHA},
    "untracked": {"file": "untracked.tar", "bytes": 0, "sha256": _SHA},
}


def _repository(**extra: object) -> RepositoryRecord:
    doc = {**_MINIMAL, **extra}
    return decode_json(encode_json(doc), RepositoryRecord, what="record", cap=1 << 20)


def _refused(said: str, **extra: object) -> None:
    with pytest.raises(DecodeError) as exc:
        _repository(**extra)
    assert exc.value.code == "malformed" and said in exc.value.message, exc.value.message


def test_an_unborn_branchs_record_is_strict() -> None:
    """No base: an unborn branch, which head names; no bundle only without refs; never
    incremental or shallow."""
    head = "refs/heads/main"
    record = _repository(base=None, head=head, bundle=None)
    assert (record.base, record.head, record.bundle) == (None, head, None)
    refs = {"file": "refs.txt", "bytes": 10, "sha256": _SHA}
    assert _repository(base=None, head=head, refs=refs).refs is not None
    _refused("which head names", base=None, bundle=None)
    _refused("carries its refs in a bundle", base=None, head=head, bundle=None, refs=refs)
    shallow = {"file": "git-shallow", "bytes": 41, "sha256": _SHA}
    _refused("builds on nothing and is not shallow", base=None, head=head, shallow=shallow)
    _refused("bundle may be absent only", bundle=None)


def test_the_unwatched_field_is_strict() -> None:
    listed = {"file": "assume-unchanged.z", "bytes": 4, "sha256": _SHA}
    files = {"file": "unwatched.tar", "bytes": 10240, "sha256": _SHA}
    record = _repository(
        unwatched={"assumeUnchanged": listed, "entries": 1, "files": files, "present": 1}
    )
    assert record.unwatched is not msgspec.UNSET
    assert [ref.file for ref in record.files()][-2:] == ["assume-unchanged.z", "unwatched.tar"]
    assert _repository().unwatched is msgspec.UNSET
    for bad, said in (
        ({}, "never neither"),
        ({"assumeUnchanged": listed, "entries": 0}, "counts the assumeUnchanged list"),
        ({"files": files, "present": 0}, "counts the files archive's members"),
        ({"files": {**files, "file": "untracked.tar"}, "present": 1}, "stores 'unwatched.tar'"),
        ({"assumeUnchanged": {**listed, "bytes": 0}, "entries": 1}, "the list is 1 to"),
        ({"files": files, "present": 1, "more": 1}, "unknown field"),
        ({"files": files, "present": -1}, "Expected `int` >= 0"),
    ):
        _refused(said, unwatched=bad)


def test_a_hook_is_stored_with_its_repositorys_prefix() -> None:
    hook = {"name": "pre-commit", "mode": 0o755}
    ok = {**hook, "file": {"file": "hook-pre-commit", "bytes": 1, "sha256": _SHA}}
    assert _repository(hooks=[ok]).hooks[0].file.file == "hook-pre-commit"
    prefixed = {**hook, "file": {"file": "sm1-hook-pre-commit", "bytes": 1, "sha256": _SHA}}
    _refused("must be stored as 'hook-pre-commit'", hooks=[prefixed])
    odd = {**hook, "file": {"file": "xx-hook-pre-commit", "bytes": 1, "sha256": _SHA}}
    _refused("after its repository's prefix", hooks=[odd])


def test_the_shallow_field_is_strict() -> None:
    assert _repository().shallow is msgspec.UNSET
    ok = {"file": "git-shallow", "bytes": 41, "sha256": _SHA}
    assert encode_json(_repository(shallow=ok).shallow) == encode_json(ok)
    for bad, said in (
        (None, "Expected `object`, got `null`"),
        ({**ok, "file": "shallow"}, "must be stored as 'git-shallow'"),
        ({**ok, "bytes": 0}, "a shallow list is 1 to"),
        ({**ok, "bytes": 10**8}, "a shallow list is 1 to"),
        ({**ok, "extra": 1}, "unknown field"),
    ):
        _refused(said, shallow=bad)
    link = {
        "attemptId": "a" * 26,
        "checkpointSha256": _SHA,
        "bundleSha256": None,
        "prerequisites": [],
    }
    _refused("a shallow record carries a full bundle", shallow=ok, since=link)
