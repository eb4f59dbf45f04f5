"""How the pi connector turns launch options into argv, env and files, and what it refuses.

No pi process runs here: `binary` points at a placeholder file, so these tests need neither
node nor the `.tools` install. The driver's turn judgement is checked on synthetic events.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from connectors.base import LaunchOpts, StoreDecl, TurnOutcome
from connectors.pi import (
    MESH_EXTENSION,
    PiConnector,
    PiDriver,
    judge_turn,
    mint_session_id,
    read_session_header,
)
from protocol.errors import Refusal
from tests.harness import Pipe, mode, placeholder_binary, seat_opts

SECRET = "sk-test-0123456789-do-not-leak"
FLAGS = ["--mode", "rpc", "--offline", "--no-extensions", "--no-skills", "--no-prompt-templates"]


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    return placeholder_binary(tmp_path, "pi")


def opts_for(root: Path, binary: Path, name: str = "alice", **kw: Any) -> LaunchOpts:
    config = {"base_url": "http://127.0.0.1:9/v1", "model": "fake-model", "binary": str(binary)}
    config.update(kw.pop("config", {}))
    return seat_opts(root, "pi", name, config=config, **kw)


def refusal(opts: LaunchOpts) -> Refusal:
    with pytest.raises(Refusal) as exc:
        PiConnector().build_launch(opts)
    assert exc.value.message.startswith("pi connector")
    return exc.value


def test_fresh_launch_seeds_a_session_file_and_opens_it_by_path(root: Path, binary: Path) -> None:
    opts = opts_for(root, binary)
    spec = PiConnector().build_launch(opts)
    base = root / ".cotal" / "sessions" / "pi" / f"alice-{opts.lifecycle_uid}"
    store = Path(f"{base}.store")
    sid = spec.expected_session_id
    assert sid is not None and sid == read_session_header(Path(spec.argv[-1]))["id"]
    (seeded,) = store.iterdir()
    assert seeded.name.endswith(f"_{sid}.jsonl")
    assert spec.argv == [
        str(binary),
        *FLAGS,
        "--session-dir",
        str(store),
        "--provider",
        "cotal",
        "--model",
        "fake-model",
        "--session",
        str(seeded),
    ]
    header = json.loads(seeded.read_text())
    assert header == {
        "type": "session",
        "version": 3,
        "id": sid,
        "timestamp": header["timestamp"],
        "cwd": str(root),
    }
    assert seeded.read_text().count("\n") == 1
    assert spec.cwd == root
    assert spec.session_pointer_path == opts.session_pointer_path
    assert spec.session_store == (
        StoreDecl("workspace-root", f".cotal/sessions/pi/alice-{opts.lifecycle_uid}.store"),
    )
    assert (mode(store), mode(Path(f"{base}.agent")), mode(seeded)) == (0o700, 0o700, 0o600)
    # Directories the connector had to create are private too, ancestors included.
    assert [mode(root / d) for d in (".cotal", ".cotal/sessions", ".cotal/sessions/pi")] == [
        0o700
    ] * 3


def test_minted_ids_are_uuidv7() -> None:
    ids = {mint_session_id() for _ in range(100)}
    assert len(ids) == 100
    for sid in ids:
        assert len(sid) == 36 and sid[14] == "7" and sid[19] in "89ab"


def test_continue_opens_exactly_the_recorded_file(root: Path, binary: Path) -> None:
    connector = PiConnector()
    first = opts_for(root, binary)
    sid = connector.build_launch(first).expected_session_id
    assert sid is not None
    first.session_pointer_path.write_text("{}")  # stands in for the pointer the driver wrote
    spec = connector.build_launch(replace(first, continue_session=sid))
    store = first.session_pointer_path.with_suffix(".store")
    (path,) = store.glob(f"*_{sid}.jsonl")
    assert spec.argv[-2:] == ["--session", str(path)]
    assert spec.argv.count("--session") == 1 and "--fork" not in spec.argv
    assert spec.expected_session_id == sid
    # A continuation keeps the pointer: it names the very session being reopened.
    assert first.session_pointer_path.exists()
    assert len(list(store.iterdir())) == 1


def test_continue_with_unknown_id_names_path_and_id(root: Path, binary: Path) -> None:
    opts = opts_for(root, binary, continue_session="01a2278a-387f-7559-b3e4-684e516dbf2f")
    store = opts.session_pointer_path.with_suffix(".store")
    exc = refusal(opts)
    assert exc.code == "no-session"
    assert f"in the seat's store {store} " in exc.message
    assert "*_01a2278a-387f-7559-b3e4-684e516dbf2f.jsonl" in exc.message
    assert "restore the seat's session store" in exc.cure
    assert not (root / ".cotal").exists()


def test_continue_refuses_an_id_prefix(root: Path, binary: Path) -> None:
    exc = refusal(opts_for(root, binary, continue_session="01a2278a"))
    assert exc.code == "bad-session"
    assert "continueSession '01a2278a' is not a full pi session id" in exc.message
    assert "pass the full id exactly as recorded" in exc.cure


def test_continue_refuses_a_session_recorded_in_another_cwd(
    root: Path, binary: Path, tmp_path: Path
) -> None:
    connector = PiConnector()
    other = tmp_path / "elsewhere"
    other.mkdir()
    first = replace(opts_for(root, binary), cwd=other)
    sid = connector.build_launch(first).expected_session_id
    moved = refusal(replace(first, cwd=root, continue_session=sid))
    assert moved.code == "session-cwd-mismatch"
    assert f"session {sid} was recorded in cwd {other}, but the seat's cwd is {root}" in (
        moved.message
    )
    assert moved.cure == f"launch the seat with cwd {other}"
    other.rmdir()
    gone = refusal(replace(first, continue_session=sid))
    assert gone.code == "session-cwd-missing"
    assert f"session {sid} was recorded in cwd '{other}'" in gone.message


def test_fork_by_id_finds_another_seats_store_and_drops_a_stale_pointer(
    root: Path, binary: Path
) -> None:
    connector = PiConnector()
    source = opts_for(root, binary, name="alice")
    source_id = connector.build_launch(source).expected_session_id
    assert source_id is not None
    (source_file,) = source.session_pointer_path.with_suffix(".store").iterdir()
    fork = opts_for(root, binary, name="carol", resume=source_id)
    fork.session_pointer_path.write_text("stale")
    spec = connector.build_launch(fork)
    assert spec.argv[-2:] == ["--fork", str(source_file)]
    assert "--session" not in spec.argv
    assert spec.expected_session_id is None
    assert not fork.session_pointer_path.exists()
    # By absolute path works too, and is passed through unchanged.
    assert connector.build_launch(replace(fork, resume=str(source_file))).argv[-2:] == [
        "--fork",
        str(source_file),
    ]


def test_fork_of_a_missing_session_is_refused(root: Path, binary: Path) -> None:
    sid = "01a2278a-387f-7559-b3e4-684e516dbf2f"
    opts = opts_for(root, binary, resume=sid)
    exc = refusal(opts)
    assert exc.code == "no-session"
    assert f"in the pi stores under {opts.session_pointer_path.parent} " in exc.message
    assert f"*_{sid}.jsonl" in exc.message


@pytest.mark.parametrize(
    ("config", "code", "names"),
    [
        ({"home": "/x", "launch_options": {"a": 1}}, "bad-launch", "home, launch_options"),
        ({"base_url": None}, "bad-launch", "base_url"),
        ({"base_url": "http://user:pw@127.0.0.1:9/v1"}, "bad-launch", "credentials"),
        ({"api_key_env": "COTAL_TEST_PI_UNSET_KEY"}, "bad-launch", "COTAL_TEST_PI_UNSET_KEY"),
        ({"api_key_env": "!cat /etc/key"}, "bad-launch", "'!cat /etc/key'"),
        ({"binary": "pi"}, "bad-launch", "absolute path, got 'pi'"),
        ({"model": None}, "bad-launch", "model id"),
    ],
)
def test_config_refusals(
    root: Path,
    binary: Path,
    config: dict[str, Any],
    code: str,
    names: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COTAL_TEST_PI_UNSET_KEY", raising=False)
    opts = opts_for(root, binary)
    merged = {k: v for k, v in {**opts.config, **config}.items() if v is not None}
    exc = refusal(replace(opts, config=merged))
    assert exc.code == code and names in exc.message
    assert not (root / ".cotal").exists()


def test_key_reaches_pi_only_by_name(
    root: Path, binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COTAL_TEST_PI_KEY", SECRET)
    opts = opts_for(
        root, binary, config={"api_key_env": "COTAL_TEST_PI_KEY", "extra_env": ["COTAL_TEST_EXTRA"]}
    )
    monkeypatch.setenv("COTAL_TEST_EXTRA", "visible")
    spec = PiConnector().build_launch(opts)
    agent = opts.session_pointer_path.with_suffix(".agent")

    assert not any(SECRET in a for a in spec.argv)
    # pi resolves the key from its environment at request time: the one place the value is.
    assert [k for k, v in spec.env.items() if SECRET in v] == ["COTAL_TEST_PI_KEY"]
    assert spec.env["COTAL_TEST_EXTRA"] == "visible"
    for path in root.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(), path
    models = json.loads((agent / "models.json").read_text())
    assert models["providers"]["cotal"]["apiKey"] == "COTAL_TEST_PI_KEY"
    assert models["providers"]["cotal"]["baseUrl"] == "http://127.0.0.1:9/v1"
    assert json.loads((agent / "settings.json").read_text())["retry"] == {"enabled": False}
    assert (mode(agent / "models.json"), mode(agent / "settings.json")) == (0o600, 0o600)
    assert {k: spec.env[k] for k in spec.env if k.startswith("PI_")} == {
        "PI_CODING_AGENT_DIR": str(agent),
        "PI_OFFLINE": "1",
        "PI_SKIP_VERSION_CHECK": "1",
        "PI_TELEMETRY": "0",
    }
    assert spec.env["COTAL_SESSION_STATE"] == str(opts.session_pointer_path)


def test_js_entry_point_runs_under_an_explicit_node(root: Path, tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH")
    cli = tmp_path / "cli.js"
    cli.write_text("// placeholder\n")
    spec = PiConnector().build_launch(opts_for(root, cli))
    assert spec.argv[:2] == [node, str(cli)]


def test_model_option_wins_over_config(root: Path, binary: Path) -> None:
    spec = PiConnector().build_launch(opts_for(root, binary, model="other-model"))
    assert spec.argv[spec.argv.index("--model") + 1] == "other-model"


# -- the driver's judgement of a finished turn ----------------------------------------------------


def _end(sent: str, *assistants: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "agent_end",
        "messages": [{"role": "user", "content": [{"type": "text", "text": sent}]}, *assistants],
    }


def _assistant(stop: str, *parts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": list(parts), "stopReason": stop, **extra}


TEXT = {"type": "text", "text": "done."}


@pytest.mark.parametrize(
    ("event", "outcome"),
    [
        (_end("hi", _assistant("stop", TEXT)), TurnOutcome("ok", "done.")),
        (
            _end("hi", _assistant("length", TEXT)),
            TurnOutcome("ok", "done.", "reply truncated at the output limit (stopReason length)"),
        ),
        (
            _end(
                "hi",
                _assistant(
                    "toolUse", {"type": "toolCall", "id": "c", "name": "bash", "arguments": {}}
                ),
                {"role": "toolResult", "content": []},
                _assistant("stop", TEXT),
            ),
            TurnOutcome("ok", "done."),
        ),
        (
            _end("hi", _assistant("error", errorMessage="500 boom")),
            TurnOutcome("error", detail="500 boom"),
        ),
        (
            _end("hi", _assistant("aborted", errorMessage="Request was aborted")),
            TurnOutcome("aborted", detail="Request was aborted"),
        ),
        (
            _end("hi", _assistant("stop")),
            TurnOutcome("unknown", detail="the model produced no output"),
        ),
        (
            _end("hi", _assistant("stop", {"type": "text", "text": "  "})),
            TurnOutcome("unknown", detail="the model produced no output"),
        ),
        (
            _end("hi", _assistant("weird", TEXT)),
            TurnOutcome("unknown", detail="pi ended the turn with stopReason 'weird'"),
        ),
        (_end("hi"), TurnOutcome("unknown", detail="pi ended the turn with no assistant message")),
        (
            _end("someone else's prompt", _assistant("stop", TEXT)),
            TurnOutcome("unknown", detail="agent_end does not carry the prompt that was sent"),
        ),
    ],
)
def test_judge_turn(event: dict[str, Any], outcome: TurnOutcome) -> None:
    assert judge_turn("hi", event) == outcome


@pytest.mark.anyio
async def test_driver_turn_ends_unknown_when_pi_exits_mid_turn() -> None:
    """A scripted pi on memory streams: it accepts the prompt, starts the agent, then dies."""
    stdin, stdout = Pipe(), Pipe()
    driver = PiDriver(stdin, stdout)

    async def fake_pi() -> None:
        command = json.loads(await stdin.recv_end.receive())
        assert command == {"id": "cotal-prompt-1", "type": "prompt", "message": "hello"}
        await stdout.send(
            b'{"id":"cotal-prompt-1","type":"response","command":"prompt","success":true}\n{"type":"agent_st'
        )
        await stdout.send(b'art"}\n')
        await stdout.aclose()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(driver.run)
            tg.start_soon(fake_pi)
            outcome = await driver.prompt("hello", message_id="m1")
    assert outcome == TurnOutcome(
        "unknown", detail="turn m1 did not end: pi exited (its stdout closed)"
    )
    assert await driver.prompt("again", message_id="m2") == TurnOutcome(
        "unknown", detail="not delivered: pi exited (its stdout closed)"
    )


@pytest.mark.anyio
async def test_driver_reports_a_refused_prompt_as_error() -> None:
    stdin, stdout = Pipe(), Pipe()
    driver = PiDriver(stdin, stdout)

    async def fake_pi() -> None:
        await stdin.recv_end.receive()
        await stdout.send(
            b'{"id":"cotal-prompt-1","type":"response","command":"prompt","success":false,'
            b'"error":"Agent is already processing."}\n'
        )

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(driver.run)
            tg.start_soon(fake_pi)
            outcome = await driver.prompt("hello", message_id="m1")
            tg.cancel_scope.cancel()
    assert outcome == TurnOutcome(
        "error", detail="pi refused prompt m1: Agent is already processing."
    )


def test_a_seat_with_a_mesh_socket_loads_only_cotals_mesh_extension(
    root: Path, binary: Path
) -> None:
    mesh_dir = root / ".cotal" / "seat-mesh" / "alice-x"
    spec = PiConnector().build_launch(opts_for(root, binary, mesh_dir=mesh_dir))
    at = spec.argv.index("--no-extensions")
    assert spec.argv[at : at + 3] == ["--no-extensions", "--extension", str(MESH_EXTENSION)]
    assert spec.argv.count("--extension") == 1 and MESH_EXTENSION.is_file()
    assert spec.env["COTAL_MESH_DIR"] == str(mesh_dir)
    # Outside a manager (no socket) nothing is loaded at all.
    bare = PiConnector().build_launch(opts_for(root, binary, name="bob"))
    assert "--extension" not in bare.argv and "COTAL_MESH_DIR" not in bare.env
