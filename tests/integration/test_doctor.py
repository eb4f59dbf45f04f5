"""`cotal doctor` judges only the harnesses a root uses: the built-in scribe, what cotal.toml
configures, and what the running manager's seats run. An unused harness that is absent is
reported and passes; a used one that is absent fails; a cotal.toml that cannot be read is a
refusal like any other command's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from manager.cli.output import EX_OK, EX_REFUSED
from tests.conftest import Cli, cotal_env

UNUSED = "not installed (not used by this root)"


def doctor(root: Path, *args: str, tools: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "manager.cli", "doctor", *args, "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        env=cotal_env({"COTAL_TOOLS_DIR": str(tools)} if tools else None),
        cwd=root,
    )


def rows(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in map(json.loads, proc.stdout.splitlines())}


@pytest.fixture
def no_tools(tmp_path: Path) -> Path:
    """A tools directory with nothing installed: the machine of an operator who runs scribe."""
    empty = tmp_path / "tools"
    empty.mkdir()
    return empty


def test_a_root_that_only_runs_scribe_passes_without_any_installed_harness(
    root: Path, no_tools: Path
) -> None:
    text = doctor(root, tools=no_tools)
    assert (text.returncode, text.stderr) == (EX_OK, "")
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["harness", "continuity", "state", "version", "program"]
    assert lines[1].split()[:3] == ["scribe", "exact", "ready"]
    assert [line.split(None, 4) for line in lines[2:5]] == [
        ["pi", "exact", "absent", "-", UNUSED],
        ["claude", "exact", "absent", "-", UNUSED],
        ["jcode", "drain-only", "absent", "-", UNUSED],
    ]

    machine = doctor(root, "--json", tools=no_tools)
    assert machine.returncode == EX_OK
    found = rows(machine)
    assert found["scribe"]["used_by"] == ["default agent"] and found["scribe"]["ready"]
    for name in ("pi", "claude", "jcode"):
        row = found[name]
        assert (row["used"], row["installed"], row["state"], row["note"]) == (
            False,
            False,
            "absent",
            UNUSED,
        )
        # Why it is absent stays in the record for a machine that wants to install it.
        assert row["missing"] and row["missing"][0]["kind"] == "program"


def test_a_configured_harness_that_is_not_installed_fails(root: Path, no_tools: Path) -> None:
    (root / "cotal.toml").write_text('[agents.pi]\nbase_url = "http://127.0.0.1:9/v1"\n')
    text = doctor(root, tools=no_tools)
    assert text.returncode == 1 and text.stderr == ""
    [pi] = [line for line in text.stdout.splitlines() if line.startswith("pi ")]
    assert pi.split() == ["pi", "exact", "absent", "-", "-"]
    assert (
        f"missing: harness pi (@mariozechner/pi-coding-agent@0.73.1) is not ready under "
        f"{no_tools / 'pi'}: it is not installed" in text.stdout
    )
    assert "cure:    run `cotal tools install` (`make harnesses` in a checkout)" in text.stdout
    found = rows(doctor(root, "--json", tools=no_tools))
    assert found["pi"]["used_by"] == ["cotal.toml"] and not found["pi"]["ready"]
    assert found["claude"]["note"] == UNUSED


def test_a_refused_configuration_is_a_refusal_on_stderr(root: Path) -> None:
    (root / "cotal.toml").write_text("[agents.nope]\nmodel = 'x'\n")
    text = doctor(root)
    assert (text.returncode, text.stdout) == (EX_REFUSED, "")
    assert text.stderr.startswith(f"cotal: {root / 'cotal.toml'} configures unknown agents: nope;")
    machine = doctor(root, "--json")
    assert (machine.returncode, machine.stdout) == (EX_REFUSED, "")
    refusal = json.loads(machine.stderr)
    assert (refusal["ok"], refusal["code"]) == (False, "bad-config")


def test_the_running_managers_seats_count_as_use(mesh: Cli, no_tools: Path) -> None:
    mesh.json("spawn", "w1", "--agent", "scribe")
    mesh.json("spawn", "w2", "--agent", "scribe")
    found = rows(doctor(mesh.root, "--json", tools=no_tools))
    assert found["scribe"]["used_by"] == ["default agent", "seat w1", "seat w2"]
    assert found["pi"]["used_by"] == []


def test_the_clock_row_says_whether_a_resume_here_can_judge_age(root: Path) -> None:
    hooked = rows(doctor(root, "--json"))["clock"]
    assert (hooked["synchronized"], hooked["source"], hooked["detail"]) == (
        True,
        "COTAL_TEST_CLOCK_STATUS",
        "COTAL_TEST_CLOCK_STATUS=synchronized",
    )
    assert "a test hook, never for a real destination" in hooked["warning"]
    env = {k: v for k, v in cotal_env().items() if k != "COTAL_TEST_CLOCK_STATUS"}
    proc = subprocess.run(
        [sys.executable, "-m", "manager.cli", "doctor", "--json", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=root,
    )
    kernel = rows(proc)["clock"]
    assert kernel["source"] == "kernel" and kernel["detail"].startswith("adjtimex state ")
    if kernel["synchronized"]:
        assert kernel["warning"] is None
    else:
        assert "refuses clock-unsynchronized" in kernel["warning"]


def test_the_clock_row_shows_an_operators_declaration_and_its_reason(root: Path) -> None:
    (root / "cotal.toml").write_text(
        '[recency]\nclock = "trusted"\nclock_reason = "the host keeps this container\'s clock"\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "manager.cli", "doctor", "--json", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        # The hook stands in for the kernel's unsynchronized answer, which the declaration meets.
        env=cotal_env({"COTAL_TEST_CLOCK_STATUS": "unsynchronized"}),
        cwd=root,
    )
    declared = rows(proc)["clock"]
    assert (declared["synchronized"], declared["source"], declared["detail"]) == (
        True,
        "cotal.toml [recency] clock",
        "trusted by the operator's declaration (the host keeps this container's clock); the "
        "kernel reads COTAL_TEST_CLOCK_STATUS=unsynchronized",
    )
    assert "every admission here journals and prints that" in declared["warning"]
