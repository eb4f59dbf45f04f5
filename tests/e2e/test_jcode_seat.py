"""A jcode seat is drain-only: the checkpoint says so and a resume starts it fresh, saying so.

jcode cannot be installed here; the seat runs `tests/fixtures/jcode_standin.py`, a stand-in
speaking the jcode connector's JSON-lines protocol (it is not jcode).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from manager.checkpoint.reader import verify_integrity
from tests.conftest import REPO, Cli, SharedBroker
from tests.gitrepo import git, init_repo, write
from tests.helpers import trusting

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]
STANDIN = REPO / "tests" / "fixtures" / "jcode_standin.py"


async def test_jcode_is_drain_only_through_the_cut_and_the_resume(
    tmp_path: Path, cli: Cli, shared_broker: SharedBroker
) -> None:
    init_repo(cli.root)
    write(cli.root / "README.md", "# jcode\n")
    git(cli.root, "add", "-A")
    git(cli.root, "commit", "-q", "-m", "first")
    config = f'[agents.jcode]\nbinary = "{STANDIN}"\n'
    (cli.root / "cotal.toml").write_text(config)
    b = ["--server", shared_broker.url, "--creds", shared_broker.creds]
    cli.run("up", "--detach", *b)
    row = cli.json("spawn", "jc", "--agent", "jcode")
    assert row["continuity"] == "drain-only"
    assert cli.json("send", "jc", "hello jcode", "--wait")["reply"]
    cut = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    [seat] = cut["seats"]
    assert seat["continuity"] == "drain-only" and seat["sessionId"] is None
    [record] = verify_integrity(Path(cut["checkpointDir"]))
    assert record.session.continuity == "drain-only" and record.session.session_id is None
    assert record.entry["launch"].get("sessionId") is None
    carried = tmp_path / "carried"
    shutil.copytree(cut["checkpointDir"], carried)
    shutil.rmtree(cli.root)
    cli.root.mkdir()
    (cli.root / "cotal.toml").write_text(config)
    out = cli.run("up", "--restore", str(carried), *b, *trusting(carried), "--json")
    [obs] = json.loads(out.stdout)["seats"]
    assert obs["continuity"] == "drain-only"
    assert (
        obs["observation"] == "started fresh: this harness cannot continue a session (drain-only)"
    )
    assert obs["sessionBefore"] is None and obs["sameUid"] is True
    # The same inbox (same uid), a fresh session: it still takes mail.
    assert cli.json("send", "jc", "hello again", "--wait")["reply"]
    cli.run("down")
