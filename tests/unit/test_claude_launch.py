"""How the Claude Code connector turns launch options into argv, env and files, what it
refuses, and how its driver judges turns and guards the pointer.

No Claude Code process runs here: `binary` points at a placeholder executable, transcripts are
written by hand in the layout Claude Code 2.1.x uses (`projects/<encoded cwd>/<id>.jsonl`), and
the driver talks to a scripted stand-in over in-memory streams.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from connectors.base import LaunchOpts, StoreDecl, TurnOutcome
from connectors.claude_code import (
    DEFAULT_PERMISSION_MODE,
    PERMISSION_MODES,
    ClaudeCodeConnector,
    ClaudeDriver,
    judge_result,
)
from protocol.errors import Refusal
from tests.harness import Pipe, mode, placeholder_binary, seat_opts

SECRET = "sk-ant-test-0123456789-do-not-leak"
KEY_VAR = "COTAL_UNIT_CLAUDE_KEY"
FLAGS = [
    "-p",
    "--input-format",
    "stream-json",
    "--output-format",
    "stream-json",
    "--verbose",
    "--replay-user-messages",
    "--disable-slash-commands",
    "--permission-mode",
    "bypassPermissions",
    "--strict-mcp-config",
]


@pytest.fixture
def root(root: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(KEY_VAR, SECRET)
    # The operator's own Claude login must not be what a test measures.
    for var in ("ANTHROPIC_API_KEY", "CLAUDE_CONFIG_DIR", "CLAUDE_CODE_OAUTH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return root


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    return placeholder_binary(tmp_path, "claude")


def opts_for(root: Path, binary: Path, name: str = "alice", **kw: Any) -> LaunchOpts:
    config = {
        "base_url": "http://127.0.0.1:9",
        "model": "claude-fake-1",
        "api_key_env": KEY_VAR,
        "binary": str(binary),
    }
    config.update(kw.pop("config", {}))
    return seat_opts(root, "claude", name, config=config, **kw)


def config_dir(opts: LaunchOpts) -> Path:
    return opts.session_pointer_path.with_suffix(".config")


def refusal(opts: LaunchOpts) -> Refusal:
    with pytest.raises(Refusal) as exc:
        ClaudeCodeConnector().build_launch(opts)
    assert exc.value.message.startswith("claude connector")
    return exc.value


def write_transcript(
    config: Path, session_id: str, cwd: Path, *, phrase: str = "oak-river-9"
) -> Path:
    """A two-turn transcript as Claude Code 2.1.x files it (the fields the connector reads)."""
    project = config / "projects" / re.sub(r"[^A-Za-z0-9]", "-", os.path.realpath(cwd))
    project.mkdir(parents=True, exist_ok=True)
    path = project / f"{session_id}.jsonl"
    entries = [
        {"type": "queue-operation", "operation": "enqueue"},
        {
            "type": "user",
            "uuid": str(uuid.uuid4()),
            "parentUuid": None,
            "sessionId": session_id,
            "cwd": str(cwd),
            "message": {"role": "user", "content": f"remember the phrase {phrase}"},
        },
        {
            "type": "assistant",
            "uuid": str(uuid.uuid4()),
            "sessionId": session_id,
            "cwd": str(cwd),
            "message": {
                "role": "assistant",
                "content": [{"type": "text", "text": f"Noted: {phrase}."}],
            },
        },
    ]
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


def no_secret_anywhere(root: Path, argv: list[str]) -> None:
    assert not any(SECRET in a for a in argv)
    for path in root.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"the key leaked into {path}"


# -- fresh ----------------------------------------------------------------------------------------


def test_fresh_launch_mints_the_session_id_and_isolates_the_config(
    root: Path, binary: Path
) -> None:
    opts = opts_for(root, binary, prompt="  remember the phrase oak-river-9  ")
    for d in (".cotal", ".cotal/sessions", ".cotal/sessions/claude"):
        (root / d).mkdir(mode=0o755)
    opts.session_pointer_path.write_text("{}")  # a stale pointer of an earlier launch
    spec = ClaudeCodeConnector().build_launch(opts)
    sid = spec.expected_session_id
    assert sid is not None and uuid.UUID(sid).version == 4
    assert spec.argv == [str(binary), *FLAGS, "--model", "claude-fake-1", "--session-id", sid]
    config = config_dir(opts)
    assert spec.env["CLAUDE_CONFIG_DIR"] == str(config)
    assert spec.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"
    assert spec.env["ANTHROPIC_API_KEY"] == SECRET
    assert KEY_VAR not in spec.env  # only under the name Claude Code reads
    assert spec.secret_env == ("ANTHROPIC_API_KEY",)
    for var in (
        "DISABLE_TELEMETRY",
        "DISABLE_ERROR_REPORTING",
        "DISABLE_AUTOUPDATER",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    ):
        assert spec.env[var] == "1"
    assert spec.env.get("IS_SANDBOX") == ("1" if os.geteuid() == 0 else None)
    assert spec.env["COTAL_SESSION_STATE"] == str(opts.session_pointer_path)
    assert spec.cwd == root
    assert spec.session_pointer_path == opts.session_pointer_path
    assert spec.session_store == (
        StoreDecl("workspace-root", f".cotal/sessions/claude/alice-{opts.lifecycle_uid}.config"),
    )
    assert spec.initial_prompt == "remember the phrase oak-river-9"
    assert not opts.session_pointer_path.exists()
    # Directories the seat owns are made private; the workspace's own ancestors are left alone.
    assert (mode(opts.session_pointer_path.parent), mode(config)) == (0o700, 0o700)
    assert json.loads((config / "settings.json").read_text()) == {"cleanupPeriodDays": 36500}
    assert json.loads((config / "cotal-launch.json").read_text()) == {
        "version": 1,
        "sessionId": sid,
        "origin": "fresh",
    }
    assert (mode(config / "settings.json"), mode(config / "cotal-launch.json")) == (0o600, 0o600)
    no_secret_anywhere(root, spec.argv)


def test_directories_created_for_the_seat_are_private(root: Path, binary: Path) -> None:
    ClaudeCodeConnector().build_launch(opts_for(root, binary))
    assert [mode(root / d) for d in (".cotal", ".cotal/sessions", ".cotal/sessions/claude")] == [
        0o700
    ] * 3


def test_without_base_url_or_model_nothing_is_set(root: Path, binary: Path) -> None:
    opts = opts_for(root, binary)
    opts = replace(opts, config={"api_key_env": KEY_VAR, "binary": str(binary)})
    spec = ClaudeCodeConnector().build_launch(opts)
    assert "--model" not in spec.argv and "ANTHROPIC_BASE_URL" not in spec.env


def test_default_key_variable_is_anthropic_api_key(
    root: Path, binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    opts = replace(opts_for(root, binary), config={"binary": str(binary)})
    assert ClaudeCodeConnector().build_launch(opts).env["ANTHROPIC_API_KEY"] == SECRET
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    exc = refusal(opts)
    assert exc.code == "no-credentials"
    assert "ANTHROPIC_API_KEY is not set" in exc.message and "no Claude login" in exc.message
    assert "agents.claude.api_key_file" in exc.cure and "claude login" in exc.cure


def test_extra_env_passes_named_variables_only(
    root: Path, binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "0")
    monkeypatch.setenv("SOMETHING_ELSE", "x")
    spec = ClaudeCodeConnector().build_launch(
        opts_for(root, binary, config={"extra_env": ["CLAUDE_CODE_MAX_RETRIES"]})
    )
    assert spec.env["CLAUDE_CODE_MAX_RETRIES"] == "0" and "SOMETHING_ELSE" not in spec.env


# -- continue -------------------------------------------------------------------------------------


def test_continue_resumes_exactly_the_recorded_session(root: Path, binary: Path) -> None:
    connector = ClaudeCodeConnector()
    first = opts_for(root, binary)
    sid = connector.build_launch(first).expected_session_id
    assert sid is not None
    write_transcript(config_dir(first), sid, root)
    first.session_pointer_path.write_text("{}")  # stands in for the pointer the driver wrote
    spec = connector.build_launch(replace(first, continue_session=sid))
    assert spec.argv == [str(binary), *FLAGS, "--model", "claude-fake-1", "--resume", sid]
    assert spec.expected_session_id == sid
    # A continuation keeps the pointer and the launch record: both name the session reopened.
    assert first.session_pointer_path.exists()
    assert json.loads((config_dir(first) / "cotal-launch.json").read_text())["sessionId"] == sid
    no_secret_anywhere(root, spec.argv)


def test_continue_before_the_first_turn_redoes_the_fresh_start(root: Path, binary: Path) -> None:
    connector = ClaudeCodeConnector()
    first = opts_for(root, binary)
    sid = connector.build_launch(first).expected_session_id
    assert sid is not None
    spec = connector.build_launch(replace(first, continue_session=sid))
    assert spec.argv[-2:] == ["--session-id", sid] and "--resume" not in spec.argv
    assert spec.expected_session_id == sid


def test_continue_refuses_a_session_whose_transcript_went_missing(root: Path, binary: Path) -> None:
    connector = ClaudeCodeConnector()
    first = opts_for(root, binary)
    sid = connector.build_launch(first).expected_session_id
    record = config_dir(first) / "cotal-launch.json"
    # What the driver records once it has seen the session's transcript.
    record.write_text(json.dumps({**json.loads(record.read_text()), "materialized": True}))
    exc = refusal(replace(first, continue_session=sid))
    assert exc.code == "no-session"
    assert f"the transcript of session {sid} is missing" in exc.message
    assert f"store {config_dir(first)} " in exc.message and "the session had one" in exc.message


def test_continue_with_unknown_id_names_store_and_id(root: Path, binary: Path) -> None:
    sid = "0aba288b-a1da-4a2a-8a69-b7710d665ddc"
    opts = opts_for(root, binary, continue_session=sid)
    exc = refusal(opts)
    assert exc.code == "no-session"
    assert f"no transcript for session {sid} in the seat's store {config_dir(opts)} " in (
        exc.message
    )
    assert not (root / ".cotal").exists()


def test_continue_refuses_a_partial_id(root: Path, binary: Path) -> None:
    exc = refusal(opts_for(root, binary, continue_session="0aba288b"))
    assert exc.code == "bad-session" and "continueSession '0aba288b'" in exc.message


def test_continue_refuses_a_session_recorded_in_another_cwd(
    root: Path, binary: Path, tmp_path: Path
) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    opts = opts_for(root, binary)
    sid = str(uuid.uuid4())
    write_transcript(config_dir(opts), sid, other)
    exc = refusal(replace(opts, continue_session=sid))
    assert exc.code == "session-cwd-mismatch"
    assert f"session {sid} was recorded in cwd {other}, but the seat's cwd is {root}" in (
        exc.message
    )
    assert exc.cure == f"launch the seat with cwd {other}"


def test_continue_refuses_a_session_a_live_process_holds(root: Path, binary: Path) -> None:
    opts = opts_for(root, binary)
    sid = str(uuid.uuid4())
    config = config_dir(opts)
    write_transcript(config, sid, root)
    with open(f"/proc/{os.getpid()}/stat", "rb") as f:
        data = f.read()
    start = data[data.rindex(b")") + 2 :].split()[19].decode()
    (config / "sessions").mkdir()
    registry = config / "sessions" / f"{os.getpid()}.json"
    registry.write_text(json.dumps({"pid": os.getpid(), "sessionId": sid, "procStart": start}))
    exc = refusal(replace(opts, continue_session=sid))
    assert exc.code == "session-busy"
    assert f"session {sid} is open in live process {os.getpid()}" in exc.message
    assert f"kill {os.getpid()}" in exc.cure
    # A registry entry left by a process that is gone (or a recycled pid) does not block.
    registry.write_text(json.dumps({"pid": os.getpid(), "sessionId": sid, "procStart": "1"}))
    assert ClaudeCodeConnector().build_launch(replace(opts, continue_session=sid)).argv[-2:] == [
        "--resume",
        sid,
    ]


# -- fork -----------------------------------------------------------------------------------------


def test_resume_forks_from_a_frozen_copy_of_another_seats_transcript(
    root: Path, binary: Path
) -> None:
    connector = ClaudeCodeConnector()
    source_opts = opts_for(root, binary, name="alice")
    source_id = str(uuid.uuid4())
    source = write_transcript(config_dir(source_opts), source_id, root)
    # A line still being appended by the source seat is not copied.
    with open(source, "ab") as f:
        f.write(b'{"type":"assistant","partial')
    before = source.read_bytes()

    opts = opts_for(root, binary, name="bob", resume=source_id)
    spec = connector.build_launch(opts)
    fork_id = spec.expected_session_id
    assert fork_id is not None and fork_id != source_id
    config = config_dir(opts)
    snapshot = config / "cotal-forks" / fork_id / f"{source_id}.jsonl"
    assert spec.argv == [
        str(binary),
        *FLAGS,
        "--model",
        "claude-fake-1",
        "--resume",
        str(snapshot),
        "--fork-session",
        "--session-id",
        fork_id,
    ]
    assert snapshot.read_bytes() == before[: before.rindex(b"\n") + 1]
    assert source.read_bytes() == before
    assert (mode(snapshot), mode(snapshot.parent), mode(snapshot.parent.parent)) == (
        0o600,
        0o700,
        0o700,
    )
    assert json.loads((config / "cotal-launch.json").read_text()) == {
        "version": 1,
        "sessionId": fork_id,
        "origin": "fork",
        "forkOf": source_id,
        "snapshot": f"cotal-forks/{fork_id}/{source_id}.jsonl",
    }
    # Killed before its first turn, the fork is redone from the same copy under the same id.
    again = connector.build_launch(replace(opts, resume=None, continue_session=fork_id))
    assert again.argv[-5:] == ["--resume", str(snapshot), "--fork-session", "--session-id", fork_id]
    assert again.expected_session_id == fork_id
    no_secret_anywhere(root, spec.argv + again.argv)


def test_resume_by_absolute_path(root: Path, binary: Path, tmp_path: Path) -> None:
    source_id = str(uuid.uuid4())
    source = write_transcript(tmp_path / "operator-claude", source_id, root)
    opts = opts_for(root, binary, resume=str(source))
    spec = ClaudeCodeConnector().build_launch(opts)
    snapshot = (
        config_dir(opts) / "cotal-forks" / str(spec.expected_session_id) / f"{source_id}.jsonl"
    )
    assert spec.argv[-5:] == [
        "--resume",
        str(snapshot),
        "--fork-session",
        "--session-id",
        spec.expected_session_id,
    ]
    assert snapshot.read_bytes() == source.read_bytes()


def test_resume_refusals(root: Path, binary: Path, tmp_path: Path) -> None:
    unknown = "0aba288b-a1da-4a2a-8a69-b7710d665ddc"
    opts = opts_for(root, binary, resume=unknown)
    missing = refusal(opts)
    assert missing.code == "no-session"
    assert f"no transcript for session {unknown} in the Claude seats under " in missing.message
    assert str(opts.session_pointer_path.parent) in missing.message
    write_transcript(config_dir(opts_for(root, binary, name="a1")), unknown, root)
    write_transcript(config_dir(opts_for(root, binary, name="a2")), unknown, root)
    twice = refusal(opts)
    assert twice.code == "ambiguous-session"
    assert f"session id {unknown} names 2 transcripts: " in twice.message
    not_a_transcript = tmp_path / "notes.txt"
    not_a_transcript.write_text("x")
    wrong = refusal(opts_for(root, binary, resume=str(not_a_transcript)))
    assert wrong.code == "bad-session"
    assert f"{not_a_transcript} is not a Claude Code transcript" in wrong.message


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "names"),
    [
        ({"config": {"provider": "x", "home": "/srv/claude"}}, "home, provider"),
        ({"config": {"base_url": "http://user:pw@127.0.0.1:9"}}, "credentials"),
        (
            {"config": {"extra_env": ["CLAUDE_CODE_OAUTH_TOKEN"]}},
            "CLAUDE_CODE_OAUTH_TOKEN, which the connector sets itself",
        ),
        ({"config": {"permission_mode": "yolo"}}, "permission_mode 'yolo' is not one"),
        ({"config": {"permission_mode": "BypassPermissions"}}, "'BypassPermissions'"),
        ({"config": {"api_key_file": "key.txt"}}, "api_key_file must be an absolute path"),
        (
            {"config": {"api_key_file": "/etc/cotal/claude.key"}},
            "api_key_env and api_key_file both name the key",
        ),
        (
            {"config": {"extra_env": ["CLAUDE_CONFIG_DIR", "ANTHROPIC_BASE_URL"]}},
            "ANTHROPIC_BASE_URL, CLAUDE_CONFIG_DIR",
        ),
        ({"config": {"binary": "claude"}}, "absolute path, got 'claude'"),
        ({"model": "--dangerously-skip-permissions"}, "'--dangerously-skip-permissions'"),
    ],
)
def test_config_refusals_name_the_problem_and_change_nothing(
    root: Path, binary: Path, kw: dict[str, Any], names: str
) -> None:
    exc = refusal(opts_for(root, binary, **kw))
    assert exc.code == "bad-launch" and names in exc.message and exc.cure
    assert not (root / ".cotal").exists()


# -- permission mode ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode_name", list(PERMISSION_MODES))
def test_permission_mode_is_a_seat_option(root: Path, binary: Path, mode_name: str) -> None:
    opts = opts_for(root, binary, config={"permission_mode": mode_name})
    spec = ClaudeCodeConnector().build_launch(opts)
    at = spec.argv.index("--permission-mode")
    assert spec.argv[at + 1] == mode_name and spec.argv.count("--permission-mode") == 1
    # Claude Code refuses only bypassPermissions as root; no other mode gets the switch.
    sandbox = mode_name == "bypassPermissions" and os.geteuid() == 0
    assert spec.env.get("IS_SANDBOX") == ("1" if sandbox else None)
    assert ClaudeCodeConnector().describe(opts)["permissionMode"] == mode_name


def test_permission_mode_defaults_to_bypass(root: Path, binary: Path) -> None:
    opts = opts_for(root, binary)
    assert DEFAULT_PERMISSION_MODE == "bypassPermissions"
    assert ClaudeCodeConnector().build_launch(opts).argv[1 : len(FLAGS) + 1] == FLAGS
    assert ClaudeCodeConnector().describe(opts) == {
        "permissionMode": "bypassPermissions",
        "credentials": f"api_key_env {KEY_VAR}",
    }


# -- credentials ----------------------------------------------------------------------------------

LOGIN_TOKEN = "sk-ant-oat01-login-token-do-not-leak"


def write_login(config: Path, *, token: str = LOGIN_TOKEN, expires_in_s: float = 3600) -> Path:
    """Credentials in the shape `claude login` leaves them (`claudeAiOauth`, expiry in ms)."""
    config.mkdir(parents=True, exist_ok=True)
    path = config / ".credentials.json"
    body = {
        "claudeAiOauth": {
            "accessToken": token,
            "refreshToken": "sk-ant-ort01-refresh-do-not-leak",
            "expiresAt": int((time.time() + expires_in_s) * 1000),
            "scopes": ["user:inference", "user:profile"],
            "subscriptionType": "max",
        }
    }
    path.write_text(json.dumps(body))
    path.chmod(0o600)
    return path


def no_bytes_of(root: Path, secrets: list[str], argv: list[str]) -> None:
    for secret in secrets:
        assert not any(secret in a for a in argv)
        for path in root.rglob("*"):
            if path.is_symlink():
                raise AssertionError(f"{path} is a symlink: a checkpoint refuses the store")
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), f"{secret} leaked into {path}"


def test_key_file_is_read_at_every_launch(root: Path, binary: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "claude.key"
    key_file.write_text("sk-ant-first-key\n")
    key_file.chmod(0o600)
    config = {"api_key_env": None, "api_key_file": str(key_file)}
    opts = opts_for(root, binary, config=config)
    opts = replace(opts, config={k: v for k, v in opts.config.items() if v is not None})
    first = ClaudeCodeConnector().build_launch(opts)
    assert first.env["ANTHROPIC_API_KEY"] == "sk-ant-first-key"
    assert first.secret_env == ("ANTHROPIC_API_KEY",) and KEY_VAR not in first.env
    key_file.write_text("sk-ant-second-key\n")
    second = ClaudeCodeConnector().build_launch(replace(opts, name="bob"))
    assert second.env["ANTHROPIC_API_KEY"] == "sk-ant-second-key"
    assert ClaudeCodeConnector().describe(opts)["credentials"] == f"api_key_file {key_file}"
    no_bytes_of(root, ["sk-ant-first-key", "sk-ant-second-key"], first.argv + second.argv)


def key_file_opts(root: Path, binary: Path, key_file: Path) -> LaunchOpts:
    opts = opts_for(root, binary)
    config = {k: v for k, v in opts.config.items() if k != "api_key_env"}
    return replace(opts, config={**config, "api_key_file": str(key_file)})


@pytest.mark.parametrize(
    ("setup", "code", "words"),
    [
        ("missing", "no-credentials", "does not exist"),
        ("symlink", "bad-credentials", "is a symlink"),
        ("0644", "bad-credentials", "has mode 0644; it must be 0600 or stricter"),
        ("empty", "bad-credentials", "does not hold one key"),
        ("two words", "bad-credentials", "does not hold one key"),
        ("directory", "bad-credentials", "is not a regular file"),
    ],
)
def test_key_file_refusals(
    root: Path, binary: Path, tmp_path: Path, setup: str, code: str, words: str
) -> None:
    key_file = tmp_path / "claude.key"
    real = tmp_path / "real.key"
    real.write_text("sk-ant-real\n")
    real.chmod(0o600)
    if setup == "symlink":
        key_file.symlink_to(real)
    elif setup == "directory":
        key_file.mkdir(mode=0o700)
    elif setup != "missing":
        key_file.write_text({"0644": "sk-ant-x", "empty": "\n", "two words": "sk-ant a"}[setup])
        key_file.chmod(0o644 if setup == "0644" else 0o600)
    exc = refusal(key_file_opts(root, binary, key_file))
    assert (exc.code, exc.cure != "") == (code, True)
    assert f"api_key_file {key_file} {words}" in exc.message
    assert not (root / ".cotal").exists()


def test_login_is_used_when_no_key_is_set(
    root: Path, binary: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_VAR)
    login = write_login(isolated_home / ".claude")
    before = login.read_bytes()
    opts = opts_for(root, binary)
    opts = replace(opts, config={k: v for k, v in opts.config.items() if k != "api_key_env"})
    spec = ClaudeCodeConnector().build_launch(opts)
    assert spec.env["CLAUDE_CODE_OAUTH_TOKEN"] == LOGIN_TOKEN
    assert "ANTHROPIC_API_KEY" not in spec.env and "ANTHROPIC_AUTH_TOKEN" not in spec.env
    assert spec.secret_env == ("CLAUDE_CODE_OAUTH_TOKEN",)
    # The seat's config dir is its own: the login is neither linked nor copied into it.
    assert spec.env["CLAUDE_CONFIG_DIR"] == str(config_dir(opts))
    assert not os.path.lexists(config_dir(opts) / ".credentials.json")
    assert login.read_bytes() == before
    assert ClaudeCodeConnector().describe(opts)["credentials"] == f"login {login}"
    no_bytes_of(root, [LOGIN_TOKEN, "sk-ant-ort01-refresh-do-not-leak"], spec.argv)

    # The manager's own CLAUDE_CONFIG_DIR is where `claude login` wrote, when it is set.
    other = write_login(isolated_home / "elsewhere", token="sk-ant-oat01-elsewhere")
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(other.parent))
    spec = ClaudeCodeConnector().build_launch(replace(opts, name="bob"))
    assert spec.env["CLAUDE_CODE_OAUTH_TOKEN"] == "sk-ant-oat01-elsewhere"
    assert spec.env["CLAUDE_CONFIG_DIR"] != str(other.parent)

    # A token in the manager's environment comes before the login file; a key before both.
    monkeypatch.setenv("CLAUDE_CODE_OAUTH_TOKEN", "sk-ant-oat01-from-env")
    spec = ClaudeCodeConnector().build_launch(replace(opts, name="carol"))
    assert spec.env["CLAUDE_CODE_OAUTH_TOKEN"] == "sk-ant-oat01-from-env"
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    spec = ClaudeCodeConnector().build_launch(replace(opts, name="dave"))
    assert spec.env["ANTHROPIC_API_KEY"] == SECRET and "CLAUDE_CODE_OAUTH_TOKEN" not in spec.env


def test_login_refusals(
    root: Path, binary: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = opts_for(root, binary)
    no_env = replace(opts, config={k: v for k, v in opts.config.items() if k != "api_key_env"})
    login = write_login(isolated_home / ".claude", expires_in_s=-60)
    expired = refusal(no_env)
    assert expired.code == "no-credentials"
    assert f"the Claude login in {login} expired at " in expired.message
    assert "run `claude` once" in expired.cure

    login.write_text(json.dumps({"mcpOAuth": {}}))
    assert "holds no Claude login" in refusal(no_env).message

    write_login(isolated_home / ".claude")
    login.chmod(0o644)
    loose = refusal(no_env)
    assert loose.code == "bad-credentials" and "has mode 0644" in loose.message

    # A key the operator named but did not set is refused, not replaced by the login.
    login.chmod(0o600)
    monkeypatch.delenv(KEY_VAR)
    named = refusal(opts)
    assert named.code == "no-credentials"
    assert f"api_key_env names {KEY_VAR}, which is not set" in named.message
    assert not (root / ".cotal").exists()


# -- turn judgement -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "outcome"),
    [
        (
            {
                "subtype": "success",
                "is_error": False,
                "result": "Noted.",
                "num_turns": 1,
                "stop_reason": "end_turn",
            },
            TurnOutcome("ok", "Noted."),
        ),
        (
            {
                "subtype": "success",
                "is_error": False,
                "result": "Noted",
                "num_turns": 1,
                "stop_reason": "max_tokens",
            },
            TurnOutcome(
                "ok", "Noted", "reply truncated at the output limit (stop_reason max_tokens)"
            ),
        ),
        (
            {
                "subtype": "success",
                "is_error": True,
                "result": "API Error: Unable to connect to API (ConnectionRefused)",
            },
            TurnOutcome("error", detail="API Error: Unable to connect to API (ConnectionRefused)"),
        ),
        (
            {"subtype": "success", "is_error": True, "result": "Not logged in · Please run /login"},
            TurnOutcome("error", detail="Not logged in · Please run /login"),
        ),
        (
            {"subtype": "success", "is_error": False, "result": "", "num_turns": 1},
            TurnOutcome("unknown", detail="the model produced no output"),
        ),
        (
            {"subtype": "success", "result": "x"},
            TurnOutcome("unknown", detail="claude's result does not say whether it is an error"),
        ),
        (
            {"subtype": "error_max_turns", "is_error": True},
            TurnOutcome("error", detail="claude ended the turn with error_max_turns"),
        ),
        (
            {"subtype": "error_during_execution", "is_error": True, "errors": ["boom"]},
            TurnOutcome("error", detail="claude ended the turn with error_during_execution: boom"),
        ),
        (
            {"subtype": "surprise"},
            TurnOutcome("unknown", detail="claude ended the turn with result subtype 'surprise'"),
        ),
    ],
)
def test_judge_result(result: dict[str, Any], outcome: TurnOutcome) -> None:
    assert judge_result(result) == outcome


def test_interrupted_turn_is_aborted() -> None:
    assert judge_result(
        {"subtype": "error_during_execution", "is_error": True}, interrupted=True
    ) == TurnOutcome("aborted", detail="turn interrupted")


# -- the driver against a scripted stand-in -------------------------------------------------------


async def _scripted_claude(stdin: Pipe, stdout: Pipe, config: Path, holds: str, reply: str) -> None:
    """Answers initialize with a pid whose registry names `holds`, and every user line with a
    replay, an assistant message (also written to the transcript) and a result."""
    pid = 424242
    (config / "sessions").mkdir(parents=True, exist_ok=True)
    (config / "sessions" / f"{pid}.json").write_text(json.dumps({"pid": pid, "sessionId": holds}))
    buf = b""
    async for chunk in stdin.recv_end:
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            msg = json.loads(line)
            out: list[dict[str, Any]] = []
            if msg["type"] == "control_request":
                out.append(
                    {
                        "type": "control_response",
                        "response": {
                            "subtype": "success",
                            "request_id": msg["request_id"],
                            "response": {"pid": pid},
                        },
                    }
                )
            elif msg["type"] == "user":
                auuid = str(uuid.uuid4())
                out += [
                    {
                        "type": "result",
                        "subtype": "success",
                        "is_error": False,
                        "result": "stray",
                        "num_turns": 1,
                        "session_id": holds,
                    },
                    {"type": "user", "isReplay": True, "uuid": msg["uuid"], "session_id": holds},
                    {"type": "assistant", "uuid": auuid, "session_id": holds},
                ]
                project = config / "projects" / "-x"
                project.mkdir(parents=True, exist_ok=True)
                transcript = project / f"{holds}.jsonl"
                transcript.write_text(
                    (transcript.read_text() if transcript.exists() else "")
                    + json.dumps({"type": "assistant", "uuid": auuid})
                    + "\n"
                )
                out.append(
                    {
                        "type": "result",
                        "subtype": "success",
                        "is_error": False,
                        "result": reply,
                        "num_turns": 1,
                        "session_id": holds,
                    }
                )
            for event in out:
                await stdout.send(json.dumps(event).encode() + b"\n")
    await stdout.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("matches", [True, False])
async def test_driver_reports_the_registry_session_and_guards_the_pointer(
    tmp_path: Path, matches: bool
) -> None:
    config = tmp_path / "cfg"
    config.mkdir()
    expected = str(uuid.uuid4())
    holds = expected if matches else str(uuid.uuid4())
    pointer = tmp_path / "p.json"
    stdin, stdout = Pipe(), Pipe()
    driver = ClaudeDriver(
        stdin, stdout, config_dir=config, pointer_path=pointer, expected_session_id=expected
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_scripted_claude, stdin, stdout, config, holds, "hello")
            await tg.start(driver.run)
            assert await driver.get_state() == holds
            # The stray result before our replay is not taken for our turn's end.
            assert await driver.prompt("hi", message_id="m1") == TurnOutcome("ok", "hello")
            await driver.quit()
    assert (
        "claude reported a result for a message that is not the prompt in flight"
        in driver.protocol_errors
    )
    if matches:
        assert json.loads(pointer.read_text()) == {
            "version": 1,
            "sessionId": expected,
            "status": "quit",
        }
        assert mode(pointer) == 0o600
    else:
        # A process holding another session than the launch meant must never be recorded.
        assert not pointer.exists()
        assert (
            f"claude reports session {holds}, expected {expected}; pointer not written"
            in driver.protocol_errors
        )
