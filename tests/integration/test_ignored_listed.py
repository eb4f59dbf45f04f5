"""What a cut leaves behind is said before it is missed (issue 42 item 7): the ignored files of
a seat's tree that no declared path carries, counted, their bytes summed, the largest named, in
the cut's output, and never what `[carry] include` or `--include` carries."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from manager.checkpoint import ignored
from manager.checkpoint.ignored import survey_ignored
from protocol.control import IgnoredPath, IgnoredSurvey
from tests.conftest import Cli
from tests.gitrepo import committed_repo, git, write

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]


def ignoring_repo(path: Path) -> Path:
    """A repository whose ignored files are of every kind: a whole directory, files matched by
    a pattern, a secret the survey must name and never read, a declared build directory."""
    repo = committed_repo(path)
    write(repo / ".gitignore", "node_modules/\n*.log\n.env\nbuild/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignores")
    write(repo / "node_modules/left-pad/index.js", b"x" * 3000)
    write(repo / "node_modules/left-pad/package.json", b"y" * 200)
    write(repo / "node_modules/.bin/tool", b"z" * 100)
    # A link out of the tree is counted as the link, never followed.
    (repo / "node_modules/outside").symlink_to("/usr/bin/env")
    write(repo / "debug.log", b"l" * 40)
    write(repo / "src/trace.log", b"t" * 20)
    write(repo / ".env", "SECRET_TOKEN=never-read\n")
    write(repo / "build/out.bin", b"b" * 5000)
    write(repo / "untracked.txt", "carried as untracked, not ignored\n")
    return repo


LINK = len("/usr/bin/env")
MODULES = IgnoredPath(path="node_modules/", files=4, bytes=3000 + 200 + 100 + LINK)


async def test_the_survey_counts_what_no_declared_path_carries(tmp_path: Path) -> None:
    repo = ignoring_repo(tmp_path / "repo")
    survey = await survey_ignored(repo, ["build/*"])
    assert survey == IgnoredSurvey(
        files=7,
        bytes=MODULES.bytes + 40 + 20 + len("SECRET_TOKEN=never-read\n"),
        largest=[
            MODULES,
            IgnoredPath(path="debug.log", files=1, bytes=40),
            IgnoredPath(path=".env", files=1, bytes=24),
        ],
        complete=True,
    )
    # git lists `src/` (all of it ignored) and `src/trace.log` both: counted once (7, not 8).
    # Undeclared, the build directory is the largest thing left behind.
    undeclared = await survey_ignored(repo, [])
    assert undeclared.largest[0] == IgnoredPath(path="build/", files=1, bytes=5000)
    assert undeclared.files == 8
    # Declared to the file, a directory's carried files leave it.
    part = await survey_ignored(repo, ["build/*", "node_modules/left-pad/index.js"])
    assert part.largest[0] == IgnoredPath(path="node_modules/", files=3, bytes=300 + LINK)


async def test_the_survey_stops_at_its_budget_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = ignoring_repo(tmp_path / "repo")
    for n in range(50):
        write(repo / "node_modules" / "many" / f"f{n}.js", "m")
    monkeypatch.setattr(ignored, "WALK_BUDGET", 20)
    survey = await survey_ignored(repo, [])
    assert survey.complete is False and 0 < survey.files < 50


async def test_the_cut_lists_what_it_leaves_behind_and_not_what_it_carries(cli: Cli) -> None:
    first = ignoring_repo(cli.root / "first")
    second = ignoring_repo(cli.root / "second")
    (cli.root / "cotal.toml").write_text('[carry]\ninclude = ["build/*"]\n')
    cli.run("up", "--detach")
    try:
        for name, repo in (("first", first), ("second", second)):
            cli.json("spawn", name, "--agent", "scribe", "--cwd", str(repo), "--prompt", "hi")
        out = cli.run("down", "--preserve-state", "--seat", "first").stdout
        assert (
            "    not carried: 7 ignored file(s), 3.3 KiB (largest: node_modules/ 3.2 KiB in 4 "
            "files, debug.log 40 B, .env 24 B); `--include PATH` carries them, or accept their "
            "absence\n"
        ) in out, out
        assert "never-read" not in out
        # That cut is carried away (here: discarded) before the whole one runs.
        cli.run("checkpoint", "discard", out.split()[1])
        # The operator's --include carries node_modules too: only the rest is listed.
        whole = cli.run("down", "--preserve-state", "--include", "node_modules/**", "--json")
        [seat] = json.loads(whole.stdout)["seats"]
        assert seat["name"] == "second"
        assert seat["ignored"] == {
            "files": 3,
            "bytes": 84,
            "largest": [
                {"path": "debug.log", "files": 1, "bytes": 40},
                {"path": ".env", "files": 1, "bytes": 24},
                {"path": "src/", "files": 1, "bytes": 20},
            ],
            "complete": True,
        }
        assert os.path.exists(second / ".env")
    finally:
        cli.run("down", check=False)
