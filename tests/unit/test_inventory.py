"""The resume inventory parser: round trip, v1 upgrade, and every refusal by its text."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from protocol.errors import DecodeError, Refusal
from protocol.inventory import (
    INVENTORY_CAP,
    INVENTORY_V1,
    INVENTORY_V2,
    Agent,
    Dependency,
    FileRef,
    Identity,
    Inventory,
    Launch,
    decode_inventory,
    encode_inventory,
    inventory_digest,
    msg_changed,
    parse_resume_args,
    reference_rule_errors,
    references,
)

UID = "a" * 26
DIGEST = "0" * 64
ATTEMPT = "cut-20250101-abc"
INSTANCE = "b" * 26


def agent_doc(name: str = "worker_1", uid: str = UID, **launch: Any) -> dict[str, Any]:
    return {
        "name": name,
        "space": "main",
        "role": "builder",
        "identity": {"mode": "open", "lifecycleUid": uid, "owner": "local"},
        "launch": {
            "connector": "scribe",
            "cwd": "/srv/repo",
            "model": "m-1",
            "sessionId": "sess-1",
            "unresolvedLaunchOptionKeys": [],
            "profileSha256": DIGEST,
            "sessionStores": ["/srv/repo/.scribe"],
            **launch,
        },
        "dependencies": [
            {"kind": "profile", "path": "/srv/profiles/worker.json", "sha256": DIGEST}
        ],
        "generation": 2,
        "startedAt": "2025-01-01T00:00:00Z",
    }


def inventory_doc(agents: list[dict[str, Any]] | None = None, **header: Any) -> dict[str, Any]:
    return {
        "version": INVENTORY_V2,
        "space": "main",
        "attemptId": ATTEMPT,
        "instanceId": INSTANCE,
        "createdAt": "2025-01-01T00:00:01Z",
        "agents": [agent_doc()] if agents is None else agents,
        **header,
    }


def raw(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def refused(doc: dict[str, Any] | bytes, attempt: str = ATTEMPT, **kw: Any) -> Refusal:
    data = doc if isinstance(doc, bytes) else raw(doc)
    with pytest.raises(Refusal) as info:
        parse_resume_args(attempt, data, **kw)
    return info.value


def test_round_trip_is_byte_stable() -> None:
    inv = parse_resume_args(ATTEMPT, raw(inventory_doc()))
    assert inv.version == INVENTORY_V2
    agent = inv.agents[0]
    assert agent.identity.lifecycle_uid == UID
    assert agent.launch.session_stores == ["/srv/repo/.scribe"]
    assert agent.generation == 2
    data = encode_inventory(inv)
    again = parse_resume_args(ATTEMPT, data)
    assert again == inv
    assert encode_inventory(again) == data
    assert inventory_digest(again) == inventory_digest(inv)
    # Normalized: sorted keys, no whitespace, optional fields omitted rather than null.
    assert data.startswith(b'{"agents":[{"dependencies"')
    assert b" " not in data and b"null" not in data.replace(b'"instanceId":null', b"")


def test_built_inventory_round_trips_through_the_parser() -> None:
    """What the cut builds in memory is what the resume parser reads back (prepare-time check)."""
    inv = Inventory(
        version=INVENTORY_V2,
        space="main",
        attempt_id=ATTEMPT,
        instance_id=INSTANCE,
        created_at="2025-01-01T00:00:01Z",
        agents=[
            Agent(
                name="w",
                space="main",
                identity=Identity(
                    mode="static",
                    lifecycle_uid=UID,
                    owner="local",
                    credential=FileRef(kind="file", path="/r/.cotal/auth/w.creds", sha256=DIGEST),
                ),
                launch=Launch(
                    connector="pi",
                    cwd="/r",
                    unresolved_launch_option_keys=[],
                    profile_sha256=DIGEST,
                    session_stores=[],
                ),
                dependencies=[Dependency(kind="file", path="/r/x")],
                generation=0,
                started_at="2025-01-01T00:00:00Z",
            )
        ],
    )
    assert parse_resume_args(ATTEMPT, encode_inventory(inv)) == inv


def test_v1_is_upgraded_in_memory() -> None:
    v1_agent = agent_doc()
    del v1_agent["generation"]
    del v1_agent["launch"]["sessionStores"]
    doc = {
        "version": INVENTORY_V1,
        "space": "main",
        "createdAt": "2024-12-31T00:00:00Z",
        "agents": [v1_agent],
    }
    inv = parse_resume_args("resume-7", raw(doc))
    assert inv.version == INVENTORY_V2
    assert inv.attempt_id == "resume-7"
    assert inv.instance_id is None
    assert inv.agents[0].generation == 0
    assert inv.agents[0].launch.session_stores == []
    assert inv.agents[0].launch.session_id == "sess-1"
    # The upgraded inventory is a valid v2 document.
    assert parse_resume_args("resume-7", encode_inventory(inv)) == inv


def test_v1_refuses_fields_only_v2_has() -> None:
    doc = {"version": INVENTORY_V1, "space": "main", "createdAt": "x", "agents": [agent_doc()]}
    err = refused(doc)
    assert (
        "unknown field `sessionStores`" in err.message
        or "unknown field `generation`" in err.message
    )


def test_v1_needs_an_attempt_to_bind_to() -> None:
    v1_agent = agent_doc()
    del v1_agent["generation"]
    del v1_agent["launch"]["sessionStores"]
    doc = {"version": INVENTORY_V1, "space": "main", "createdAt": "x", "agents": [v1_agent]}
    with pytest.raises(Refusal, match="carries no attempt binding"):
        decode_inventory(raw(doc))


@pytest.mark.parametrize(
    ("where", "field"),
    [
        ("launch", "prompt"),
        ("agent", "spawner"),
        ("header", "launch"),
        ("identity", "actorToken"),
    ],
)
def test_unknown_field_is_refused_by_name(where: str, field: str) -> None:
    doc = inventory_doc()
    target = {
        "launch": doc["agents"][0]["launch"],
        "agent": doc["agents"][0],
        "header": doc,
        "identity": doc["agents"][0]["identity"],
    }[where]
    target[field] = "x"
    err = refused(doc)
    assert isinstance(err, DecodeError)
    assert f"unknown field `{field}`" in err.message


def test_prompt_is_never_persisted() -> None:
    assert "prompt" not in Launch.__struct_fields__
    assert (
        "prompt" not in encode_inventory(parse_resume_args(ATTEMPT, raw(inventory_doc()))).decode()
    )


def test_more_than_fifty_seats_refused() -> None:
    agents = [agent_doc(name=f"s{i}", uid=f"{i:026d}") for i in range(51)]
    err = refused(inventory_doc(agents))
    assert err.code == "capacity"
    assert "resume inventory would exceed manager capacity (50)" in err.message
    # Fifty is fine.
    assert len(parse_resume_args(ATTEMPT, raw(inventory_doc(agents[:50]))).agents) == 50


def test_over_512_kib_refused_before_parsing() -> None:
    data = raw(inventory_doc(createdAt="x")) + b" " * INVENTORY_CAP
    err = refused(data)
    assert err.code == "too-large"
    assert f"exceed {INVENTORY_CAP} bytes" in err.message


@pytest.mark.parametrize("uid", ["A" * 26, "a" * 25, "a" * 33, "a" * 25 + "-", "a" * 26 + "\n"])
def test_bad_uid_refused(uid: str) -> None:
    err = refused(inventory_doc([agent_doc(uid=uid)]))
    assert "lifecycleUid" in err.message


def test_duplicate_name_refused() -> None:
    err = refused(inventory_doc([agent_doc(), agent_doc(uid="c" * 26)]))
    assert err.code == "duplicate-name"
    assert '"worker_1"' in err.message


def test_duplicate_uid_refused() -> None:
    err = refused(inventory_doc([agent_doc(), agent_doc(name="other")]))
    assert err.code == "duplicate-uid"


def test_unsupported_version_named() -> None:
    err = refused(inventory_doc(version="cotal-manager-resume/v9"))
    assert err.code == "unsupported-version"
    assert "cotal-manager-resume/v9" in err.message


def test_space_mismatch_with_callers_space() -> None:
    err = refused(inventory_doc(), space="other")
    assert err.code == "wrong-space"
    assert '"main"' in err.message and '"other"' in err.message
    seat_other = agent_doc()
    seat_other["space"] = "elsewhere"
    assert refused(inventory_doc([seat_other])).code == "wrong-space"


def test_bad_attempt_refused() -> None:
    assert refused(inventory_doc(), attempt="bad attempt").code == "bad-attempt"


@pytest.mark.parametrize(
    "launch",
    [
        {"cwd": "relative/path"},
        {"cwd": "/srv/../etc"},
        {"cwd": "/srv/repo/"},
        {"sessionStores": ["/a", "/a"]},
        {"sessionStores": ["store"]},
        {"profileSha256": "ABC"},
        {"connector": "has space"},
    ],
)
def test_launch_constraints(launch: dict[str, Any]) -> None:
    err = refused(inventory_doc([agent_doc(**launch)]))
    assert isinstance(err, DecodeError)


def test_identity_mode_rules() -> None:
    static_without = agent_doc()
    static_without["identity"]["mode"] = "static"
    assert "credential" in refused(inventory_doc([static_without])).message
    open_with = agent_doc()
    open_with["identity"]["credential"] = {"kind": "file", "path": "/c", "sha256": DIGEST}
    assert "open identity carries no credential" in refused(inventory_doc([open_with])).message
    user = agent_doc()
    user["identity"]["mode"] = "user"
    assert "mode" in refused(inventory_doc([user])).message


def test_too_many_dependencies() -> None:
    seat = agent_doc()
    seat["dependencies"] = [{"kind": "file", "path": f"/d/{i}"} for i in range(17)]
    assert "dependencies" in refused(inventory_doc([seat])).message


def test_not_json_or_not_object() -> None:
    assert isinstance(refused(b"{nope"), DecodeError)
    assert isinstance(refused(b"[]"), DecodeError)


def test_reference_rules_are_pure_and_in_order() -> None:
    seat = agent_doc(unresolvedLaunchOptionKeys=["apiKey", "temperature"])
    seat["dependencies"].append(dict(seat["dependencies"][0]))
    inv = parse_resume_args(ATTEMPT, raw(inventory_doc([seat])))
    errors = reference_rule_errors(inv.agents[0])
    assert (
        errors[0]
        == "imperative launch options have no non-secret durable source (apiKey, temperature)"
    )
    assert errors[1] == "retained dependency is declared twice: /srv/profiles/worker.json"
    clean = parse_resume_args(ATTEMPT, raw(inventory_doc())).agents[0]
    assert reference_rule_errors(clean) == []


def test_references_list_credential_as_private() -> None:
    seat = agent_doc()
    seat["identity"] = {
        "mode": "static",
        "lifecycleUid": UID,
        "owner": "local",
        "credential": {"kind": "file", "path": "/r/.cotal/auth/c.creds", "sha256": DIGEST},
    }
    agent = parse_resume_args(ATTEMPT, raw(inventory_doc([seat]))).agents[0]
    refs = references(agent)
    assert refs[0].what == "credential" and refs[0].private and refs[0].sha256 == DIGEST
    assert refs[1].what == "dependency" and not refs[1].private
    assert (
        msg_changed(refs[0]) == "retained credential changed after the cut: /r/.cotal/auth/c.creds"
    )


def test_structs_are_strict_about_types() -> None:
    doc = inventory_doc()
    doc["agents"][0]["generation"] = "2"
    assert "generation" in refused(doc).message
    doc = inventory_doc()
    doc["agents"][0]["generation"] = -1
    assert "generation" in refused(doc).message
    assert msgspec.json.decode(raw(inventory_doc()), type=Inventory).space == "main"


def test_a_seat_named_as_the_operator_is_refused() -> None:
    err = refused(inventory_doc([agent_doc(name="operator")]))
    assert err.code == "reserved-name"
    assert err.message == "seat name 'operator' is the operator's own address on the broker"
    assert "operator_1" in err.cure


def test_an_entry_carries_allow_send_and_an_older_one_names_none() -> None:
    older = parse_resume_args(ATTEMPT, raw(inventory_doc()))
    assert older.agents[0].launch.allow_send == []
    # An entry with no permission is written as before the field existed, byte for byte.
    assert b"allowSend" not in encode_inventory(older)
    allowed = parse_resume_args(ATTEMPT, raw(inventory_doc([agent_doc(allowSend=["b", "c"])])))
    assert allowed.agents[0].launch.allow_send == ["b", "c"]
    assert parse_resume_args(ATTEMPT, encode_inventory(allowed)) == allowed
    assert inventory_digest(allowed) != inventory_digest(older)
    for bad in (["b.c"], ["b c"], [""], ["b"] * 257):
        denied = refused(inventory_doc([agent_doc(allowSend=bad)]))
        assert denied.code == "malformed" and "allowSend" in denied.message
