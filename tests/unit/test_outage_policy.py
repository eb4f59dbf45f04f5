"""An outage is not poison, the pure parts: which turn ends are the provider's, the backoff
policy and its `[delivery]` keys, and the carried dead-letter file's strict reading."""

from __future__ import annotations

import base64

import msgspec
import pytest

from connectors.base import TurnOutcome
from connectors.driverkit import provider_unavailable, unavailable_outcome
from connectors.pi import judge_turn
from connectors.scribe.connector import ScribeCodec
from manager.daemon.delivery import Backoff
from manager.registry import FileConfig
from protocol.checkpoint import DEAD_LETTER_FILE, CarriedMessage, DeadLetterState, FileRef
from protocol.codec import encode_json
from protocol.deadletter import DeadLetterMeta, carried_headers, decode_dead_letters
from protocol.errors import DecodeError


@pytest.mark.parametrize(
    "detail",
    [
        "503 fake outage (503)",
        "429 Too Many Requests",
        "API Error: 529 {'type':'error','error':{'type':'overloaded_error'}}",
        "Connection error.",
        "fetch failed",
        "connect ECONNREFUSED 127.0.0.1:9",
        "unexpected status 502 Bad Gateway",
    ],
)
def test_the_providers_failures_are_unavailable(detail: str) -> None:
    assert provider_unavailable(detail)
    assert unavailable_outcome(TurnOutcome("error", detail=detail)) == TurnOutcome(
        "provider-unavailable", detail=detail
    )


@pytest.mark.parametrize(
    "detail",
    [
        "500 fake server error (fake:http-500)",
        "API Error: 500 internal",
        "400 invalid request",
        "injected fault error-always (delivery 1)",
        "the tool failed after 503 attempts",
    ],
)
def test_a_turn_that_failed_by_itself_stays_an_error(detail: str) -> None:
    assert not provider_unavailable(detail)
    assert unavailable_outcome(TurnOutcome("error", detail=detail)).status == "error"


def test_only_an_error_end_is_reclassified() -> None:
    for status in ("ok", "aborted", "unknown"):
        outcome = TurnOutcome(status, detail="503 x")  # type: ignore[arg-type]
        assert unavailable_outcome(outcome) is outcome


def test_pi_reports_its_providers_outage_as_unavailable() -> None:
    end = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "stopReason": "error", "errorMessage": "503 down"},
        ]
    }
    assert judge_turn("hi", end) == TurnOutcome("provider-unavailable", detail="503 down")


def test_scribes_wire_carries_the_kind_and_refuses_an_unknown_one() -> None:
    line = b'{"type":"turn_end","id":"m","status":"provider-unavailable","reply":"","detail":"x"}'
    event = ScribeCodec().decode(line)
    assert getattr(event, "outcome", None) == TurnOutcome("provider-unavailable", "", "x")
    with pytest.raises(DecodeError):
        ScribeCodec().decode(line.replace(b"provider-unavailable", b"provider-down"))


def test_the_backoff_grows_by_its_coefficient_to_its_cap_with_jitter_below() -> None:
    policy = Backoff(initial_s=2.0, coefficient=2.0, max_s=60.0, jitter=0.2)
    assert [policy.delay(n, lambda: 0.0) for n in range(7)] == [2, 4, 8, 16, 32, 60, 60]
    assert policy.delay(0, lambda: 1.0) == pytest.approx(1.6)
    assert policy.delay(10**9, lambda: 0.0) == 60.0
    assert Backoff() == Backoff(2.0, 2.0, 60.0, 0.2)


def _delivery(text: str) -> object:
    return msgspec.toml.decode(text.encode(), type=FileConfig, strict=True).delivery


def test_the_delivery_table_takes_the_policy_and_refuses_what_is_out_of_bounds() -> None:
    cfg = _delivery(
        "[delivery]\nbackoff_initial_s = 0.5\nbackoff_coefficient = 3\n"
        "backoff_max_s = 10\nbackoff_jitter = 0\n"
    )
    assert Backoff.of(cfg) == Backoff(0.5, 3.0, 10.0, 0.0)  # type: ignore[arg-type]
    with pytest.raises(msgspec.ValidationError, match="raise backoff_max_s or lower"):
        _delivery("[delivery]\nbackoff_initial_s = 5\nbackoff_max_s = 1\n")
    for bad, where in (
        ("backoff_jitter = 1.5", "backoff_jitter"),
        ("backoff_coefficient = 0.5", "backoff_coefficient"),
        ("backoff_initial_s = 0", "backoff_initial_s"),
        ("backoff_max_s = 100000", "backoff_max_s"),
        ("backoff = 1", "unknown field `backoff`"),
    ):
        with pytest.raises(msgspec.ValidationError, match=where):
            _delivery(f"[delivery]\n{bad}\n")


SUBJECT = "cotal.main.dead.local.d.ba9qtl53kgfj4d1kcipm5qpxwkqxaxx"


def _letter(seq: int, data: bytes, subject: str = SUBJECT) -> CarriedMessage:
    meta = DeadLetterMeta(
        subject="cotal.main.inst.local.d.local.operator",
        source_seq=seq * 10,
        deliveries=3,
        reason="error: x",
        dead_at="2026-12-06T18:00:00.000Z",
    )
    return CarriedMessage(
        seq=seq,
        subject=subject,
        headers=carried_headers(meta),
        payload=base64.b64encode(data).decode(),
    )


def _state(letters: int, size: int) -> DeadLetterState:
    return DeadLetterState(
        letters=letters, letter_bytes=size, file=FileRef(DEAD_LETTER_FILE, 1, "0" * 64)
    )


def test_a_carried_dead_letter_file_is_read_exactly_as_its_record_says() -> None:
    letters = [_letter(4, b"abc"), _letter(9, b"de")]
    data = b"".join(encode_json(m) + b"\n" for m in letters)
    assert decode_dead_letters(data, _state(2, 5), SUBJECT) == letters
    for state, subject, why in (
        (_state(3, 5), SUBJECT, "where the record says 3"),
        (_state(2, 6), SUBJECT, "of 6"),
        (_state(2, 5), SUBJECT + "x", "not"),
    ):
        with pytest.raises(ValueError, match=why):
            decode_dead_letters(data, state, subject)
    backwards = b"".join(encode_json(m) + b"\n" for m in reversed(letters))
    with pytest.raises(ValueError, match="is not after"):
        decode_dead_letters(backwards, _state(2, 5), SUBJECT)
    stranger = encode_json(msgspec.structs.replace(letters[0], headers={})) + b"\n"
    with pytest.raises(ValueError, match="line 1"):
        decode_dead_letters(stranger, _state(1, 3), SUBJECT)
