"""The Codex connector's launch, without running Codex: argv, environment, the seat's own
CODEX_HOME and the config.toml written there, the refusals, and the rollout's cwd carried by a
relocation."""

from __future__ import annotations

import json
import sqlite3
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from connectors.base import LaunchOpts, Relocation
from connectors.codex import KEY_VAR, CodexConnector, relocate_codex_session
from connectors.interpreter import own_python
from protocol.errors import Refusal
from tests.harness import mode, placeholder_binary, seat_opts

SECRET = "sk-fake-unit-0123456789"
THREAD = "01a23c6e-5cb9-7420-b7a7-516b4da27fac"


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    return placeholder_binary(tmp_path, "codex")


def opts(root: Path, binary: Path, **config: object) -> LaunchOpts:
    cfg: dict[str, object] = {
        "binary": str(binary),
        "base_url": "http://127.0.0.1:9/v1",
        "model": "fake-model",
    }
    cfg.update(config)
    return seat_opts(root, "codex", "alice", config=cfg, uid="8u9vbxonnn3krrk4y1hx0schqz49qz4")


def test_the_launch_runs_the_app_server_with_its_own_home_and_the_key_in_env_only(
    root: Path, binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    o = opts(root, binary)
    spec = CodexConnector().build_launch(o)
    home = root / ".cotal/sessions/codex/alice-8u9vbxonnn3krrk4y1hx0schqz49qz4.home"
    assert spec.argv == [str(binary), "app-server", "--listen", "stdio://", "--strict-config"]
    assert spec.env["CODEX_HOME"] == str(home) and mode(home) == 0o700
    assert spec.env[KEY_VAR] == SECRET and "OPENAI_API_KEY" not in spec.env
    assert spec.secret_env == (KEY_VAR,)
    assert [(d.anchor, d.relpath) for d in spec.session_store] == [
        ("workspace-root", ".cotal/sessions/codex/alice-8u9vbxonnn3krrk4y1hx0schqz49qz4.home")
    ]
    assert spec.expected_session_id is None
    config = (home / "config.toml").read_text()
    assert mode(home / "config.toml") == 0o600
    assert config == (
        'model = "fake-model"\n'
        'model_provider = "cotal"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "workspace-write"\n'
        "check_for_update_on_startup = false\n"
        "\n[analytics]\nenabled = false\n"
        "\n[features]\nshell_snapshot = false\n"
        '\n[shell_environment_policy]\nexclude = ["CODEX_PROVIDER_API_KEY"]\n'
        '\n[model_providers.cotal]\nname = "cotal"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'wire_api = "responses"\nenv_key = "CODEX_PROVIDER_API_KEY"\n'
    )
    assert SECRET not in config and not any(SECRET in a for a in spec.argv)
    assert CodexConnector().describe(o) == {
        "permissionMode": "approvals=never,sandbox=workspace-write",
        "credentials": "api_key_env OPENAI_API_KEY",
    }


def test_approvals_sandbox_and_a_key_file_are_seat_options(
    root: Path, binary: Path, tmp_path: Path
) -> None:
    key = tmp_path / "key"
    key.write_text(SECRET + "\n")
    key.chmod(0o600)
    o = opts(root, binary, approval_policy="on-request", sandbox="read-only", api_key_file=str(key))
    spec = CodexConnector().build_launch(o)
    assert spec.env[KEY_VAR] == SECRET
    config = (Path(spec.env["CODEX_HOME"]) / "config.toml").read_text()
    assert 'approval_policy = "on-request"\nsandbox_mode = "read-only"\n' in config
    assert CodexConnector().describe(o)["permissionMode"] == (
        "approvals=on-request,sandbox=read-only"
    )
    key.chmod(0o644)
    with pytest.raises(Refusal) as exc:
        CodexConnector().build_launch(o)
    assert exc.value.code == "not-private"


def test_a_seat_with_a_mesh_dir_gets_the_mesh_tool_as_an_mcp_server(
    root: Path, binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    mesh = root / ".cotal" / "mesh" / "alice"
    spec = CodexConnector().build_launch(replace(opts(root, binary), mesh_dir=mesh))
    config = tomllib.loads((Path(spec.env["CODEX_HOME"]) / "config.toml").read_text())
    python, *args = own_python("connectors.meshtool")
    assert config["mcp_servers"] == {
        "cotal": {"command": python, "args": args, "env": {"COTAL_MESH_DIR": str(mesh)}}
    }
    # Without a mesh socket, no server.
    plain = CodexConnector().build_launch(opts(root, binary))
    assert "mcp_servers" not in tomllib.loads(
        (Path(plain.env["CODEX_HOME"]) / "config.toml").read_text()
    )


@pytest.mark.parametrize(
    ("config", "code"),
    [
        ({"approval_policy": "always"}, "bad-launch"),
        # In the app-server's schema, but refused by Codex 0.169.0 at start.
        ({"approval_policy": "untrusted"}, "bad-launch"),
        ({"sandbox": "none"}, "bad-launch"),
        ({"api_key_env": "NOT_SET_ANYWHERE"}, "no-credentials"),
        ({"extra_env": ["CODEX_HOME"]}, "bad-launch"),
        ({"home": "/x"}, "bad-launch"),
    ],
)
def test_a_bad_config_is_refused_and_changes_nothing(
    root: Path, binary: Path, config: dict[str, object], code: str
) -> None:
    with pytest.raises(Refusal) as exc:
        CodexConnector().build_launch(opts(root, binary, **config))
    assert exc.value.code == code and exc.value.message.startswith("codex connector")
    assert not (root / ".cotal").exists()


def test_a_fork_and_a_thread_without_a_rollout_are_refused(
    root: Path, binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    o = opts(root, binary)
    with pytest.raises(Refusal) as exc:
        CodexConnector().build_launch(replace(o, resume=THREAD))
    assert exc.value.code == "unsupported"
    with pytest.raises(Refusal) as exc:
        CodexConnector().build_launch(replace(o, continue_session=THREAD))
    assert exc.value.code == "no-session"
    assert not (root / ".cotal").exists()


def test_a_continuation_repoints_the_thread_index_at_the_store_it_is_in(
    root: Path, binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    o = opts(root, binary)
    home = root / ".cotal/sessions/codex/alice-8u9vbxonnn3krrk4y1hx0schqz49qz4.home"
    day = home / "sessions/2026/12/03"
    day.mkdir(parents=True)
    rollout = day / f"rollout-2026-12-03T15-03-15-{THREAD}.jsonl"
    rollout.write_text("{}\n")
    with sqlite3.connect(home / "state_5.sqlite") as conn:
        conn.execute("CREATE TABLE threads (id TEXT PRIMARY KEY, rollout_path TEXT, cwd TEXT)")
        conn.execute("INSERT INTO threads VALUES (?, '/old/host/rollout.jsonl', '/old')", (THREAD,))
    conn.close()
    spec = CodexConnector().build_launch(replace(o, continue_session=THREAD))
    assert spec.expected_session_id == THREAD
    with sqlite3.connect(home / "state_5.sqlite") as conn:
        rows = conn.execute("SELECT id, rollout_path, cwd FROM threads").fetchall()
    conn.close()
    assert rows == [(THREAD, str(rollout), str(root))]


def test_a_relocation_carries_the_rollouts_recorded_cwd() -> None:
    reloc = Relocation(
        old_cwd=Path("/a/ws"),
        new_cwd=Path("/b/ws2"),
        old_root=Path("/a/ws"),
        new_root=Path("/b/ws2"),
        pairs=((Path("/a/ws"), Path("/b/ws2")),),
    )
    rel = f"sessions/2026/12/03/rollout-2026-12-03T15-03-15-{THREAD}.jsonl"
    move = relocate_codex_session([rel, "config.toml", "state_5.sqlite"], reloc, THREAD)
    assert list(move.files) == [rel] and move.continuity is None
    head = move.files[rel].head
    assert head is not None
    line = json.dumps(
        {
            "type": "session_meta",
            "payload": {"id": THREAD, "cwd": "/a/ws", "runtime_workspace_roots": ["/a/ws/sub"]},
        }
    ).encode()
    moved = json.loads(head(line))
    assert moved["payload"] == {
        "id": THREAD,
        "cwd": "/b/ws2",
        "runtime_workspace_roots": ["/b/ws2/sub"],
    }
    assert head(b'{"type":"event_msg"}') == b'{"type":"event_msg"}'
