"""Admission: integrity, identity and recency gate a resume, in order, all-or-nothing, and a
refused resume changes nothing, neither in the destination root nor in custody at the broker.

Every checkpoint here is cut by a real manager (scribe seats, a real git root, a real
nats-server); the seats' paths are absolute, so the destination takes the source root's very
path after the source tree is moved away, as a second host would.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from manager import registry
from manager.checkpoint import admit
from manager.checkpoint.clock import ClockReading
from manager.checkpoint.reader import read_manifest, read_seat_checkpoint, verify_integrity
from manager.checkpoint.seal import sign_record
from protocol.checkpoint import (
    CHECKPOINT_FILE,
    DEFAULT_RECENCY_HORIZON_MS,
    MANIFEST_FILE,
    RESUME_FILE,
    SeatCheckpoint,
    decode_seat_checkpoint,
    signing_payload,
    with_signature,
)
from protocol.errors import DecodeError, Refusal
from protocol.instant import format_instant, parse_instant
from protocol.maintenance import Consent
from tests.ckpt import (
    Cut,
    broker_args,
    custody,
    foreign_identity,
    make_cut,
    make_destination,
    manager_answers,
    move_source_away,
    record_bytes,
    replace_agent,
    reseal,
    reseal_manifest,
    snapshot,
    source_identity,
    wait_presence,
)
from tests.conftest import Cli, SharedBroker
from tests.gitrepo import tree_digest, write

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SEAT = "scribe1"
HORIZON = DEFAULT_RECENCY_HORIZON_MS
SYNCED = ClockReading(True, "kernel", "adjtimex state 0, status 0x2001, maximum error 0.0015 s")


@pytest.fixture
def cut(cli: Cli, shared_broker: SharedBroker, tmp_path: Path) -> Cut:
    return make_cut(cli, shared_broker, tmp_path / "ckpt")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def days_ago(days: float) -> str:
    return format_instant(datetime.now(UTC) - timedelta(days=days))


def captured_at(when: str) -> Callable[[SeatCheckpoint], SeatCheckpoint]:
    return lambda record: msgspec.structs.replace(record, captured_at=when)


async def assert_unclaimed(cut: Cut, seats: tuple[str, ...] = (SEAT,)) -> None:
    """Custody at the broker is still the source's generation 0 and nobody claimed the attempt."""
    for seat in seats:
        record, attempt = await custody(cut.broker, seat, cut.uid(seat), cut.attempt_id)
        assert record is not None and record["generation"] == 0, record
        assert record["holder"] == cut.instance_id and "attemptId" not in record, record
        assert attempt is None, attempt


def refusal_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """A `--json` refusal: one JSON document, the last line on stderr; stdout stays empty."""
    assert proc.stdout == "", proc.stdout
    doc: dict[str, Any] = json.loads(proc.stderr.splitlines()[-1])
    return doc


async def refused(
    cli: Cli,
    cut: Cut,
    ckpt: Path,
    *extra: str,
    code: str,
    contains: list[str],
    seats: tuple[str, ...] = (SEAT,),
    claimed_by_nobody: bool = True,
    trust: bool = True,
) -> str:
    """`cotal up --restore` exits 2 with the refusal named, and nothing moved anywhere."""
    before = snapshot(cli.root)
    pins = cut.trust if trust else ()
    proc = cli.run(
        "up", "--restore", str(ckpt), "--json", *broker_args(cut.broker), *pins, *extra, check=False
    )
    assert proc.returncode == 2, f"{proc.stdout}\n{proc.stderr}"
    out = refusal_of(proc)
    assert out["ok"] is False and out["code"] == code, out
    for text in contains:
        assert text in out["error"], f"{text!r} not in {out['error']!r}"
    assert "admitted:" not in proc.stderr and "claiming custody" not in proc.stderr
    assert snapshot(cli.root) == before
    assert not manager_answers(cli.root)
    if claimed_by_nobody:
        await assert_unclaimed(cut, seats)
    return str(out["error"])


# -- gate 1: integrity -------------------------------------------------------------------------

Mutation = Callable[[Path], tuple[str, list[str]]]


def _seat(ckpt: Path) -> Path:
    return ckpt / SEAT


def flip_store_byte(ckpt: Path) -> tuple[str, list[str]]:
    ref = read_seat_checkpoint(_seat(ckpt)).session.store[0].file
    path = _seat(ckpt) / ref.file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return "integrity", [
        f"checkpoint integrity: {path} hashes to {sha(bytes(data))}, the record says {ref.sha256}"
    ]


def flip_resume_byte(ckpt: Path) -> tuple[str, list[str]]:
    ref = read_manifest(ckpt).resume
    path = ckpt / RESUME_FILE
    data = bytearray(path.read_bytes())
    data[10] ^= 0x20
    path.write_bytes(bytes(data))
    return "integrity", [f"{path} hashes to {sha(bytes(data))}, the record says {ref.sha256}"]


def truncate_bundle(ckpt: Path) -> tuple[str, list[str]]:
    ref = read_seat_checkpoint(_seat(ckpt)).repository.bundle
    path = _seat(ckpt) / ref.file
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return "integrity", [f"{path} is {len(data) // 2} bytes, the record says {ref.bytes}"]


def symlink_untracked(ckpt: Path) -> tuple[str, list[str]]:
    # The link points at the very bytes the record names: only the link itself is wrong.
    ref = read_seat_checkpoint(_seat(ckpt)).repository.untracked
    path = _seat(ckpt) / ref.file
    real = ckpt.parent / "untracked-elsewhere.tar"
    shutil.copyfile(path, real)
    path.unlink()
    os.symlink(real, path)
    return "integrity", [f"{path} is a symlink; the record names a regular file"]


def remove_refs(ckpt: Path) -> tuple[str, list[str]]:
    ref = read_seat_checkpoint(_seat(ckpt)).repository.refs
    assert ref is not None
    path = _seat(ckpt) / ref.file
    path.unlink()
    return "integrity", [f"{path} is missing from {_seat(ckpt)}"]


def extra_in_seat(ckpt: Path) -> tuple[str, list[str]]:
    write(_seat(ckpt) / "notes.txt", "slipped in after sealing\n")
    return "integrity", [f"{_seat(ckpt)} holds entries its record does not name: notes.txt"]


def extra_in_attempt(ckpt: Path) -> tuple[str, list[str]]:
    write(ckpt / ".resume.json.1234.tmp", "an interrupted write\n")
    return "integrity", [f"{ckpt} holds entries its record does not name: .resume.json.1234.tmp"]


def _rewrite_seat_record(
    ckpt: Path, forge: Callable[[SeatCheckpoint], SeatCheckpoint]
) -> tuple[str, list[str]]:
    path = _seat(ckpt) / CHECKPOINT_FILE
    sealed = [s for s in read_manifest(ckpt).seats if s.name == SEAT][0].checkpoint
    forged = forge(read_seat_checkpoint(_seat(ckpt)))
    data = record_bytes(forged)
    path.write_bytes(data)
    return "integrity", [
        f"{path} is {len(data)} bytes hashing to {sha(data)}, the manifest says "
        f"{sealed.bytes} bytes hashing to {sealed.sha256}"
    ]


def forge_seat_signature_keep_key(ckpt: Path) -> tuple[str, list[str]]:
    """Re-sign the seat record's payload with another key, keeping the recorded public key."""
    other = Ed25519PrivateKey.generate()

    def forge(record: SeatCheckpoint) -> SeatCheckpoint:
        assert record.signer is not None
        forged = with_signature(record, record.signer, other.sign(signing_payload(record)))
        assert forged.signature != record.signature
        return forged

    result = _rewrite_seat_record(ckpt, forge)
    # The signature alone would refuse it too; the manifest digest refuses it first.
    with pytest.raises(Refusal) as err:
        read_seat_checkpoint(_seat(ckpt))
    assert (
        err.value.code == "bad-signature"
        and "does not verify under its recorded public key" in err.value.message
    )
    return result


def forge_seat_key_and_signature(ckpt: Path) -> tuple[str, list[str]]:
    """Replace key and signature consistently: the record verifies on its own, and only the
    manifest's digest of checkpoint.json (and the one-signer-per-attempt rule) stand in the way."""
    ident = foreign_identity()
    result = _rewrite_seat_record(
        ckpt, lambda r: sign_record(r, ident.sign, ident.public_key_b64, ident.instance_id)
    )
    signer = read_seat_checkpoint(_seat(ckpt)).signer
    assert signer is not None and signer.public_key == ident.public_key_b64
    return result


def forge_manifest_signature(ckpt: Path) -> tuple[str, list[str]]:
    manifest = read_manifest(ckpt)
    assert manifest.signer is not None
    forged = with_signature(
        manifest, manifest.signer, Ed25519PrivateKey.generate().sign(signing_payload(manifest))
    )
    (ckpt / MANIFEST_FILE).write_bytes(record_bytes(forged))
    return "bad-signature", [
        f"checkpoint manifest {ckpt / MANIFEST_FILE} signature does not verify under its "
        f"recorded public key {manifest.signer.public_key}"
    ]


def reseal_manifest_by_another_key(ckpt: Path) -> tuple[str, list[str]]:
    """A manifest re-signed, consistently, by another manager over untouched seat records."""
    signer = read_seat_checkpoint(_seat(ckpt)).signer
    assert signer is not None
    seat_key = signer.public_key
    ident = foreign_identity()
    reseal_manifest(ckpt, ident)
    # Consistent in itself, but sealed by a key the destination never trusted: refused before
    # the one-signer-per-attempt rule is even reached (the reader alone still catches that).
    with pytest.raises(Refusal) as err:
        verify_integrity(ckpt)
    assert err.value.code == "bad-signature"
    assert (
        f"seat checkpoint {_seat(ckpt) / CHECKPOINT_FILE} was sealed by key {seat_key}, "
        f"the manifest by {ident.public_key_b64}"
    ) in err.value.message
    return "untrusted-signer", [
        f"sealed by manager instance {ident.instance_id} with key {ident.public_key_b64}",
        f"cotal trust add {ident.public_key_b64} --name {ident.instance_id}",
    ]


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(flip_store_byte, id="flipped-byte"),
        pytest.param(flip_resume_byte, id="flipped-resume-document"),
        pytest.param(truncate_bundle, id="truncated"),
        pytest.param(symlink_untracked, id="symlink"),
        pytest.param(remove_refs, id="missing"),
        pytest.param(extra_in_seat, id="extra-in-seat-dir"),
        pytest.param(extra_in_attempt, id="extra-in-attempt-dir"),
        pytest.param(forge_seat_signature_keep_key, id="forged-seat-signature"),
        pytest.param(forge_seat_key_and_signature, id="forged-seat-key-and-signature"),
        pytest.param(forge_manifest_signature, id="forged-manifest-signature"),
        pytest.param(reseal_manifest_by_another_key, id="manifest-resealed-by-another-key"),
    ],
)
async def test_integrity_refuses_a_damaged_checkpoint(cli: Cli, cut: Cut, mutate: Mutation) -> None:
    move_source_away(cut)
    code, contains = mutate(cut.copy)
    await refused(cli, cut, cut.copy, code=code, contains=contains)
    # The override is for recency only.
    await refused(cli, cut, cut.copy, "--accept-stale-checkpoint", code=code, contains=contains)


async def test_a_consistent_reseal_by_a_foreign_key_is_refused_unless_trusted(
    cut: Cut, tmp_path: Path
) -> None:
    """Manifest and seat re-signed together by another key: every digest and signature is
    consistent, so only the signer's trust refuses it. Nothing trusted means nothing admitted."""
    own = source_identity(cut.root)
    ident = foreign_identity()
    forged = reseal(cut.copy, tmp_path / "forged", ident, edit=lambda r: r)
    assert [r.name for r in verify_integrity(forged)] == [SEAT]
    for keys in ({own.public_key_b64}, set()):
        with pytest.raises(Refusal) as err:
            admit.integrity(forged, trusted_keys=keys)
        assert err.value.code == "untrusted-signer"
        assert (
            f"sealed by manager instance {ident.instance_id} with key {ident.public_key_b64}"
            in err.value.message
        )
        assert (
            f"cotal trust add {ident.public_key_b64} --name {ident.instance_id}" in err.value.cure
        )
    with pytest.raises(Refusal) as err:
        admit.integrity(cut.copy, trusted_keys=())
    assert err.value.code == "untrusted-signer"
    assert (
        admit.integrity(cut.copy, trusted_keys={own.public_key_b64}).records[SEAT].lifecycle_uid
        == cut.uid()
    )
    assert (
        admit.integrity(forged, trusted_keys={ident.public_key_b64}).records[SEAT].lifecycle_uid
        == cut.uid()
    )


# -- gate 2: identity --------------------------------------------------------------------------


async def test_identity_refuses_another_space(cli: Cli, cut: Cut) -> None:
    move_source_away(cut)
    await refused(
        cli,
        cut,
        cut.copy,
        "--space",
        "other",
        code="wrong-space",
        contains=[
            "admission refused at the identity gate",
            "the checkpoint belongs to space 'main', not 'other'",
            "resume it with --space main",
        ],
    )


async def test_identity_relocates_a_root_at_another_path(cut: Cut, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    make_destination(elsewhere)
    src = cut.root.resolve()
    dest = Cli(elsewhere)
    before = tree_digest(elsewhere, skip=(), times=True)
    out = json.loads(
        dest.run(
            "checkpoint", "verify", str(cut.copy), "--json", *broker_args(cut.broker), *cut.trust
        ).stdout
    )
    [seat] = out["seats"]
    assert out["gates"]["identity"] == "pass" and seat["continuity"] == "exact"
    assert seat["relocated"] == {"cwdBefore": str(src), "cwdAfter": str(elsewhere.resolve())}
    assert tree_digest(elsewhere, skip=(), times=True) == before
    # A --map whose destination is neither a directory here nor under the root is refused by
    # name, and the refusal changes nothing either.
    await refused(
        dest,
        cut,
        cut.copy,
        "--map",
        f"/srv/shared={tmp_path / 'missing'}",
        code="bad-map",
        contains=[f"{tmp_path / 'missing'} is missing", "create"],
    )


async def test_identity_refuses_profile_drift(cli: Cli, cut: Cut) -> None:
    move_source_away(cut)
    write(cli.root / "cotal.toml", '[agents.scribe]\nmodel = "other"\n')
    record = read_seat_checkpoint(cut.copy / SEAT)
    model = record.entry["launch"].get("model")
    assert record.profile == registry.profile_digest("scribe", model, {})  # what the source ran
    here = registry.profile_digest("scribe", model, {"model": "other"})
    await refused(
        cli,
        cut,
        cut.copy,
        code="profile-drift",
        contains=[
            f"seat {SEAT}: this host's launch profile for scribe has revision {here}, "
            f"the checkpoint recorded {record.profile}"
        ],
    )


async def test_identity_refuses_an_entry_whose_allow_send_its_profile_does_not_pin(
    cli: Cli, cut: Cut, tmp_path: Path
) -> None:
    src = move_source_away(cut)
    # The resume document widened and the manifest sealed again by the source's own key: the
    # seat's signed record still pins the profile it was cut with, which names no permission.
    record = read_seat_checkpoint(cut.copy / SEAT)
    model = record.entry["launch"].get("model")
    assert "allowSend" not in record.entry["launch"]
    widened = reseal(
        cut.copy,
        tmp_path / "widened",
        source_identity(src),
        plan=replace_agent(SEAT, allow_send=["*"]),
    )
    here = registry.profile_digest("scribe", model, {}, ["*"])
    await refused(
        cli,
        cut,
        widened,
        code="profile-drift",
        contains=[
            f"seat {SEAT}: this host's launch profile for scribe has revision {here}, "
            f"the checkpoint recorded {record.profile}"
        ],
    )


async def test_identity_refuses_a_record_without_root_or_custody_revision(
    cli: Cli, cut: Cut, tmp_path: Path
) -> None:
    src = move_source_away(cut)
    old = reseal(
        cut.copy,
        tmp_path / "old",
        source_identity(src),
        edit=lambda r: msgspec.structs.replace(r, workspace_root=None, custody_revision=None),
    )
    await refused(
        cli,
        cut,
        old,
        code="old-checkpoint",
        contains=[
            f"seat {SEAT}: the checkpoint records no workspace root or custody revision",
            "cut the seat again with this version of cotal",
        ],
    )


async def test_a_live_uid_refuses_and_then_the_attempt_is_custody_lost(cli: Cli, cut: Cut) -> None:
    """Resume in root A; then a copy of the same checkpoint in root B at the same path."""
    b = cut.broker
    move_source_away(cut)
    first = json.loads(
        cli.run("up", "--restore", str(cut.copy), "--json", *broker_args(b), *cut.trust).stdout
    )
    assert first["journal"] == "retired" and first["claims"][0]["generation"] == 1
    [row] = cli.ps()
    assert row["lifecycleUid"] == cut.uid() and row["state"] == "running"
    holder_a = row["instanceId"]
    live_root = cut.root.with_name(cut.root.name + ".live")
    os.rename(cut.root, live_root)  # A keeps running; its root just left the path
    make_destination(cut.root)
    try:
        await wait_presence(b, cut.uid(), live=True)  # the resumed seat announces itself
        await refused(
            cli,
            cut,
            cut.copy,
            code="uid-live",
            claimed_by_nobody=False,
            contains=[
                "admission refused at the identity gate",
                f"retained principal {SEAT} (uid {cut.uid()}) is already live at the broker",
                "stop the running incarnation first",
            ],
        )
        record, attempt = await custody(b, SEAT, cut.uid(), cut.attempt_id)
        assert record is not None and (record["generation"], record["holder"]) == (1, holder_a)
        assert attempt == {"holder": holder_a, "root": str(cut.root.resolve())}

        # A stops; the uid is no longer live, so admission passes and the broker refuses B:
        # the attempt was already claimed by A's instance.
        Cli(live_root).run("down")
        await wait_presence(b, cut.uid(), live=False)
        tree_before = {k: v for k, v in snapshot(cli.root).items() if not k.startswith(".cotal")}
        proc = cli.run(
            "up", "--restore", str(cut.copy), "--json", *broker_args(b), *cut.trust, check=False
        )
        assert proc.returncode == 2, proc.stderr
        out = refusal_of(proc)
        assert out["code"] == "custody-lost", out
        assert (
            f"attempt {cut.attempt_id} was already claimed by instance {holder_a} at "
            f"{cut.root.resolve()}" in out["error"]
        )
        assert {
            k: v for k, v in snapshot(cli.root).items() if not k.startswith(".cotal")
        } == tree_before
        assert not manager_answers(cli.root)
        # B holds no writer generation, and its journal records the attempt as degraded.
        gen_dir = cli.root / ".cotal/auth/seat-generation"
        assert not [p for p in gen_dir.rglob("*") if p.is_file()]
        journal = json.loads((cli.root / ".cotal/maintenance/v1/journal.json").read_text())
        assert journal["state"] == "degraded" and holder_a in journal["degraded"]["reason"]
        _, attempt = await custody(b, SEAT, cut.uid(), cut.attempt_id)
        assert attempt == {"holder": holder_a, "root": str(cut.root.resolve())}
    finally:
        if manager_answers(live_root):
            Cli(live_root).run("down", check=False)


# -- gate 3: recency ---------------------------------------------------------------------------


async def test_recency_gate_boundaries_consent_future_and_unreadable(cut: Cut) -> None:
    adm = admit.integrity(cut.copy, trusted_keys={cut.signer_key})
    record = adm.records[SEAT]
    captured = parse_instant(record.captured_at)
    assert record.recency_horizon_ms == HORIZON
    assert (
        admit.recency(adm, clock=SYNCED, now=captured + timedelta(seconds=5), accept_stale=False)
        == []
    )
    assert (
        admit.recency(
            adm, clock=SYNCED, now=captured + timedelta(milliseconds=HORIZON), accept_stale=False
        )
        == []
    )

    now = captured + timedelta(milliseconds=HORIZON + 1)
    with pytest.raises(Refusal) as err:
        admit.recency(adm, clock=SYNCED, now=now, accept_stale=False)
    assert err.value.code == "stale-checkpoint"
    assert err.value.message == (
        f"admission refused at the recency gate: seat {SEAT}: capturedAt {record.captured_at} "
        f"is {HORIZON + 1} ms "
        f"old at this host's clock ({now.isoformat()}), beyond its horizon of {HORIZON} ms"
    )
    assert "--accept-stale-checkpoint" in err.value.cure
    consents = admit.recency(adm, clock=SYNCED, now=now, accept_stale=True)
    assert consents == [
        Consent(seat=SEAT, captured_at=record.captured_at, age_ms=HORIZON + 1, horizon_ms=HORIZON)
    ]
    assert adm.consents == consents
    assert msgspec.to_builtins(consents[0]) == {
        "seat": SEAT,
        "capturedAt": record.captured_at,
        "ageMs": HORIZON + 1,
        "horizonMs": HORIZON,
    }

    # Later than this clock: a small skew is tolerated, beyond it no override exists.
    assert (
        admit.recency(
            adm,
            clock=SYNCED,
            now=captured - timedelta(milliseconds=admit.CLOCK_SKEW_MS),
            accept_stale=False,
        )
        == []
    )
    now = captured - timedelta(milliseconds=admit.CLOCK_SKEW_MS + 1)
    for accept in (False, True):
        with pytest.raises(Refusal) as err:
            admit.recency(adm, clock=SYNCED, now=now, accept_stale=accept)
        assert err.value.code == "future-checkpoint"
        assert (
            f"seat {SEAT}: capturedAt {record.captured_at} is {admit.CLOCK_SKEW_MS + 1} ms "
            f"later than this "
            f"host's clock ({now.isoformat()}), beyond the {admit.CLOCK_SKEW_MS} ms skew allowed"
        ) in err.value.message
        assert "no override exists" in err.value.cure

    # An unreadable capturedAt never gets past the record parser...
    doc = json.loads((cut.copy / SEAT / CHECKPOINT_FILE).read_bytes())
    for bad in (
        "2026-02-30T12:00:00.000Z",
        "yesterday",
        "2026-11-29T14:00:00Z",
        "2026-11-29T14:00:00.000+01:00",
    ):
        doc["capturedAt"] = bad
        with pytest.raises(DecodeError) as derr:
            decode_seat_checkpoint(json.dumps(doc).encode())
        assert derr.value.code == "malformed" and "capturedAt" in derr.value.message, (
            derr.value.message
        )
    # ...and a record that bypassed it is refused by the gate itself, with no override.
    broken = msgspec.structs.replace(record)
    msgspec.structs.force_setattr(broken, "captured_at", "yesterday")
    adm.records[SEAT] = broken
    for accept in (False, True):
        with pytest.raises(Refusal) as err:
            admit.recency(adm, clock=SYNCED, now=captured, accept_stale=accept)
        assert err.value.code == "unreadable-time"
        assert f"seat {SEAT}: capturedAt 'yesterday' is unreadable" in err.value.message
        assert "no override exists" in err.value.cure


async def test_an_unsynchronized_clock_refuses_before_any_age_with_no_override(cut: Cut) -> None:
    adm = admit.integrity(cut.copy, trusted_keys={cut.signer_key})
    captured = parse_instant(adm.records[SEAT].captured_at)
    unsynced = ClockReading(
        False,
        "kernel",
        "adjtimex state 5 (TIME_ERROR), status 0x40 (STA_UNSYNC), maximum error 16 s",
    )
    for accept in (False, True):
        with pytest.raises(Refusal) as err:
            admit.recency(
                adm, clock=unsynced, now=captured + timedelta(seconds=1), accept_stale=accept
            )
        assert err.value.code == "clock-unsynchronized"
        assert err.value.message == (
            "admission refused at the recency gate: this host's clock is not synchronized "
            "(adjtimex state 5 (TIME_ERROR), status 0x40 (STA_UNSYNC), maximum error 16 s), so no "
            "checkpoint's age can be judged against it"
        )
        assert "no per-run override exists" in err.value.cure
    assert adm.consents == []


async def test_the_destination_skew_is_its_own_setting(cut: Cut) -> None:
    adm = admit.integrity(cut.copy, trusted_keys={cut.signer_key})
    captured = parse_instant(adm.records[SEAT].captured_at)
    ahead = captured - timedelta(seconds=90)
    with pytest.raises(Refusal) as err:
        admit.recency(adm, clock=SYNCED, now=ahead, accept_stale=False)
    assert err.value.code == "future-checkpoint"
    assert "`[recency] skew_s`" in err.value.cure
    assert admit.recency(adm, clock=SYNCED, now=ahead, accept_stale=False, skew_ms=120_000) == []


async def test_stale_checkpoint_refuses_then_admits_with_consent_printed_and_journaled(
    cli: Cli, cut: Cut, tmp_path: Path
) -> None:
    src = move_source_away(cut)
    identity = source_identity(src)
    when = days_ago(2)
    stale = reseal(cut.copy, tmp_path / "stale", identity, edit=captured_at(when))
    # A real sealed record, signed by the very manager that cut the seat.
    assert read_manifest(stale).signer == read_manifest(cut.copy).signer
    assert (
        admit.integrity(stale, trusted_keys={identity.public_key_b64}).records[SEAT].captured_at
        == when
    )

    # Without the flag: refused, naming capturedAt, this host's clock reading and the horizon.
    before = snapshot(cli.root)
    t0 = datetime.now(UTC)
    proc = cli.run("up", "--restore", str(stale), *broker_args(cut.broker), *cut.trust, check=False)
    t1 = datetime.now(UTC)
    assert proc.returncode == 2, proc.stderr
    m = re.search(
        r"cotal: admission refused at the recency gate: seat scribe1: capturedAt (\S+) is (\d+) "
        r"ms old "
        r"at this host's clock \(([^)]+)\), beyond its horizon of (\d+) ms; pass "
        r"--accept-stale-checkpoint",
        proc.stderr,
    )
    assert m, proc.stderr
    clock = datetime.fromisoformat(m.group(3))
    assert m.group(1) == when and int(m.group(4)) == HORIZON
    assert t0 <= clock <= t1
    assert int(m.group(2)) == int((clock - parse_instant(when)).total_seconds() * 1000)
    assert snapshot(cli.root) == before and not manager_answers(cli.root)
    await assert_unclaimed(cut)
    await refused(
        cli,
        cut,
        stale,
        code="stale-checkpoint",
        contains=[f"capturedAt {when} is", f"beyond its horizon of {HORIZON} ms"],
    )

    # With --accept-stale-checkpoint: admitted, the consent printed and journaled.
    proc = cli.run(
        "up",
        "--restore",
        str(stale),
        "--json",
        "--accept-stale-checkpoint",
        *broker_args(cut.broker),
        *cut.trust,
        check=False,
    )
    try:
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        [consent] = out["consents"]
        assert set(consent) == {"seat", "capturedAt", "ageMs", "horizonMs"}
        assert (consent["seat"], consent["capturedAt"], consent["horizonMs"]) == (
            SEAT,
            when,
            HORIZON,
        )
        assert 2 * 86_400_000 <= consent["ageMs"] <= 2 * 86_400_000 + 300_000
        assert (
            f"CONSENT: seat {SEAT} captured {when} is {consent['ageMs']} ms old, beyond its "
            f"{HORIZON} ms "
            "horizon; admitted by --accept-stale-checkpoint"
        ) in proc.stderr
        journal = json.loads((cli.root / ".cotal/maintenance/v1/journal.json").read_text())
        assert journal["attemptId"] == cut.attempt_id and journal["state"] == "retired"
        assert journal["consents"] == [consent]
        [row] = cli.ps()
        assert row["lifecycleUid"] == cut.uid() and row["state"] == "running"
        record, attempt = await custody(cut.broker, SEAT, cut.uid(), cut.attempt_id)
        assert (
            record is not None
            and record["generation"] == 1
            and record["holder"] == row["instanceId"]
        )
        assert attempt is not None and attempt["holder"] == row["instanceId"]
    finally:
        cli.run("down", check=False)


async def test_future_checkpoint_refuses_with_no_override(
    cli: Cli, cut: Cut, tmp_path: Path
) -> None:
    src = move_source_away(cut)
    when = format_instant(datetime.now(UTC) + timedelta(days=1))
    future = reseal(cut.copy, tmp_path / "future", source_identity(src), edit=captured_at(when))
    for flags in ((), ("--accept-stale-checkpoint",)):
        await refused(
            cli,
            cut,
            future,
            *flags,
            code="future-checkpoint",
            contains=[
                "admission refused at the recency gate",
                f"seat {SEAT}: capturedAt {when} is",
                "ms later than this host's clock (",
                "beyond the 60000 ms skew allowed",
                "no override exists",
            ],
        )


async def test_unreadable_captured_at_refuses_at_the_parser_with_no_override(
    cli: Cli, cut: Cut, tmp_path: Path
) -> None:
    """No sealer writes such a record (seal_seat parses what it seals), so the bytes are edited
    and the manifest re-sealed over them by the source's own key: only the parser stands."""
    src = move_source_away(cut)
    bad = tmp_path / "unreadable"
    shutil.copytree(cut.copy, bad)
    path = bad / SEAT / CHECKPOINT_FILE
    doc = json.loads(path.read_bytes())
    doc["capturedAt"] = "2026-02-30T12:00:00.000Z"
    path.write_bytes(json.dumps(doc, indent=2).encode() + b"\n")
    reseal_manifest(bad, source_identity(src))
    for flags in ((), ("--accept-stale-checkpoint",)):
        await refused(
            cli,
            cut,
            bad,
            *flags,
            code="malformed",
            contains=[
                f"{CHECKPOINT_FILE} is malformed",
                "capturedAt '2026-02-30T12:00:00.000Z' is not a real calendar instant",
            ],
        )


async def test_an_unparseable_seat_record_is_refused_naming_its_file(
    cut: Cut, tmp_path: Path
) -> None:
    bad = tmp_path / "unreadable"
    shutil.copytree(cut.copy, bad)
    path = bad / SEAT / CHECKPOINT_FILE
    doc = json.loads(path.read_bytes())
    doc["capturedAt"] = "2026-02-30T12:00:00.000Z"
    path.write_bytes(json.dumps(doc, indent=2).encode() + b"\n")
    reseal_manifest(bad, source_identity(cut.root))
    with pytest.raises(Refusal) as err:
        admit.integrity(bad, trusted_keys={cut.signer_key})
    assert "capturedAt" in err.value.message
    assert str(path) in err.value.message


# -- all-or-nothing and gate order -------------------------------------------------------------


async def test_one_unadmitted_or_stale_seat_refuses_the_whole_resume(
    cli: Cli, shared_broker: SharedBroker, tmp_path: Path
) -> None:
    both = ("scribe1", "scribe2")
    cut = make_cut(cli, shared_broker, tmp_path / "ckpt", seats=both)
    src = move_source_away(cut)
    identity = source_identity(src)

    # scribe2's directory and manifest entry removed consistently and the manifest re-sealed by
    # the source's key: every file verifies, but the resume document still retains scribe2.
    partial = reseal(cut.copy, tmp_path / "partial", identity, drop=("scribe2",))
    assert [r.name for r in verify_integrity(partial)] == ["scribe1"]
    assert sorted(
        a["name"] for a in json.loads((partial / RESUME_FILE).read_bytes())["agents"]
    ) == list(both)
    await refused(
        cli,
        cut,
        partial,
        "--accept-stale-checkpoint",
        code="retained-unadmitted",
        seats=both,
        contains=[
            "admission refused at the integrity gate",
            f"retained seat(s) scribe2 have no checkpoint in {partial}",
        ],
    )

    # One stale seat beside a fresh one: nothing is admitted, not even the fresh seat.
    when = days_ago(3)
    one_stale = reseal(
        cut.copy, tmp_path / "one-stale", identity, edit=captured_at(when), only=("scribe2",)
    )
    await refused(
        cli,
        cut,
        one_stale,
        code="stale-checkpoint",
        seats=both,
        contains=[f"seat scribe2: capturedAt {when} is"],
    )


async def test_gates_run_in_order_and_the_override_is_for_recency_only(
    cli: Cli, cut: Cut, tmp_path: Path
) -> None:
    src = move_source_away(cut)
    stale = reseal(
        cut.copy, tmp_path / "stale", source_identity(src), edit=captured_at(days_ago(2))
    )
    damaged = tmp_path / "damaged"
    shutil.copytree(stale, damaged)
    code, contains = flip_store_byte(damaged)
    # integrity before identity
    await refused(
        cli,
        cut,
        damaged,
        "--space",
        "other",
        "--accept-stale-checkpoint",
        code=code,
        contains=contains,
    )
    # identity before recency
    await refused(cli, cut, stale, "--space", "other", code="wrong-space", contains=["not 'other'"])
    write(cli.root / "cotal.toml", '[agents.scribe]\nmodel = "other"\n')
    await refused(
        cli,
        cut,
        stale,
        "--accept-stale-checkpoint",
        code="profile-drift",
        contains=[f"seat {SEAT}: this host's launch profile for scribe"],
    )


@pytest.mark.parametrize(
    "stale",
    [
        pytest.param(False, id="fresh"),
        pytest.param(True, id="stale-accepted"),
    ],
)
async def test_a_rerun_after_a_failed_restore_continues_the_admitted_attempt(
    cli: Cli, cut: Cut, tmp_path: Path, stale: bool
) -> None:
    """Admission passes, custody is claimed, then the restore refuses (a leftover staging
    directory); once the operator removes it, the same command continues the attempt."""
    src = move_source_away(cut)
    ckpt = cut.copy
    flags: tuple[str, ...] = ()
    if stale:
        ckpt = reseal(
            cut.copy, tmp_path / "stale", source_identity(src), edit=captured_at(days_ago(2))
        )
        flags = ("--accept-stale-checkpoint",)
    leftover = Path(f"{cut.root}.incoming")
    write(leftover / "evidence.txt", "an earlier failed restore\n")
    proc = cli.run(
        "up",
        "--restore",
        str(ckpt),
        "--json",
        *broker_args(cut.broker),
        *cut.trust,
        *flags,
        check=False,
    )
    assert proc.returncode == 2 and refusal_of(proc)["code"] == "staging-exists", proc.stderr
    journal_path = cli.root / ".cotal/maintenance/v1/journal.json"
    journal = json.loads(journal_path.read_text())
    assert journal["state"] == "resume-intent" and len(journal["consents"]) == int(stale)
    record, _ = await custody(cut.broker, SEAT, cut.uid(), cut.attempt_id)
    assert record is not None and record["generation"] == 1
    shutil.rmtree(leftover)
    try:
        proc = cli.run(
            "up",
            "--restore",
            str(ckpt),
            "--json",
            *broker_args(cut.broker),
            *cut.trust,
            *flags,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json.loads(proc.stdout)["journal"] == "retired"
        journal = json.loads(journal_path.read_text())
        assert journal["state"] == "retired" and len(journal["consents"]) == int(stale)
    finally:
        cli.run("down", check=False)


# -- same root, and `cotal checkpoint verify` --------------------------------------------------


async def test_same_root_refusal_keeps_the_ready_journal_and_then_resumes(
    cli: Cli, cut: Cut
) -> None:
    journal_path = cli.root / ".cotal/maintenance/v1/journal.json"
    assert json.loads(journal_path.read_text())["state"] == "ready"
    everything = tree_digest(cli.root, skip=(), times=True)
    out = json.loads(
        cli.run(
            "checkpoint", "verify", str(cut.source_dir), "--json", *broker_args(cut.broker)
        ).stdout
    )
    assert out["admitted"] is True
    assert (
        tree_digest(cli.root, skip=(), times=True) == everything
    )  # logs included: verify writes nothing

    await refused(
        cli, cut, cut.source_dir, "--space", "other", code="wrong-space", contains=["not 'other'"]
    )
    assert json.loads(journal_path.read_text())["state"] == "ready"

    # The refusal left the root resumable: the same checkpoint now resumes in place.
    try:
        result = json.loads(
            cli.run(
                "up", "--restore", str(cut.source_dir), "--json", *broker_args(cut.broker)
            ).stdout
        )
        assert result["journal"] == "retired" and result["consents"] == []
        [seat] = result["seats"]
        assert seat["sameUid"] and seat["sameSession"]
        assert json.loads(journal_path.read_text())["state"] == "retired"
    finally:
        cli.run("down", check=False)


async def test_checkpoint_verify_runs_the_gates_and_changes_nothing(
    cli: Cli, cut: Cut, tmp_path: Path
) -> None:
    src = move_source_away(cut)
    b = cut.broker
    everything = tree_digest(cli.root, skip=(), times=True)
    record = read_seat_checkpoint(cut.copy / SEAT)

    out = json.loads(
        cli.run("checkpoint", "verify", str(cut.copy), "--json", *broker_args(b), *cut.trust).stdout
    )
    signer = out.pop("signer")
    assert {k: signer[k] for k in ("instanceId", "publicKey", "pinned")} == {
        "instanceId": cut.instance_id,
        "publicKey": record.signer.public_key if record.signer else None,
        "pinned": True,
    }
    assert out == {
        "admitted": True,
        # The suite's test hook stood in for the kernel's clock reading, and verify says so.
        "clock": {
            "source": "COTAL_TEST_CLOCK_STATUS",
            "detail": "COTAL_TEST_CLOCK_STATUS=synchronized",
        },
        "attemptId": cut.attempt_id,
        "space": "main",
        "consents": [],
        "gates": {"integrity": "pass", "identity": "pass", "recency": "pass"},
        "seats": [
            {
                "name": SEAT,
                "lifecycleUid": cut.uid(),
                "continuity": "exact",
                "capturedAt": record.captured_at,
                "sessionId": cut.rows[SEAT]["sessionId"],
            }
        ],
    }
    text = cli.run("checkpoint", "verify", str(cut.copy), *broker_args(b), *cut.trust).stdout
    assert f"checkpoint {cut.copy}: admitted (attempt {cut.attempt_id}, space main)" in text
    assert re.search(r"integrity\s+pass", text) and re.search(r"recency\s+pass", text)

    damaged = tmp_path / "damaged"
    shutil.copytree(cut.copy, damaged)
    _, contains = flip_store_byte(damaged)
    proc = cli.run(
        "checkpoint", "verify", str(damaged), "--json", *broker_args(b), *cut.trust, check=False
    )
    assert proc.returncode == 2
    bad = refusal_of(proc)
    assert bad["code"] == "integrity" and contains[0] in bad["error"]

    when = days_ago(2)
    stale = reseal(cut.copy, tmp_path / "stale", source_identity(src), edit=captured_at(when))
    proc = cli.run(
        "checkpoint", "verify", str(stale), "--json", *broker_args(b), *cut.trust, check=False
    )
    assert proc.returncode == 2 and refusal_of(proc)["code"] == "stale-checkpoint"
    out = json.loads(
        cli.run(
            "checkpoint",
            "verify",
            str(stale),
            "--json",
            "--accept-stale-checkpoint",
            *broker_args(b),
            *cut.trust,
        ).stdout
    )
    assert out["gates"]["recency"] == "stale, accepted by --accept-stale-checkpoint"
    [consent] = out["consents"]
    assert (consent["seat"], consent["capturedAt"], consent["horizonMs"]) == (SEAT, when, HORIZON)

    # The identity gate needs the broker's answer; without one it refuses rather than passes.
    proc = cli.run("checkpoint", "verify", str(cut.copy), "--json", *cut.trust, check=False)
    assert proc.returncode == 2 and refusal_of(proc)["code"] == "no-broker"

    assert tree_digest(cli.root, skip=(), times=True) == everything
    assert not (cli.root / ".cotal").exists() and not manager_answers(cli.root)
    await assert_unclaimed(cut)
