"""Every token rule lives in `protocol.names`; each refuses a token with a trailing newline.

msgspec matches a `Meta(pattern=...)` with `re.search`, where `$` also matches before a final
newline, so a rule written `^...$` would let `"worker\\n"` into a record and from there into a
file name or a subject. These tests hold both the check and the decoder to the same rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import msgspec
import pytest

from protocol import checkpoint, custody, inventory, maintenance
from protocol.errors import Refusal
from protocol.instant import parse_instant
from protocol.names import (
    ATTEMPT_ID,
    LIFECYCLE_UID,
    SEAT_NAME,
    SPACE,
    TOKEN_RULES,
    TokenRule,
    check_attempt_id,
    check_lifecycle_uid,
    check_seat_name,
    check_space,
)

RULES = {rule.what: rule for rule in TOKEN_RULES}


def test_every_rule_has_its_own_name() -> None:
    assert len(RULES) == len(TOKEN_RULES)


def _struct_for(pattern: str) -> type[msgspec.Struct]:
    return msgspec.defstruct("Holder", [("value", Annotated[str, msgspec.Meta(pattern=pattern)])])


def _decodes(struct: type[msgspec.Struct], value: str) -> bool:
    try:
        msgspec.json.decode(msgspec.json.encode({"value": value}), type=struct)
    except msgspec.ValidationError:
        return False
    return True


@pytest.mark.parametrize("rule", TOKEN_RULES, ids=lambda rule: rule.what)
def test_rule_accepts_its_example(rule: TokenRule) -> None:
    assert rule.matches(rule.example)
    assert _decodes(_struct_for(rule.pattern), rule.example)


@pytest.mark.parametrize("rule", TOKEN_RULES, ids=lambda rule: rule.what)
@pytest.mark.parametrize("suffix", ["\n", "\r\n", "\x00", " "])
def test_rule_refuses_a_trailing_character(rule: TokenRule, suffix: str) -> None:
    token = rule.example + suffix
    assert not rule.matches(token)
    assert not _decodes(_struct_for(rule.pattern), token)


@pytest.mark.parametrize("rule", TOKEN_RULES, ids=lambda rule: rule.what)
def test_rule_refuses_a_leading_newline_and_non_strings(rule: TokenRule) -> None:
    assert not rule.matches("\n" + rule.example)
    assert not rule.matches(rule.example.encode())
    assert not rule.matches(None)


CHECKS: list[tuple[TokenRule, Callable[[str], str]]] = [
    (SEAT_NAME, check_seat_name),
    (SPACE, check_space),
    (LIFECYCLE_UID, check_lifecycle_uid),
    (ATTEMPT_ID, check_attempt_id),
]


@pytest.mark.parametrize(("rule", "check"), CHECKS, ids=[rule.what for rule, _ in CHECKS])
def test_check_functions_use_the_rule(rule: TokenRule, check: Callable[[str], str]) -> None:
    assert check(rule.example) == rule.example
    with pytest.raises(Refusal):
        check(rule.example + "\n")


def test_instant_parser_refuses_a_trailing_newline_and_foreign_digits() -> None:
    instant = RULES["instant"].example
    parse_instant(instant)
    with pytest.raises(ValueError):
        parse_instant(instant + "\n")
    with pytest.raises(ValueError):
        parse_instant(instant.replace("2", "\u0662", 1))  # ARABIC-INDIC DIGIT TWO


# The field types the records actually use, each with the rule it must carry.
FIELD_TYPES: list[tuple[str, Any, TokenRule]] = [
    ("checkpoint.SeatName", checkpoint.SeatName, RULES["seat name"]),
    ("checkpoint.SpaceName", checkpoint.SpaceName, RULES["space"]),
    ("checkpoint.LifecycleUid", checkpoint.LifecycleUid, RULES["lifecycle uid"]),
    ("checkpoint.InstanceId", checkpoint.InstanceId, RULES["instance id"]),
    ("checkpoint.AttemptId", checkpoint.AttemptId, RULES["attempt id"]),
    ("checkpoint.Sha256Hex", checkpoint.Sha256Hex, RULES["sha256 digest"]),
    ("checkpoint.ObjectId", checkpoint.ObjectId, RULES["object id"]),
    ("checkpoint.Instant", checkpoint.Instant, RULES["instant"]),
    ("checkpoint.FileName", checkpoint.FileName, RULES["checkpoint file name"]),
    ("checkpoint.HeadRef", checkpoint.HeadRef, RULES["branch ref"]),
    ("inventory.Label", inventory.Label, RULES["label"]),
    ("inventory.Token", inventory.Token, RULES["token"]),
    ("inventory.SeatName", inventory.SeatName, RULES["seat name"]),
    ("inventory.Space", inventory.Space, RULES["space"]),
    ("inventory.AttemptId", inventory.AttemptId, RULES["attempt id"]),
    ("inventory.LifecycleUid", inventory.LifecycleUid, RULES["lifecycle uid"]),
    ("inventory.InstanceId", inventory.InstanceId, RULES["instance id"]),
    ("inventory.Digest", inventory.Digest, RULES["sha256 digest"]),
    ("inventory.DependencyKind", inventory.DependencyKind, RULES["dependency kind"]),
    ("maintenance.CommitToken", maintenance.CommitToken, RULES["commit token"]),
]


@pytest.mark.parametrize(
    ("where", "field", "rule"), FIELD_TYPES, ids=[w for w, _, _ in FIELD_TYPES]
)
def test_record_fields_refuse_a_trailing_newline(where: str, field: Any, rule: TokenRule) -> None:
    holder = msgspec.defstruct("Holder", [("value", field)])
    assert _decodes(holder, rule.example), where
    assert not _decodes(holder, rule.example + "\n"), where


def test_custody_record_refuses_a_trailing_newline_in_each_token() -> None:
    good = {
        "seat": RULES["seat name"].example,
        "lifecycleUid": RULES["lifecycle uid"].example,
        "generation": 0,
        "holder": RULES["instance id"].example,
        "claimedAt": RULES["instant"].example,
    }
    msgspec.json.decode(msgspec.json.encode(good), type=custody.CustodyRecord)
    for key in ("seat", "lifecycleUid", "holder"):
        bad = {**good, key: good[key] + "\n"}
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(msgspec.json.encode(bad), type=custody.CustodyRecord)


def test_refs_list_refuses_a_ref_name_outside_the_rule() -> None:
    oid = RULES["object id"].example
    assert checkpoint.parse_refs_list(f"{oid} refs/heads/main\n".encode()) == {
        "refs/heads/main": oid
    }
    with pytest.raises(ValueError):
        checkpoint.parse_refs_list(f"{oid} refs/heads/ma in\n".encode())
