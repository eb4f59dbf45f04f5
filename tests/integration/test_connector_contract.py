"""The promises every connector makes, asserted once, for each connector: scribe, pi, Claude
Code, Codex, OpenCode, Gemini CLI and the jcode stand-in (tests/fixtures/jcode_standin.py, which
is not jcode).

Launch-level promises run without any harness: `binary` points at a placeholder. Live promises
run the real harness (pi, Claude Code and Codex from `.tools/`, under their skip conditions and
the `pi` and `claude` markers) against the real fake model servers on 127.0.0.1. What only one
connector does stays in that connector's own tests.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest

from connectors.base import (
    Capabilities,
    ContinuityClass,
    LaunchOpts,
    LaunchSpec,
    TurnOutcome,
    continuity_class,
)
from connectors.claude_code import ClaudeCodeConnector, transcripts
from connectors.codex import CodexConnector, pinned_program
from connectors.gemini import FIXED_ENV as GEMINI_FIXED_ENV
from connectors.gemini import HOST_FILES as GEMINI_HOST_FILES
from connectors.gemini import GeminiConnector, chat_files
from connectors.gemini import pinned_program as gemini_program
from connectors.jcode import JcodeConnector
from connectors.jsonl_driver import JsonLinesDriver
from connectors.launchkit import ENV_ALLOW
from connectors.opencode import OFFLINE_ENV as OPENCODE_OFFLINE_ENV
from connectors.opencode import OpenCodeConnector
from connectors.opencode import pinned_program as opencode_program
from connectors.pi import PiConnector, read_session_header
from connectors.scribe.connector import ScribeConnector
from manager import registry
from protocol.errors import Refusal
from protocol.session import SessionPointer
from tests.conftest import PI_CLI, REPO, AnthropicServer, FakeServer
from tests.e2e.test_gemini_seat import fake_gemini  # noqa: F401 (the fixture)
from tests.fixtures.fake_gemini import GeminiServer
from tests.fixtures.fake_responses import ResponsesServer
from tests.harness import Seat, mode, placeholder_binary, read_pointer, running_seat, seat_opts
from tests.harness import sha256 as file_sha256


def _claude_missing() -> str | None:
    from manager.cli.tools import which

    try:
        which("claude")
    except Refusal as exc:
        return exc.text
    return None


def _codex_missing() -> str | None:
    try:
        pinned_program()
    except Refusal as exc:
        return exc.text
    return None


def _opencode_missing() -> str | None:
    try:
        opencode_program()
    except Refusal as exc:
        return exc.text
    return None


def _gemini_missing() -> str | None:
    try:
        gemini_program()
    except Refusal as exc:
        return exc.text
    return None


PI_MISSING = None if PI_CLI.is_file() else "pi is not installed under .tools/pi"
OPENCODE_MISSING = _opencode_missing()
GEMINI_MISSING = _gemini_missing()
CLAUDE_MISSING = _claude_missing()
CODEX_MISSING = _codex_missing()
STANDIN = REPO / "tests" / "fixtures" / "jcode_standin.py"
PHRASE = "juniper-ledger-41"
KEY_VAR = "COTAL_TEST_ANTHROPIC_KEY"
SECRET = "sk-ant-fake-cotal-test-0123456789"
CODEX_KEY_VAR = "COTAL_TEST_CODEX_KEY"
CODEX_SECRET = "sk-fake-codex-contract-0123456789"
OPENCODE_KEY_VAR = "COTAL_TEST_OPENCODE_KEY"
OPENCODE_SECRET = "sk-fake-opencode-contract-0123456789"
GEMINI_KEY_VAR = "COTAL_TEST_GEMINI_KEY"
GEMINI_SECRET = "fake-gemini-contract-0123456789"
COTAL_ENV = {
    "COTAL_SPACE",
    "COTAL_NAME",
    "COTAL_LIFECYCLE_UID",
    "COTAL_WORKSPACE_ROOT",
    "COTAL_SESSION_STATE",
}


@dataclass(frozen=True)
class Case:
    """One connector as the contract sees it, and the few facts in which connectors differ."""

    connector: type[Any]
    capabilities: Capabilities
    continuity: ContinuityClass
    # Refusal code for a launch asking for a fork and a continuation at once.
    conflict_code: str
    # Variables beyond the allow-list and the COTAL_ identity that the connector sets itself.
    own_env: frozenset[str]
    # The turn the harness is told to fail, and how its error detail starts.
    fail_prompt: str
    fail_detail: str
    # Whether the error detail is exactly `fail_detail` (else it only starts with it).
    fail_exact: bool = True
    # A turn that produces no output, and its `unknown` detail; None where there is none.
    empty_prompt: str | None = None
    empty_detail: str = ""
    # Each step's deadline: generous, as the suite's other workers may hold both cores.
    timeout: float = 20
    # Whether a fork by id is found only in the seat's own store (so it forks in place).
    fork_in_own_store: bool = False
    # Connector-specific evidence, checked where the shared flow has produced it.
    extra: dict[str, Callable[..., None]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.connector.name)


def _pi_reopen(live: Live, seat: Seat[Any], sid: str, store_file: Path) -> None:
    spec = seat.spec
    assert spec.argv[-2:] == ["--session", str(store_file)]


def _pi_fork(live: Live, seat: Seat[Any], source: str, fork: str, source_file: Path) -> None:
    spec = seat.spec
    assert spec.expected_session_id is None
    assert spec.argv[-2:] == ["--fork", str(source_file)]
    (fork_file,) = live.store_files(spec)
    header = read_session_header(fork_file)
    assert (header["id"], header["parentSession"], header["cwd"]) == (
        fork,
        str(source_file),
        str(live.root),
    )


def _claude_config(spec: LaunchSpec) -> Path:
    return Path(spec.env["CLAUDE_CONFIG_DIR"])


def _claude_first(live: Live, seat: Seat[Any], sid: str) -> None:
    spec = seat.spec
    assert spec.argv[-2:] == ["--session-id", sid]
    # Also the id Claude Code reported in system/init and in its result.
    assert seat.driver.session_id == sid
    config = _claude_config(spec)
    assert mode(config) == 0o700
    # Once the session has a transcript, a continuation refuses if it ever goes missing
    # rather than restarting an empty session under this id.
    assert json.loads((config / "cotal-launch.json").read_text()) == {
        "version": 1,
        "sessionId": sid,
        "origin": "fresh",
        "materialized": True,
    }


def _claude_reopen(live: Live, seat: Seat[Any], sid: str, store_file: Path) -> None:
    spec = seat.spec
    assert spec.argv[-2:] == ["--resume", sid] and "--fork-session" not in spec.argv
    assert seat.driver.session_id == sid
    assert live.anthropic().messages()[-1]["session"] == sid
    assert all(r["body"]["model"] == "claude-fake-1" for r in live.anthropic().messages())
    # The key never reaches argv or a file; HOME is untouched with a private config dir.
    assert spec.secret_env == ("ANTHROPIC_API_KEY",)
    assert not any(SECRET in a for a in spec.argv)
    for path in live.root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert SECRET.encode() not in path.read_bytes(), f"the API key leaked into {path}"
    assert list((live.tmp_path / "home").iterdir()) == []


def _claude_fork(live: Live, seat: Seat[Any], source: str, fork: str, source_file: Path) -> None:
    spec = seat.spec
    assert spec.expected_session_id == fork and seat.driver.session_id == fork
    snapshot = _claude_config(spec) / "cotal-forks" / fork / f"{source}.jsonl"
    assert spec.argv[-5:] == ["--resume", str(snapshot), "--fork-session", "--session-id", fork]
    assert transcripts(_claude_config(spec), source) == []
    assert live.anthropic().messages()[-1]["session"] == fork


def _codex_home(spec: LaunchSpec) -> Path:
    return Path(spec.env["CODEX_HOME"])


def _codex_reopen(live: Live, seat: Seat[Any], sid: str, store_file: Path) -> None:
    spec = seat.spec
    assert spec.argv[1:] == ["app-server", "--listen", "stdio://", "--strict-config"]
    assert seat.driver.session_id == sid
    # Every request of the thread, before and after the kill, was made for the one thread.
    assert {r["body"]["prompt_cache_key"] for r in live.responses().responses()} == {sid}
    assert all(r["body"]["model"] == "fake-model" for r in live.responses().responses())
    # The key travels in the child's environment alone: never argv, never a file, not HOME.
    assert spec.secret_env == ("CODEX_PROVIDER_API_KEY",)
    assert spec.env["CODEX_PROVIDER_API_KEY"] == CODEX_SECRET
    assert not any(CODEX_SECRET in a for a in spec.argv)
    for path in live.root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert CODEX_SECRET.encode() not in path.read_bytes(), f"the key leaked into {path}"
    assert list((live.tmp_path / "home").iterdir()) == []


def _opencode_db(spec: LaunchSpec) -> Path:
    return Path(spec.env["XDG_DATA_HOME"], "opencode", "opencode.db")


def _opencode_reopen(live: Live, seat: Seat[Any], sid: str, store_file: Path) -> None:
    spec = seat.spec
    assert spec.argv[1:] == ["acp"]
    assert seat.driver.session_id == sid
    assert all(r["model"] == "fake-model" for r in live.opencode_requests())
    # The key travels in the child's environment alone: never argv, never a file, not HOME.
    assert spec.secret_env == ("OPENCODE_PROVIDER_API_KEY",)
    assert spec.env["OPENCODE_PROVIDER_API_KEY"] == OPENCODE_SECRET
    assert not any(OPENCODE_SECRET in a for a in spec.argv)
    for path in live.root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert OPENCODE_SECRET.encode() not in path.read_bytes(), f"the key leaked into {path}"
    assert list((live.tmp_path / "home").iterdir()) == []


def _gemini_reopen(live: Live, seat: Seat[Any], sid: str, store_file: Path) -> None:
    spec = seat.spec
    assert spec.argv[2:] == ["--acp", "--model", "fake-gemini", "--approval-mode", "default"]
    assert seat.driver.session_id == sid
    assert {r["path"].split(":")[0] for r in live.gemini().records()} == {
        "/v1beta/models/fake-gemini"
    }
    # The key travels in the child's environment alone: never argv, never a file, not HOME.
    assert spec.secret_env == ("GEMINI_API_KEY",)
    assert spec.env["GEMINI_API_KEY"] == GEMINI_SECRET
    assert not any(GEMINI_SECRET in a for a in spec.argv)
    for path in live.root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert GEMINI_SECRET.encode() not in path.read_bytes(), f"the key leaked into {path}"
    assert list((live.tmp_path / "home").iterdir()) == []


def _scribe_fork(live: Live, seat: Seat[Any], source: str, fork: str, source_file: Path) -> None:
    spec = seat.spec
    assert spec.expected_session_id is None
    assert uuid.UUID(fork).version == 4
    (fork_file,) = [f for f in live.store_files(spec) if f.name == f"{fork}.jsonl"]
    forked = [json.loads(line) for line in fork_file.read_bytes().splitlines()]
    copied = [json.loads(line) for line in source_file.read_bytes().splitlines()]
    assert (forked[0]["id"], forked[0]["parent"]) == (fork, source)
    assert forked[1:3] == copied[1:3]


CASES = {
    "scribe": Case(
        connector=ScribeConnector,
        capabilities=Capabilities(True, True, True, True),
        continuity="exact",
        conflict_code="bad-launch",
        own_env=frozenset(),
        fail_prompt="#error-once:contract hello",
        fail_detail="injected fault error-once:contract",
        fork_in_own_store=True,
        extra={"fork": _scribe_fork},
    ),
    "pi": Case(
        connector=PiConnector,
        capabilities=Capabilities(True, True, True, True),
        continuity="exact",
        conflict_code="bad-launch",
        own_env=frozenset(
            {"PI_CODING_AGENT_DIR", "PI_OFFLINE", "PI_SKIP_VERSION_CHECK", "PI_TELEMETRY"}
        ),
        fail_prompt="fake:http-500 hello",
        fail_detail="500 fake server error (fake:http-500)",
        empty_prompt="fake:empty hello",
        empty_detail="the model produced no output",
        timeout=60,
        extra={"reopen": _pi_reopen, "fork": _pi_fork},
    ),
    "claude": Case(
        connector=ClaudeCodeConnector,
        capabilities=Capabilities(True, True, True, True),
        continuity="exact",
        conflict_code="bad-launch",
        own_env=frozenset(
            {
                "ANTHROPIC_API_KEY",
                "ANTHROPIC_BASE_URL",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
                "CLAUDE_CONFIG_DIR",
                "DISABLE_AUTOUPDATER",
                "DISABLE_ERROR_REPORTING",
                "DISABLE_TELEMETRY",
                "IS_SANDBOX",
                # Named by the live seats' extra_env, so a dead endpoint fails a turn at once.
                "CLAUDE_CODE_MAX_RETRIES",
            }
        ),
        fail_prompt="fake:http-500 hello",
        fail_detail="API Error: 500 fake server error (fake:http-500).",
        fail_exact=False,
        # Claude Code asks once more after an empty reply; the fake stays empty.
        empty_prompt="fake:empty hello",
        empty_detail="the model produced no output",
        timeout=60,
        extra={"first": _claude_first, "reopen": _claude_reopen, "fork": _claude_fork},
    ),
    "codex": Case(
        connector=CodexConnector,
        # Exact (measured: `thread/resume` keeps the id and the rollout); no fork of another
        # seat's thread.
        capabilities=Capabilities(False, True, True, True),
        continuity="exact",
        conflict_code="unsupported",
        own_env=frozenset({"CODEX_HOME", "CODEX_PROVIDER_API_KEY"}),
        fail_prompt="fake:http-400 hello",
        # Codex passes on the provider's error body as it came.
        fail_detail='{"error": {"message": "fake provider refusal (fake:http-400)", '
        '"type": "invalid_request_error", "code": "invalid_request_error"}}',
        timeout=40,
        extra={"reopen": _codex_reopen},
    ),
    "opencode": Case(
        connector=OpenCodeConnector,
        # Exact (measured: `session/load` in a new process keeps the id and sends the history);
        # no fork.
        capabilities=Capabilities(False, True, True, True),
        continuity="exact",
        conflict_code="unsupported",
        own_env=frozenset(
            {
                "OPENCODE_PROVIDER_API_KEY",
                "XDG_CONFIG_HOME",
                "XDG_DATA_HOME",
                "XDG_STATE_HOME",
                "XDG_CACHE_HOME",
                *OPENCODE_OFFLINE_ENV,
            }
        ),
        # OpenCode retries a 500 without end; a 400 it answers as the prompt's error.
        fail_prompt="fake:http-400 hello",
        fail_detail="Internal error: fake provider refusal (fake:http-400)",
        empty_prompt="fake:empty hello",
        empty_detail="the model produced no output",
        timeout=90,
        extra={"reopen": _opencode_reopen},
    ),
    "gemini": Case(
        connector=GeminiConnector,
        # Exact (measured: `session/load` in a new process keeps the id and sends the history);
        # no fork.
        capabilities=Capabilities(False, True, True, True),
        continuity="exact",
        conflict_code="unsupported",
        own_env=frozenset(
            {"GEMINI_API_KEY", "GEMINI_CLI_HOME", "GOOGLE_GEMINI_BASE_URL", *GEMINI_HOST_FILES}
            | set(GEMINI_FIXED_ENV)
        ),
        # Gemini CLI retries a 500 for minutes and an empty reply for seconds; a 400 it
        # answers as the prompt's error, the provider's body as it came.
        fail_prompt="fake:http-400 hello",
        fail_detail='{"error":{"code":400,"message":"fake error (fake:http-400)",'
        '"status":"INVALID_ARGUMENT"}}',
        timeout=90,
        extra={"reopen": _gemini_reopen},
    ),
    "jcode": Case(
        connector=JcodeConnector,
        capabilities=Capabilities(supports_prompt=True),
        continuity="drain-only",
        conflict_code="unsupported",
        own_env=frozenset({"JCODE_HOME", "COTAL_JCODE_HOME"}),
        fail_prompt="standin:fail",
        fail_detail="stand-in failure (standin:fail)",
        empty_prompt="standin:empty",
        empty_detail="the harness produced no output",
    ),
}

LIVE_MARKS = {
    "pi": [pytest.mark.pi, pytest.mark.skipif(PI_MISSING is not None, reason=str(PI_MISSING))],
    "claude": [
        pytest.mark.claude,
        pytest.mark.skipif(
            CLAUDE_MISSING is not None, reason=f"Claude Code is not installed: {CLAUDE_MISSING}"
        ),
    ],
    "codex": [
        pytest.mark.skipif(
            CODEX_MISSING is not None, reason=f"Codex is not installed: {CODEX_MISSING}"
        ),
    ],
    "opencode": [
        pytest.mark.opencode,
        pytest.mark.skipif(
            OPENCODE_MISSING is not None, reason=f"OpenCode is not installed: {OPENCODE_MISSING}"
        ),
    ],
    "gemini": [
        pytest.mark.gemini,
        pytest.mark.skipif(
            GEMINI_MISSING is not None, reason=f"Gemini CLI is not installed: {GEMINI_MISSING}"
        ),
    ],
}


def live_params(*names: str) -> list[Any]:
    return [pytest.param(n, marks=LIVE_MARKS.get(n, []), id=n) for n in names]


EXACT = ("scribe", "pi", "claude", "codex", "opencode", "gemini")
# The exact connectors that also fork another session by id.
FORKING = tuple(n for n in EXACT if CASES[n].capabilities.supports_resume)


def test_the_contract_covers_every_harness_in_the_registry() -> None:
    # `scribe-fork` is scribe's own connector with continuation withheld, so that the fork path
    # of a resume runs offline; its fork is the `fork` extra of scribe's case. Every other
    # harness `--agent` accepts is a case here, so a new one cannot be registered untested.
    assert set(registry.KNOWN) - set(CASES) == {"scribe-fork"}
    assert set(CASES) <= set(registry.KNOWN)


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest) -> Case:
    return CASES[request.param]


# -- launch: no harness runs ----------------------------------------------------------------------


def launch_opts(
    case: Case, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any
) -> LaunchOpts:
    """Options each connector accepts, pointing at a placeholder binary where it needs one."""
    config: dict[str, Any] = {}
    if case.name != "scribe":
        binary = tmp_path / "bin" / case.name
        if not binary.exists():
            placeholder_binary(tmp_path, case.name)
        config["binary"] = str(binary)
    if case.name == "pi":
        config.update(base_url="http://127.0.0.1:9/v1", model="fake-model")
    if case.name == "claude":
        monkeypatch.setenv(KEY_VAR, SECRET)
        config.update(base_url="http://127.0.0.1:9", model="claude-fake-1", api_key_env=KEY_VAR)
    if case.name == "codex":
        monkeypatch.setenv(CODEX_KEY_VAR, CODEX_SECRET)
        config.update(
            base_url="http://127.0.0.1:9/v1", model="fake-model", api_key_env=CODEX_KEY_VAR
        )
    if case.name == "opencode":
        monkeypatch.setenv(OPENCODE_KEY_VAR, OPENCODE_SECRET)
        config.update(
            base_url="http://127.0.0.1:9/v1", model="fake-model", api_key_env=OPENCODE_KEY_VAR
        )
    if case.name == "gemini":
        monkeypatch.setenv(GEMINI_KEY_VAR, GEMINI_SECRET)
        config.update(
            base_url="http://127.0.0.1:9", model="fake-gemini", api_key_env=GEMINI_KEY_VAR
        )
    return seat_opts(root, case.name, "alice", config=config, **kw)


def refused(case: Case, opts: LaunchOpts) -> Refusal:
    with pytest.raises(Refusal) as exc:
        case.connector().build_launch(opts)
    return exc.value


def test_declared_capabilities_give_the_continuity_class(case: Case) -> None:
    assert case.connector.capabilities == case.capabilities
    assert case.connector().capabilities == case.capabilities
    assert continuity_class(case.connector.capabilities) == case.continuity


@pytest.mark.parametrize("prompt", ["", "   ", "-x", "@f"])
def test_a_bad_prompt_is_refused_and_changes_nothing(
    case: Case, prompt: str, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exc = refused(case, launch_opts(case, root, tmp_path, monkeypatch, prompt=prompt))
    assert exc.code == "bad-prompt"
    assert exc.message.startswith(f"{case.name} connector refuses ")
    blank = not prompt.strip()
    assert ("pass a non-empty --prompt" if blank else "reword the prompt") in exc.cure
    assert not (root / ".cotal").exists()


def test_fork_with_continuation_is_refused_and_changes_nothing(
    case: Case, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = "01a2278a-387f-7559-b3e4-684e516dbf2f"
    opts = launch_opts(case, root, tmp_path, monkeypatch, resume=sid, continue_session=sid)
    exc = refused(case, opts)
    assert exc.code == case.conflict_code
    assert exc.message.startswith(f"{case.name} connector")
    assert not (root / ".cotal").exists()


@pytest.mark.parametrize(
    "name",
    [n for n, c in CASES.items() if c.continuity == "exact" and not c.capabilities.supports_resume],
)
def test_an_exact_connector_without_fork_refuses_a_fork_and_changes_nothing(
    name: str, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES[name]
    sid = "01a2278a-387f-7559-b3e4-684e516dbf2f"
    exc = refused(case, launch_opts(case, root, tmp_path, monkeypatch, resume=sid))
    assert exc.code == "unsupported" and exc.message.startswith(f"{case.name} connector")
    assert not (root / ".cotal").exists()


@pytest.mark.parametrize("kind", ["continue_session", "resume"])
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.continuity == "drain-only"])
def test_a_drain_only_connector_refuses_every_reopening(
    name: str, kind: str, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES[name]
    exc = refused(case, launch_opts(case, root, tmp_path, monkeypatch, **{kind: "standin-0123"}))
    assert exc.code == "unsupported" and exc.message.startswith(f"{case.name} connector")
    assert not (root / ".cotal").exists()


def test_the_environment_is_allow_listed(
    case: Case, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Operator credentials and harness settings outside the allow-list must not reach a seat.
    leaks = {
        "OPENAI_API_KEY": "sk-operator-leak",
        "AWS_SECRET_ACCESS_KEY": "aws-operator-leak",
        "PI_CODING_AGENT_SESSION_DIR": "/somewhere/else",
        "COTAL_TEST_OPERATOR_TOKEN": "cotal-operator-leak",
    }
    for k, v in leaks.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    opts = launch_opts(case, root, tmp_path, monkeypatch)
    spec = case.connector().build_launch(opts)
    assert not set(spec.env) & set(leaks)
    assert not any(v in spec.env.values() for v in leaks.values())
    assert set(spec.env) - set(ENV_ALLOW) - COTAL_ENV <= case.own_env
    assert spec.env["HOME"] == str(tmp_path / "home")
    assert spec.env["PATH"] == os.environ["PATH"]
    assert {k: spec.env[k] for k in COTAL_ENV} == {
        "COTAL_SPACE": opts.space,
        "COTAL_NAME": opts.name,
        "COTAL_LIFECYCLE_UID": opts.lifecycle_uid,
        "COTAL_WORKSPACE_ROOT": str(opts.workspace_root),
        "COTAL_SESSION_STATE": str(opts.session_pointer_path),
    }


# -- live: the real harness -----------------------------------------------------------------------


@dataclass
class Live:
    """One connector's real harness in a test: launch options, running seats, the seat's store
    and, for harnesses that talk to a model server, what that server was sent."""

    case: Case
    root: Path
    tmp_path: Path
    request: pytest.FixtureRequest
    binary: Path | None = None

    def opts(self, name: str, **kw: Any) -> LaunchOpts:
        config: dict[str, Any] = {}
        if self.case.name == "pi":
            config = {"base_url": self.openai().base_url, "model": "fake-model"}
        elif self.case.name == "claude":
            config = {
                "base_url": self.anthropic().base_url,
                "model": "claude-fake-1",
                "api_key_env": KEY_VAR,
                "extra_env": ["CLAUDE_CODE_MAX_RETRIES"],
            }
        elif self.case.name == "codex":
            config = {
                "base_url": self.responses().base_url,
                "model": "fake-model",
                "api_key_env": CODEX_KEY_VAR,
            }
        elif self.case.name == "opencode":
            config = {
                "base_url": self.openai().base_url,
                "model": "fake-model",
                "api_key_env": OPENCODE_KEY_VAR,
            }
        elif self.case.name == "gemini":
            config = {
                "base_url": self.gemini().base_url,
                "model": "fake-gemini",
                "api_key_env": GEMINI_KEY_VAR,
            }
        elif self.case.name == "jcode":
            config = {"binary": str(self.binary)}
        return seat_opts(self.root, self.case.name, name, config=config, **kw)

    def running(self, opts: LaunchOpts) -> AbstractAsyncContextManager[Seat[Any]]:
        return running_seat(
            self.case.connector(), opts, self.tmp_path, timeout=self.case.timeout, seat=Seat[Any]
        )

    def openai(self) -> FakeServer:
        server: FakeServer = self.request.getfixturevalue("fake_openai")
        return server

    def anthropic(self) -> AnthropicServer:
        server: AnthropicServer = self.request.getfixturevalue("fake_anthropic")
        return server

    def responses(self) -> ResponsesServer:
        server: ResponsesServer = self.request.getfixturevalue("fake_responses")
        return server

    def gemini(self) -> GeminiServer:
        server: GeminiServer = self.request.getfixturevalue("fake_gemini")
        return server

    def opencode_requests(self) -> list[dict[str, Any]]:
        """The agent's own requests to the model (OpenCode also asks it for a session's title,
        with no tools)."""
        return [r for r in self.openai().requests() if "tools" in r]

    def store_files(self, spec: LaunchSpec) -> list[Path]:
        """Every session file in the seat's own store."""
        if self.case.name == "opencode":
            return [_opencode_db(spec)]
        if self.case.name == "gemini":
            # The session's chat file: the one holding a turn (each start also writes one of
            # its own, holding only Gemini's context).
            return [c.path for c in chat_files(Path(spec.env["GEMINI_CLI_HOME"])) if c.resumable]
        if self.case.name == "claude":
            return sorted(_claude_config(spec).glob("projects/*/*.jsonl"))
        if self.case.name == "codex":
            return sorted(_codex_home(spec).glob("sessions/*/*/*/rollout-*.jsonl"))
        (decl,) = spec.session_store
        return sorted((self.root / decl.relpath).glob("*.jsonl"))

    def model_requests(self) -> int | None:
        if self.case.name == "pi":
            return len(self.openai().requests())
        if self.case.name == "claude":
            return len(self.anthropic().messages())
        if self.case.name == "codex":
            return len(self.responses().responses())
        if self.case.name == "opencode":
            return len(self.opencode_requests())
        if self.case.name == "gemini":
            return len(self.gemini().requests())
        return None

    def model_saw(self) -> list[tuple[str, str]] | None:
        """(role, text) of the user and assistant turns in the model server's last request."""
        if self.case.name == "pi":
            last = self.openai().requests()[-1]
            return [
                (m["role"], _text(m["content"]))
                for m in last["messages"]
                if m["role"] in ("user", "assistant")
            ]
        if self.case.name == "claude":
            return AnthropicServer.turns(self.anthropic().messages()[-1])
        if self.case.name == "codex":
            return ResponsesServer.turns(self.responses().responses()[-1])
        if self.case.name == "opencode":
            return [
                (m["role"], _text(m["content"]))
                for m in self.opencode_requests()[-1]["messages"]
                if m["role"] in ("user", "assistant")
            ]
        if self.case.name == "gemini":
            return GeminiServer.turns(self.gemini().requests()[-1])
        return None

    def continued(self, store_file: Path) -> Path:
        """Where a continuation keeps the session file `store_file`."""
        if self.case.name == "gemini":
            return store_file.with_name(f"session-cotal-{store_file.name.rsplit('-', 1)[1]}")
        return store_file

    def check(self, what: str, *args: Any) -> None:
        if what in self.case.extra:
            self.case.extra[what](self, *args)


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


@pytest.fixture
def live(
    request: pytest.FixtureRequest, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Live:
    case = CASES[request.param]
    binary = None
    if case.name == "claude":
        home = tmp_path / "home"
        home.mkdir()
        # HOME must stay untouched: with a private CLAUDE_CONFIG_DIR nothing belongs there.
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv(KEY_VAR, SECRET)
        # A dead or failing endpoint must fail a turn at once, not after minutes of retries.
        monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "0")
    if case.name == "codex":
        home = tmp_path / "home"
        home.mkdir()
        # HOME must stay untouched: the seat's CODEX_HOME is its own.
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv(CODEX_KEY_VAR, CODEX_SECRET)
    if case.name == "opencode":
        home = tmp_path / "home"
        home.mkdir()
        # HOME must stay untouched: the seat's data, config, state and cache are its own.
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv(OPENCODE_KEY_VAR, OPENCODE_SECRET)
    if case.name == "gemini":
        home = tmp_path / "home"
        home.mkdir()
        # HOME must stay untouched: the seat's GEMINI_CLI_HOME is its own.
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv(GEMINI_KEY_VAR, GEMINI_SECRET)
    if case.name == "jcode":
        # The stand-in under this interpreter, whatever PATH holds.
        binary = tmp_path / "bin" / "jcode"
        binary.parent.mkdir()
        binary.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
        binary.chmod(0o755)
    return Live(case, root, tmp_path, request, binary)


async def ready(seat: Seat[Any], timeout: float) -> str:
    """The session id the driver reports once the harness is ready to take a prompt."""
    with anyio.fail_after(timeout):
        if isinstance(seat.driver, JsonLinesDriver):
            announced = await seat.driver.wait_ready(timeout)
            assert await seat.driver.get_state() == announced
        sid = await seat.driver.get_state()
        if sid is None and hasattr(seat.driver, "state_known"):
            # A driver that learns its session while the harness starts (Codex opens its
            # thread itself) says when it knows; the manager polls for the same answer.
            await seat.driver.state_known.wait()
            sid = await seat.driver.get_state()
    assert isinstance(sid, str) and sid
    if seat.spec.expected_session_id is not None:
        assert sid == seat.spec.expected_session_id
    return sid


async def ask(seat: Seat[Any], text: str, message_id: str, timeout: float) -> TurnOutcome:
    with anyio.fail_after(timeout):
        outcome: TurnOutcome = await seat.driver.prompt(text, message_id=message_id)
    return outcome


def pointer(opts: LaunchOpts, sid: str, status: Literal["running", "quit"]) -> None:
    assert read_pointer(opts.session_pointer_path) == SessionPointer(
        version=1, session_id=sid, status=status
    )
    assert mode(opts.session_pointer_path) == 0o600


REMEMBER = f"remember the phrase {PHRASE}"
NOTED = TurnOutcome("ok", f"Noted: {PHRASE}.")
RECALLED = TurnOutcome("ok", f"The phrase is {PHRASE}.")
UNKNOWN = TurnOutcome("ok", "I do not know the phrase.")


@pytest.mark.anyio
@pytest.mark.parametrize("live", live_params(*CASES), indirect=True)
async def test_the_driver_reports_readiness_and_every_turn_ends_terminally(live: Live) -> None:
    t = live.case.timeout
    opts = live.opts("alice")
    async with live.running(opts) as seat:
        sid = await ready(seat, t)
        if live.case.continuity == "exact":
            # The pointer is written once the harness proved the session, private.
            pointer(opts, sid, "running")
        else:
            # Drain-only: nothing is written where a reopening would look for a session.
            assert not opts.session_pointer_path.exists()
        assert await ask(seat, REMEMBER, "m1", t) == NOTED
        assert await ask(seat, "what was the phrase?", "m2", t) == RECALLED
        live.check("first", seat, sid)
        failed = await ask(seat, live.case.fail_prompt, "m3", t)
        assert failed.status == "error" and failed.detail.startswith(live.case.fail_detail)
        assert failed.detail == live.case.fail_detail or not live.case.fail_exact
        if live.case.empty_prompt is not None:
            empty = await ask(seat, live.case.empty_prompt, "m4", t)
            assert empty == TurnOutcome("unknown", detail=live.case.empty_detail)
        with anyio.fail_after(t):
            await seat.driver.quit()
            assert await seat.proc.wait() == 0
    if live.case.continuity == "exact":
        pointer(opts, sid, "quit")
    else:
        assert not opts.session_pointer_path.exists()


@pytest.mark.anyio
@pytest.mark.parametrize("live", live_params(*CASES), indirect=True)
async def test_a_killed_harness_leaves_the_turn_unknown(live: Live) -> None:
    t = live.case.timeout
    async with live.running(live.opts("bob")) as seat:
        await ready(seat, t)
        seat.proc.send_signal(signal.SIGKILL)
        with anyio.fail_after(t):
            assert await seat.proc.wait() == -signal.SIGKILL
        outcome = await ask(seat, "hello", "k1", t)
        assert outcome.status == "unknown"


@pytest.mark.anyio
@pytest.mark.parametrize("live", live_params(*EXACT), indirect=True)
async def test_kill9_then_exact_reopen_by_id_is_the_same_session(live: Live) -> None:
    t = live.case.timeout
    opts = live.opts("alice", prompt=REMEMBER)
    async with live.running(opts) as seat:
        sid = await ready(seat, t)
        # The launch prompt is the seat's turn 0: delivered by the driver where the harness
        # takes none in argv, and answered before any other turn.
        if hasattr(seat.driver, "initial_done"):
            with anyio.fail_after(t):
                await seat.driver.initial_done.wait()
            assert seat.driver.initial_outcome == NOTED
        assert await ask(seat, "what was the phrase?", "m1", t) == RECALLED
        (store_file,) = live.store_files(seat.spec)
        seat.proc.send_signal(signal.SIGKILL)
        with anyio.fail_after(t):
            assert await seat.proc.wait() == -signal.SIGKILL
    # A crash leaves the pointer `running`, naming the session to continue.
    pointer(opts, sid, "running")
    size = store_file.stat().st_size
    requests = live.model_requests()

    async with live.running(replace(opts, prompt=None, continue_session=sid)) as seat:
        assert seat.spec.expected_session_id == sid
        assert await ready(seat, t) == sid
        assert await ask(seat, "what was the phrase?", "m2", t) == RECALLED
        # Exactly one file, the same one, grown: the harness continued it (Gemini CLI's under
        # the name the connector gives a continued session: connectors/gemini.py, `canonical`).
        store_file = live.continued(store_file)
        assert live.store_files(seat.spec) == [store_file]
        assert store_file.stat().st_size > size
        with anyio.fail_after(t):
            await seat.driver.quit()
            assert await seat.proc.wait() == 0
    pointer(opts, sid, "quit")
    if requests is not None:
        # One question, one request, and it carried the session's history.
        assert live.model_requests() == requests + 1
        assert live.model_saw() == [
            ("user", REMEMBER),
            ("assistant", NOTED.reply),
            ("user", "what was the phrase?"),
            ("assistant", RECALLED.reply),
            ("user", "what was the phrase?"),
        ]
    live.check("reopen", seat, sid, store_file)

    # A fresh seat in the same workspace has its own session and does not know the phrase.
    async with live.running(live.opts("bob")) as seat:
        assert await ready(seat, t) != sid
        assert await ask(seat, "what was the phrase?", "m3", t) == UNKNOWN
    if requests is not None:
        assert live.model_saw() == [("user", "what was the phrase?")]


@pytest.mark.anyio
@pytest.mark.parametrize("live", live_params(*FORKING), indirect=True)
async def test_fork_gets_a_new_id_with_the_history_and_leaves_the_source(live: Live) -> None:
    t = live.case.timeout
    source_opts = live.opts("alice")
    async with live.running(source_opts) as seat:
        source = await ready(seat, t)
        assert await ask(seat, REMEMBER, "m1", t) == NOTED
        (source_file,) = live.store_files(seat.spec)
    before = file_sha256(source_file)

    if live.case.fork_in_own_store:
        fork_opts = replace(source_opts, resume=source)
    else:
        fork_opts = live.opts("carol", resume=source)
    async with live.running(fork_opts) as seat:
        fork = await ready(seat, t)
        assert fork != source
        assert await ask(seat, "what was the phrase?", "f1", t) == RECALLED
        live.check("fork", seat, source, fork, source_file)
    pointer(fork_opts, fork, "running")
    assert file_sha256(source_file) == before
    if live.model_requests() is not None:
        assert live.model_saw() == [
            ("user", REMEMBER),
            ("assistant", NOTED.reply),
            ("user", "what was the phrase?"),
        ]

    # The fork is its own session: telling it something new leaves the source as it was.
    again = replace(fork_opts, resume=None, continue_session=fork)
    async with live.running(again) as seat:
        assert await ready(seat, t) == fork
        told = await ask(seat, "remember the phrase maple-rocket-7", "f2", t)
        assert told == TurnOutcome("ok", "Noted: maple-rocket-7.")
        (fork_file,) = [f for f in live.store_files(seat.spec) if f != source_file]
    assert file_sha256(source_file) == before
    assert file_sha256(fork_file) != before
