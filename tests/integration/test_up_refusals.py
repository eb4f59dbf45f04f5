"""`cotal up` on a root it cannot use refuses by name before it starts or writes anything."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Cli

pytestmark = pytest.mark.usefixtures("isolated_home")


def refusal(cli: Cli, *args: str) -> dict[str, str]:
    proc = cli.run("up", "--detach", "--json", *args, check=False)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    doc: dict[str, str] = json.loads(proc.stderr.strip().splitlines()[-1])
    return doc


def entries(root: Path) -> list[str]:
    return sorted(os.listdir(root))


@pytest.mark.parametrize("restore", [False, True])
def test_a_control_path_that_is_a_file_or_a_symlink_refuses(
    cli: Cli, tmp_path: Path, restore: bool
) -> None:
    extra = ["--restore", str(tmp_path / "nowhere")] if restore else []
    (cli.root / ".cotal").write_text("not cotal's\n")
    doc = refusal(cli, *extra)
    assert doc["code"] == "bad-control-dir"
    assert doc["error"] == (
        f"{cli.root / '.cotal'} is a file, not a directory; cotal keeps its tokens, broker store "
        f"and logs in that directory; move {cli.root / '.cotal'} aside (it is not cotal's), then "
        "rerun `cotal up`"
    )
    assert (cli.root / ".cotal").read_text() == "not cotal's\n"
    (cli.root / ".cotal").unlink()
    (tmp_path / "elsewhere").mkdir()
    (cli.root / ".cotal").symlink_to(tmp_path / "elsewhere")
    doc = refusal(cli, *extra)
    assert doc["code"] == "bad-control-dir" and "is a symlink" in doc["error"]
    assert os.listdir(tmp_path / "elsewhere") == []


def test_a_malformed_cotal_toml_is_bad_config_before_anything_starts(cli: Cli) -> None:
    (cli.root / "cotal.toml").write_text("garbage = [\n")
    doc = refusal(cli)
    assert doc["code"] == "bad-config"
    assert doc["error"].startswith(f"{cli.root / 'cotal.toml'} is not valid TOML: ")
    assert entries(cli.root) == ["cotal.toml"]
    (cli.root / "cotal.toml").write_text("[agents.scribe]\nno_such_key = 1\n")
    doc = refusal(cli)
    assert doc["code"] == "bad-config" and "is malformed" in doc["error"]
    assert entries(cli.root) == ["cotal.toml"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
def test_a_read_only_root_refuses_by_name(cli: Cli) -> None:
    root = str(cli.root)
    subprocess.run(["mount", "--bind", root, root], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", root], check=True)
        doc = refusal(cli)
        assert doc["code"] == "root-not-writable"
        assert doc["error"] == (
            f"{root} is on a read-only file system; cotal writes its control directory there; "
            "remount it read-write, or run `cotal up` in a writable workspace root"
        )
    finally:
        subprocess.run(["umount", root], check=True)
    assert entries(cli.root) == []
