"""Resume on a host whose workspace root is at another absolute path (issue #12 item 3).

Host A's root is `<tmp>/hostA/ws`; host B's is `<tmp>/hostB/work/ws2`. The source tree is taken
away before host B's is laid down. Seats under the source root land at the same place under the
destination root; a seat whose cwd was outside it needs `--map OLD=NEW`, and is refused by name
without one.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from manager.cli.tools import which
from protocol.errors import Refusal
from tests.conftest import PI_CLI, AnthropicServer, Cli, FakeServer, SharedBroker
from tests.e2e.test_resume import PHRASE, make_workspace, porcelain
from tests.gitrepo import git, init_repo, tree_digest, write
from tests.helpers import signer_key

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]


def _hosts(tmp_path: Path) -> tuple[Cli, Cli]:
    source = tmp_path / "hostA" / "ws"
    source.mkdir(parents=True)
    return Cli(source), Cli(tmp_path / "hostB" / "work" / "ws2")


def _broker_args(b: SharedBroker | None) -> list[str]:
    """A shared broker, or none: each host then runs its own embedded one, and nothing but the
    carried checkpoint passes between them."""
    return [] if b is None else ["--server", b.url, "--creds", b.creds]


def _spawn_and_cut(
    a: Cli,
    b: SharedBroker | None,
    cwd: Path,
    *,
    agent: str = "scribe",
    env: dict[str, str] | None = None,
) -> tuple[dict[str, Any], Path]:
    a.run("up", "--detach", *_broker_args(b), env=env)
    row = a.json(
        "spawn",
        "default",
        "--agent",
        agent,
        "--cwd",
        str(cwd),
        "--prompt",
        f"Remember the phrase {PHRASE}. Reply with it.",
    )
    result = json.loads(a.run("down", "--preserve-state", "--json").stdout)
    assert result["journal"] == "ready"
    return row, Path(result["checkpointDir"])


def _carry(a: Cli, dest: Cli, attempt_dir: Path, tmp_path: Path) -> Path:
    """Host A's attempt copied out, host A's tree gone, host B's root made and host A's key
    trusted there, as an operator carries it."""
    key = signer_key(a.root)
    copy = tmp_path / "carried" / attempt_dir.name
    shutil.copytree(attempt_dir, copy, symlinks=True)
    shutil.rmtree(a.root)
    dest.root.mkdir(parents=True)
    dest.run("trust", "add", key, "--name", "host-a")
    return copy


def _restore(
    dest: Cli,
    copy: Path,
    b: SharedBroker | None,
    *extra: str,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> Any:
    proc = dest.run(
        "up",
        "--restore",
        str(copy),
        *_broker_args(b),
        "--json",
        *extra,
        check=check,
        env=env,
    )
    return proc if not check else json.loads(proc.stdout)


def _listing(top: Path) -> list[tuple[str, int]]:
    return sorted(
        (str(p.relative_to(top)), p.stat().st_size if p.is_file() else -1) for p in top.rglob("*")
    )


@pytest.mark.parametrize("where", ["cwd-is-root", "cwd-is-subdirectory"])
async def test_a_seat_resumes_exactly_under_a_root_at_another_path(
    tmp_path: Path, shared_broker: SharedBroker, where: str
) -> None:
    a, dest = _hosts(tmp_path)
    rel = "." if where == "cwd-is-root" else "sub"
    cwd = a.root / rel
    make_workspace(cwd)
    status_before, bytes_before = porcelain(cwd), tree_digest(cwd)
    row, attempt_dir = _spawn_and_cut(a, shared_broker, cwd)
    copy = _carry(a, dest, attempt_dir, tmp_path)
    assert not a.root.exists()

    result = _restore(dest, copy, shared_broker)
    new_cwd = dest.root / rel if rel != "." else dest.root
    [seat] = result["seats"]
    assert seat["continuity"] == "exact" and seat["sameSession"] and seat["sameUid"]
    assert seat["sessionBefore"] == row["sessionId"] == seat["sessionAfter"]
    assert seat["relocated"] == {"cwdBefore": str(cwd.resolve()), "cwdAfter": str(new_cwd)}
    [ps] = dest.ps()
    assert ps["cwd"] == str(new_cwd) and ps["lifecycleUid"] == row["lifecycleUid"]
    assert str(new_cwd) in dest.run("ps", "--wide").stdout
    assert (
        dest.json("send", "default", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    # The tree came back byte for byte, with the same git status, at the new path.
    assert porcelain(new_cwd) == status_before
    assert tree_digest(new_cwd) == bytes_before
    # The root journals the relocated plan: a manager restarted later re-adopts the seat there.
    resume_doc = json.loads((dest.root / ".cotal/maintenance/v1/resume.json").read_text())
    [agent] = resume_doc["agents"]
    assert agent["launch"]["cwd"] == str(new_cwd)
    assert all(s.startswith(str(dest.root)) for s in agent["launch"]["sessionStores"])
    dest.run("down")


async def test_a_cwd_outside_the_source_root_needs_a_map(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    a, dest = _hosts(tmp_path)
    outside = tmp_path / "hostA" / "shared"
    make_workspace(outside)
    status_before, bytes_before = porcelain(outside), tree_digest(outside)
    row, attempt_dir = _spawn_and_cut(a, shared_broker, outside)
    copy = _carry(a, dest, attempt_dir, tmp_path)
    shutil.rmtree(outside)

    before = _listing(dest.root)
    proc = _restore(dest, copy, shared_broker, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    refusal = json.loads(proc.stderr.splitlines()[-1])
    assert refusal["code"] == "cwd-unmapped", refusal
    assert str(outside.resolve()) in refusal["error"] and "--map" in refusal["error"], refusal
    # Refused at admission: nothing written, no journal, no manager.
    assert _listing(dest.root) == before
    assert not (dest.root / ".cotal/maintenance/v1/journal.json").exists()
    verify = dest.run(
        "checkpoint",
        "verify",
        str(copy),
        "--server",
        shared_broker.url,
        "--creds",
        shared_broker.creds,
        "--json",
        check=False,
    )
    assert verify.returncode == 2 and json.loads(verify.stderr.splitlines()[-1])["code"] == (
        "cwd-unmapped"
    )

    there = tmp_path / "hostB" / "shared2"
    there.mkdir()
    mapping = f"{outside.resolve()}={there}"
    verified = json.loads(
        dest.run(
            "checkpoint",
            "verify",
            str(copy),
            "--server",
            shared_broker.url,
            "--creds",
            shared_broker.creds,
            "--json",
            "--map",
            mapping,
        ).stdout
    )
    assert verified["seats"][0]["relocated"]["cwdAfter"] == str(there)
    result = _restore(dest, copy, shared_broker, "--map", mapping)
    [seat] = result["seats"]
    assert seat["continuity"] == "exact" and seat["sessionAfter"] == row["sessionId"]
    assert dest.ps()[0]["cwd"] == str(there)
    assert porcelain(there) == status_before and tree_digest(there) == bytes_before
    assert (
        dest.json("send", "default", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    dest.run("down")


# -- real harnesses --------------------------------------------------------------------------------


def _repo(root: Path) -> None:
    init_repo(root)
    write(root / "README.md", "# relocated\n")
    # The operator's host configuration is not part of the seat's tree.
    write(root / ".gitignore", "cotal.toml\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")


@pytest.mark.pi
@pytest.mark.skipif(not PI_CLI.is_file(), reason="pi is not installed under .tools/pi")
async def test_a_pi_seat_continues_exactly_at_the_new_path(
    tmp_path: Path, fake_openai: FakeServer
) -> None:
    """Two hosts with nothing in common: each its own embedded broker, another root path."""
    a, dest = _hosts(tmp_path)
    _repo(a.root)
    config = f'[agents.pi]\nbase_url = "{fake_openai.base_url}"\nmodel = "fake-model"\n'
    (a.root / "cotal.toml").write_text(config)
    row, attempt_dir = _spawn_and_cut(a, None, a.root, agent="pi")
    copy = _carry(a, dest, attempt_dir, tmp_path)
    (dest.root / "cotal.toml").write_text(config)

    result = _restore(dest, copy, None)
    [seat] = result["seats"]
    assert seat["continuity"] == "exact" and seat["sessionAfter"] == row["sessionId"]
    assert result["sharedBroker"] is False
    [session] = (dest.root / ".cotal/sessions/pi").glob("*.store/*.jsonl")
    header = json.loads(session.read_text().splitlines()[0])
    assert header["id"] == row["sessionId"] and header["cwd"] == str(dest.root)
    assert (
        dest.json("send", "default", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    # pi ran the continued session at the new path: its system prompt names the new cwd.
    last = fake_openai.requests()[-1]
    system = " ".join(str(m.get("content")) for m in last["messages"] if m["role"] == "system")
    assert str(dest.root) in system and str(a.root) not in system
    dest.run("down")


def _claude_installed() -> bool:
    try:
        which("claude")
        return True
    except Refusal:
        return False


@pytest.mark.claude
@pytest.mark.skipif(not _claude_installed(), reason="Claude Code is not installed under .tools/")
async def test_a_claude_seat_continues_exactly_at_the_new_path(
    tmp_path: Path, fake_anthropic: AnthropicServer
) -> None:
    """Two hosts with nothing in common: each its own embedded broker, another root path."""
    env = {"FAKE_ANTHROPIC_KEY": "sk-ant-fake-e2e-key-0123456789"}
    a, dest = _hosts(tmp_path)
    _repo(a.root)
    config = (
        f'[agents.claude]\nbase_url = "{fake_anthropic.base_url}"\nmodel = "claude-fake-1"\n'
        'api_key_env = "FAKE_ANTHROPIC_KEY"\n'
    )
    (a.root / "cotal.toml").write_text(config)
    row, attempt_dir = _spawn_and_cut(a, None, a.root, agent="claude", env=env)
    copy = _carry(a, dest, attempt_dir, tmp_path)
    (dest.root / "cotal.toml").write_text(config)

    result = _restore(dest, copy, None, env=env)
    [seat] = result["seats"]
    assert seat["continuity"] == "exact", seat
    assert result["sharedBroker"] is False
    assert seat["sessionBefore"] == seat["sessionAfter"] == row["sessionId"]
    # The transcript moved to the project dir Claude Code keys the new cwd by.
    [transcript] = (dest.root / ".cotal/sessions/claude").glob(
        f"*.config/projects/*/{row['sessionId']}.jsonl"
    )
    assert transcript.parent.name == re.sub(r"[^A-Za-z0-9]", "-", str(dest.root.resolve()))
    assert (
        dest.json("send", "default", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    # The provider saw the continued session, under the same id, with its earlier turns.
    last = fake_anthropic.messages()[-1]
    assert last["session"] == row["sessionId"]
    assert any(PHRASE in text for _, text in AnthropicServer.turns(last)[:-1])
    dest.run("down")
