"""A real Codex seat under the real manager, offline against the fake Responses API, cut on one
root and resumed on a second root at another path, each with its own embedded broker.

Its thread is `exact`: the resumed seat reopens the same thread id under the same lifecycle
uid, its rollout's recorded cwd is the new root, the provider is sent the earlier turns, and a
decoy thread store in the destination's HOME (`~/.codex`) is never read.

It runs twice: with the roots under the temp directory (pytest's, which is Codex's: `$TMPDIR`,
else /tmp), and with `TMPDIR` elsewhere, as on a host whose roots are not under it. Codex then
keeps symlinks to its own binary in `$CODEX_HOME/tmp/arg0-linux/` while it runs: scratch the
connector declares (`store_scratch`), so the cut neither refuses them nor carries them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from connectors.codex import pinned_program
from protocol.errors import Refusal
from tests.conftest import Cli
from tests.fixtures.fake_responses import ResponsesServer
from tests.gitrepo import git, init_repo, write
from tests.helpers import signer_key


def _installed() -> bool:
    try:
        pinned_program()
        return True
    except Refusal:
        return False


pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not _installed(), reason="Codex is not installed under .tools/"),
]
PHRASE = "juniper-ledger-41"
KEY_VAR = "FAKE_OPENAI_KEY"
ENV = {KEY_VAR: "sk-fake-codex-e2e-key-0123456789"}
DECOY = "decoy-thread-99"


def configure(root: Path, server: ResponsesServer) -> None:
    (root / "cotal.toml").write_text(
        f'[agents.codex]\nbase_url = "{server.base_url}"\nmodel = "fake-model"\n'
        f'api_key_env = "{KEY_VAR}"\n'
    )


def plant_decoy(home: Path) -> Path:
    """A thread store where an unconfined Codex would look (`~/.codex`), naming a phrase the
    seat was never told."""
    day = home / ".codex" / "sessions" / "2026" / "01" / "01"
    day.mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text('model = "decoy"\n')
    decoy = day / "rollout-2026-01-01T00-00-00-00000000-0000-7000-8000-000000000000.jsonl"
    decoy.write_text(json.dumps({"type": "response_item", "text": DECOY}) + "\n")
    return decoy


def arg0_links(root: Path) -> list[Path]:
    """The links Codex keeps to its own binary in a seat's CODEX_HOME while it runs."""
    return sorted(
        p
        for p in (root / ".cotal/sessions/codex").glob("*.home/tmp/arg0-linux/*/*")
        if p.is_symlink()
    )


@pytest.mark.parametrize("temp", ["roots-inside", "roots-outside"])
async def test_codex_seat_through_the_cut_and_the_resume_at_another_path(
    tmp_path: Path,
    fake_responses: ResponsesServer,
    isolated_home: Path,
    temp: str,
) -> None:
    decoy = plant_decoy(isolated_home)
    before = decoy.read_bytes()
    settings: dict[str, str] = {}
    if temp == "roots-outside":
        systmp = tmp_path / "systmp"
        systmp.mkdir()
        settings["TMPDIR"] = str(systmp)
    a = Cli(tmp_path / "hostA" / "ws", env=settings)
    dest = Cli(tmp_path / "hostB" / "work" / "ws2", env=settings)
    a.root.mkdir(parents=True)
    init_repo(a.root)
    write(a.root / "README.md", "# codex\n")
    git(a.root, "add", "-A")
    git(a.root, "commit", "-q", "-m", "first")
    configure(a.root, fake_responses)
    a.run("up", "--detach", env=ENV)
    row = a.json(
        "spawn", "default", "--agent", "codex", "--prompt", f"Remember the phrase {PHRASE}."
    )
    assert row["continuity"] == "exact"
    assert (
        a.json("send", "default", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    links = [p.name for p in arg0_links(a.root)]
    assert links == (
        ["apply_patch", "applypatch", "codex-linux-sandbox"] if temp == "roots-outside" else []
    )
    cut = json.loads(a.run("down", "--preserve-state", "--json").stdout)
    [seat] = cut["seats"]
    assert seat["continuity"] == "exact" and seat["sessionId"] == row["sessionId"]
    record = json.loads((Path(cut["checkpointDir"]) / "default" / "checkpoint.json").read_bytes())
    carried_store = [
        Path(f["relpath"]).relative_to(".cotal/sessions/codex").parts[1:]
        for f in record["session"]["store"]
    ]
    assert carried_store and not [p for p in carried_store if p[0] in ("tmp", ".tmp")]

    key = signer_key(a.root)
    carried = tmp_path / "carried" / Path(cut["checkpointDir"]).name
    shutil.copytree(cut["checkpointDir"], carried, symlinks=True)
    shutil.rmtree(a.root)
    dest.root.mkdir(parents=True)
    dest.run("trust", "add", key, "--name", "host-a")
    configure(dest.root, fake_responses)
    result = json.loads(dest.run("up", "--restore", str(carried), "--json", env=ENV).stdout)
    [obs] = result["seats"]
    assert obs["continuity"] == "exact", obs
    assert obs["sessionBefore"] == obs["sessionAfter"] == row["sessionId"]
    assert obs["uidBefore"] == obs["uidAfter"] == row["lifecycleUid"]
    # The rollout records the cwd it now runs in.
    [rollout] = (dest.root / ".cotal/sessions/codex").glob(
        f"*/sessions/*/*/*/rollout-*-{row['sessionId']}.jsonl"
    )
    meta = json.loads(rollout.read_bytes().split(b"\n", 1)[0])
    assert meta["payload"]["cwd"] == str(dest.root)

    seen = len(fake_responses.responses())
    assert (
        dest.json("send", "default", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    [last] = fake_responses.responses()[seen:]
    assert last["body"]["prompt_cache_key"] == row["sessionId"]
    turns = ResponsesServer.turns(last)
    assert turns[0] == ("user", f"Remember the phrase {PHRASE}.")
    assert turns[-1] == ("user", "What was the phrase?")
    assert f"<cwd>{dest.root}</cwd>" in json.dumps(last["body"]["input"])

    # A fresh Codex seat on the destination knows nothing of it, nor of the decoy.
    dest.json("spawn", "fresh", "--agent", "codex")
    assert (
        dest.json("send", "fresh", "What was the phrase?", "--wait")["reply"]
        == "I do not know the phrase."
    )
    assert not any(DECOY in json.dumps(r["body"]) for r in fake_responses.responses())
    assert decoy.read_bytes() == before
    # The key never lands in any file of the workspace, logs and the seats' stores included.
    blob = b"".join(
        p.read_bytes() for p in dest.root.rglob("*") if p.is_file() and not p.is_symlink()
    )
    assert ENV[KEY_VAR].encode() not in blob
    dest.run("down")
