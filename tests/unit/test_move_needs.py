"""The probe's per-seat needs as records: an older source's probe (no needs) still decodes and
asks nothing more, a field no cotal sends is refused, and two hosts' harness versions compare
by the version number they name."""

from __future__ import annotations

import pytest

from protocol import move
from protocol.errors import DecodeError

UID = "a" * 26
DIGEST = "b" * 64


def test_a_probe_without_needs_decodes_and_names_none() -> None:
    old = b'{"source":"x","signer":"k","seats":["mover"],"uids":["' + UID.encode() + b'"]}'
    assert move.decode_probe(old).needs == []


def test_needs_round_trip_and_refuse_unknown_fields() -> None:
    need = move.ProbedSeat(
        name="mover",
        agent="pi",
        model="fake-model",
        profile=DIGEST,
        harness_version="0.73.1",
        bytes=1 << 40,
        allow_send=["*"],
    )
    probe = move.MoveProbe(source="x", signer="k", seats=["mover"], uids=[UID], needs=[need])
    assert move.decode_probe(move.encode(probe)) == probe
    forged = move.encode(probe).replace(b'"bytes"', b'"extra":1,"bytes"')
    with pytest.raises(DecodeError):
        move.decode_probe(forged)


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("0.73.1", "pi 0.73.1", True),
        ("2.1.197 (Claude Code)", "2.1.197", True),
        ("cotal 0.1.0", "cotal 0.1.0", True),
        ("built-in", "built-in", True),
        ("0.73.1", "0.0.9", False),
        ("0.73.1", "0.73.1-rc1", False),
    ],
)
def test_harness_versions_compare_by_their_number(a: str, b: str, same: bool) -> None:
    assert (move.harness_version_key(a) == move.harness_version_key(b)) is same
