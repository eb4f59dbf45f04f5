"""Claude Code seats authenticate with a key read at every spawn, or with the operator's
`claude login`, against the real pinned Claude Code and a real fake Anthropic server process.

The fake is tests/fixtures/fake_anthropic.py with its request log extended by a fingerprint
(sha256) of the `x-api-key` and `Authorization` headers each request carried, so the test sees
which credential reached the provider without the log ever holding one.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from connectors.base import LaunchOpts, TurnOutcome
from connectors.claude_code import ClaudeCodeConnector, ClaudeDriver
from protocol.errors import Refusal
from tests.conftest import REPO
from tests.harness import Seat, running_seat, seat_opts


def _claude_installed() -> str | None:
    from manager.cli.tools import which

    try:
        which("claude")
    except Refusal as exc:
        return exc.text
    return None


NOT_INSTALLED = _claude_installed()
pytestmark = [
    pytest.mark.claude,
    pytest.mark.skipif(
        NOT_INSTALLED is not None, reason=f"Claude Code is not installed: {NOT_INSTALLED}"
    ),
]

TIMEOUT = 60
PHRASE = "juniper-ledger-41"

RECORDING_FAKE = """
import hashlib, sys
from tests.fixtures import fake_anthropic
from tests.fixtures.fakecommon import LoggingServer, serve

def fingerprint(value):
    return None if value is None else hashlib.sha256(value.encode()).hexdigest()

class Handler(fake_anthropic.Handler):
    def _record(self, body):
        self.server.append_log({
            "method": self.command,
            "path": self.path,
            "session": self.headers.get("X-Claude-Code-Session-Id"),
            "apiKey": fingerprint(self.headers.get("x-api-key")),
            "authorization": fingerprint(self.headers.get("authorization")),
            "beta": self.headers.get("anthropic-beta") or "",
        })

sys.exit(serve("recording fake", lambda p, log: LoggingServer(p, log, Handler), log_help="log"))
"""


def fingerprint(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@dataclass
class RecordingFake:
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def messages(self, session: str | None) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        records = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [
            r
            for r in records
            if r["method"] == "POST"
            and r["path"].split("?")[0] == "/v1/messages"
            and r["session"] == session
        ]


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[RecordingFake]:
    proc = subprocess.Popen(
        [sys.executable, "-c", RECORDING_FAKE, "--port", "0", "--log", str(tmp_path / "req.jsonl")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        why = proc.stderr.read() if not line and proc.stderr else ""
        assert line.strip().isdigit(), f"fake server did not print its port: {line!r} {why}"
        yield RecordingFake(int(line), tmp_path / "req.jsonl")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def root(root: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("ANTHROPIC_API_KEY", "CLAUDE_CONFIG_DIR", "CLAUDE_CODE_OAUTH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "0")
    return root


def opts(root: Path, fake: RecordingFake, name: str, **config: Any) -> LaunchOpts:
    return seat_opts(
        root,
        "claude",
        name,
        cwd=root,
        config={
            "base_url": fake.base_url,
            "model": "claude-fake-1",
            "extra_env": ["CLAUDE_CODE_MAX_RETRIES"],
            **config,
        },
    )


async def one_turn(opts: LaunchOpts, log_dir: Path) -> tuple[str, list[str]]:
    """Run a seat for one turn; its session id and the argv its process really ran with."""
    async with running_seat(
        ClaudeCodeConnector(), opts, log_dir, timeout=TIMEOUT, seat=Seat[ClaudeDriver]
    ) as seat:
        with anyio.fail_after(TIMEOUT):
            outcome = await seat.driver.prompt(f"remember the phrase {PHRASE}", message_id="m1")
        assert outcome == TurnOutcome("ok", f"Noted: {PHRASE}.")
        cmdline = Path(f"/proc/{seat.proc.pid}/cmdline").read_bytes().split(b"\0")
        sid = seat.driver.session_id
    assert sid is not None
    return sid, [a.decode() for a in cmdline]


def nowhere_under(root: Path, secrets: list[str]) -> None:
    for path in root.rglob("*"):
        assert not path.is_symlink(), f"{path} is a symlink: a checkpoint refuses the store"
        if path.is_file():
            data = path.read_bytes()
            for secret in secrets:
                assert secret.encode() not in data, f"a credential leaked into {path}"


@pytest.mark.anyio
async def test_key_file_is_read_at_each_spawn(
    root: Path, fake: RecordingFake, tmp_path: Path
) -> None:
    first, second = "sk-ant-fake-first-0123456789", "sk-ant-fake-second-9876543210"
    key_file = tmp_path / "claude.key"
    key_file.write_text(first + "\n")
    key_file.chmod(0o600)
    sid1, argv1 = await one_turn(opts(root, fake, "alice", api_key_file=str(key_file)), tmp_path)
    # Rotated in the file, not in the manager's environment: the next spawn uses it.
    key_file.write_text(second + "\n")
    sid2, argv2 = await one_turn(opts(root, fake, "bob", api_key_file=str(key_file)), tmp_path)

    for sid, key in ((sid1, first), (sid2, second)):
        seen = fake.messages(sid)
        assert seen and {(r["apiKey"], r["authorization"]) for r in seen} == {
            (fingerprint(key), None)
        }
    assert not any(k in a for a in argv1 + argv2 for k in (first, second))
    nowhere_under(root, [first, second])


@pytest.mark.anyio
async def test_the_operators_login_is_used_when_no_key_is_set(
    root: Path, fake: RecordingFake, isolated_home: Path, tmp_path: Path
) -> None:
    token, refresh = "sk-ant-oat01-fake-login-0123456789", "sk-ant-ort01-fake-refresh-0123"
    login = isolated_home / ".claude" / ".credentials.json"
    login.parent.mkdir(mode=0o700)
    login.write_text(
        json.dumps(
            {
                "claudeAiOauth": {
                    "accessToken": token,
                    "refreshToken": refresh,
                    "expiresAt": int((time.time() + 3600) * 1000),
                    "scopes": ["user:inference", "user:profile"],
                    "subscriptionType": "max",
                }
            }
        )
    )
    login.chmod(0o600)
    before = login.read_bytes()
    sid, argv = await one_turn(opts(root, fake, "carol"), tmp_path)

    seen = fake.messages(sid)
    assert seen and {(r["apiKey"], r["authorization"]) for r in seen} == {
        (None, fingerprint(f"Bearer {token}"))
    }
    # Claude Code sends a login's token as OAuth, with the beta that marks it so.
    assert all("oauth-2025-04-20" in r["beta"].split(",") for r in seen)
    assert login.read_bytes() == before
    assert not any(s in a for a in argv for s in (token, refresh))
    nowhere_under(root, [token, refresh])


def test_no_key_and_no_login_is_refused_before_anything_runs(
    root: Path, fake: RecordingFake
) -> None:
    with pytest.raises(Refusal) as exc:
        ClaudeCodeConnector().build_launch(opts(root, fake, "dave"))
    assert exc.value.code == "no-credentials"
    assert "no API key" in exc.value.message and "no Claude login" in exc.value.message
    assert not (root / ".cotal").exists()
