"""Every harness `manager.registry.KNOWN` names is one the operator can see: a row of `cotal
doctor` and a choice in `cotal spawn --help`. Both lists are read from KNOWN, so a harness added
there cannot be hidden from either by a hand-written list left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from manager import registry
from manager.cli.output import EX_OK
from protocol.errors import Refusal
from protocol.refusals import Code
from tests.conftest import cotal_env


def cotal(root: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "manager.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=cotal_env(env),
        cwd=root,
    )


def test_doctor_has_a_row_for_every_known_harness(root: Path, tmp_path: Path) -> None:
    # Nothing installed: the rows come from each connector, not from what this host has.
    tools = tmp_path / "tools"
    tools.mkdir()
    proc = cotal(root, "doctor", "--json", "--root", str(root), env={"COTAL_TOOLS_DIR": str(tools)})
    assert (proc.returncode, proc.stderr) == (EX_OK, "")
    names = [json.loads(line)["name"] for line in proc.stdout.splitlines()]
    assert names == [*registry.KNOWN, "isolation", "clock"]


def test_spawn_help_names_every_known_harness(root: Path) -> None:
    # Wide enough that argparse never wraps a name at its hyphen.
    proc = cotal(root, "spawn", "--help", env={"COLUMNS": "1000"})
    assert (proc.returncode, proc.stderr) == (EX_OK, "")
    [agent] = [line for line in proc.stdout.splitlines() if line.lstrip().startswith("--agent")]
    choices = agent.split("the harness: ", 1)[1].split(" (default: ")[0].split(" | ")
    assert choices == list(registry.KNOWN)
    assert agent.endswith(f"(default: {registry.DEFAULT_AGENT})")


def test_each_connector_declares_its_configuration_as_one_strict_struct() -> None:
    for name in registry.KNOWN:
        config_type = registry.load_connector(name).config_type
        assert issubclass(config_type, msgspec.Struct), name
        assert config_type.__struct_config__.forbid_unknown_fields, name
        # The manager reads `model` itself, as a seat's default model and its profile's.
        assert "model" in config_type.__struct_fields__, name


def test_a_key_the_harness_does_not_take_is_refused_with_the_keys_it_does(root: Path) -> None:
    # permission_mode is Claude Code's; pi has no such setting, and names what it has.
    (root / "cotal.toml").write_text(
        '[agents.pi]\nbase_url = "http://127.0.0.1:9/v1"\npermission_mode = "plan"\nnope = 1\n'
    )
    with pytest.raises(Refusal) as refused:
        registry.load_config(root)
    assert refused.value.code == Code.BAD_CONFIG
    assert refused.value.message == (
        f"{root / 'cotal.toml'} is malformed: [agents.pi] has unknown key(s) nope, permission_mode"
    )
    assert refused.value.cure == (
        "remove them; pi honours api_key_env, base_url, binary, extra_env, model, provider"
    )
    (root / "cotal.toml").write_text("[agents.jcode]\nhome = 7\n")
    with pytest.raises(Refusal) as typed:
        registry.load_config(root)
    assert typed.value.code == Code.BAD_CONFIG
    assert typed.value.message == (
        f"{root / 'cotal.toml'} is malformed: [agents.jcode]: Expected `str | null`, got `int` "
        "- at `$.home`"
    )
