"""A real pi seat and a real Claude Code seat taken over from a dead host (issue 39, item 4),
each against its fake model server (a real process logging every request).

Host A (`[failover] enabled, after_s = 2`) runs the seat and is SIGKILLed whole; a standby on
the same broker runs it from its standing checkpoint: same uid and session, and the provider
sees the earlier turn's history in the first request from the standby's incarnation.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PI_CLI, AnthropicServer, Cli, FakeServer, SharedBroker
from tests.e2e.test_move import committed_root
from tests.gitrepo import git, init_repo, write
from tests.harness import claude_installed
from tests.helpers import ask, processes_mentioning, signer_key, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PHRASE = "kittiwake-taken-39"
KEY_VAR = "FAKE_ANTHROPIC_KEY"
ENV = {KEY_VAR: "sk-ant-fake-e2e-key-0123456789"}


def _root(path: Path, b: SharedBroker, toml: str, env: dict[str, str]) -> Cli:
    committed_root(path)
    (path / "cotal.toml").write_text(toml)
    cli = Cli(path, env=dict(env))
    cli.run("up", "--detach", "--server", b.url, "--creds", b.creds)
    return cli


def _kill_tree(cli: Cli) -> None:
    """The host dies: its manager, and each seat's whole process group (the harness and what
    it started under it), SIGKILL."""
    manager = int(cli.json("status")["pid"])
    groups = {os.getpgid(int(r["pid"])) for r in cli.ps() if r.get("pid")}
    os.kill(manager, signal.SIGKILL)
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


async def _taken_over(
    tmp_path: Path, b: SharedBroker, agent: str, config: str, env: dict[str, str]
) -> tuple[dict[str, Any], Cli]:
    """Spawn the seat on A, tell it the phrase, kill A; the standby's row once it runs the seat,
    and the standby."""
    a = _root(tmp_path / "a", b, "[failover]\nenabled = true\nafter_s = 2\n" + config, env)
    s = _root(tmp_path / "s", b, "[failover]\nstandby = true\n" + config, env)
    repo = init_repo(a.root / "h")
    write(repo / "notes.txt", "h\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "h")
    seat = a.json(
        "spawn", "h", "--agent", agent, "--cwd", str(repo),
        "--prompt", f"Remember the phrase {PHRASE}.",
    )  # fmt: skip
    assert ask(a, "h", "What was the phrase?") == f"The phrase is {PHRASE}."
    s.run("trust", "add", signer_key(a.root), "--name", "host-a")
    _kill_tree(a)
    await wait_until(
        lambda: [r["state"] for r in s.ps() if r["name"] == "h"] == ["running"],
        timeout=120,
        every=0.5,
    )
    [row] = [r for r in s.ps() if r["name"] == "h"]
    assert (row["lifecycleUid"], row["sessionId"]) == (seat["lifecycleUid"], seat["sessionId"])
    # The standby's seat runs (a harness may start children of its own that carry the uid
    # too); nothing of host A does.
    assert row["pid"] in processes_mentioning(seat["lifecycleUid"])
    assert processes_mentioning(f"{a.root}/") == []
    return row, s


@pytest.mark.pi
@pytest.mark.skipif(not PI_CLI.is_file(), reason="pi is not installed (make harnesses)")
async def test_a_pi_seat_is_taken_over_with_its_session(
    tmp_path: Path, shared_broker: SharedBroker, fake_openai: FakeServer
) -> None:
    config = f'[agents.pi]\nbase_url = "{fake_openai.base_url}"\nmodel = "fake-model"\n'
    _, s = await _taken_over(tmp_path, shared_broker, "pi", config, {})
    try:
        before = len(fake_openai.requests())
        assert ask(s, "h", "What was the phrase again?") == f"The phrase is {PHRASE}."
        # The standby's pi sent the earlier turns as history: it reopened the same session.
        first = fake_openai.requests()[before]
        assert any(PHRASE in t for t in fake_openai.user_texts(first)[:-1])
    finally:
        for root in (tmp_path / "a", tmp_path / "s"):
            if (root / ".cotal" / "mesh.json").exists():
                Cli(root).run("down", check=False)


@pytest.mark.claude
@pytest.mark.skipif(not claude_installed(), reason="Claude Code is not installed (make harnesses)")
async def test_a_claude_seat_is_taken_over_with_its_session(
    tmp_path: Path, shared_broker: SharedBroker, fake_anthropic: AnthropicServer
) -> None:
    config = (
        f'[agents.claude]\nbase_url = "{fake_anthropic.base_url}"\nmodel = "claude-fake-1"\n'
        f'api_key_env = "{KEY_VAR}"\n'
    )
    row, s = await _taken_over(tmp_path, shared_broker, "claude", config, ENV)
    try:
        before = len(fake_anthropic.messages())
        assert ask(s, "h", "What was the phrase again?") == f"The phrase is {PHRASE}."
        # The standby's Claude Code resumed the same session: the earlier turns are its history.
        first = fake_anthropic.messages()[before]
        assert first["session"] == row["sessionId"]
        assert any(PHRASE in text for _, text in fake_anthropic.turns(first)[:-1])
    finally:
        for root in (tmp_path / "a", tmp_path / "s"):
            if (root / ".cotal" / "mesh.json").exists():
                Cli(root, env=dict(ENV)).run("down", check=False)
