"""`[failover]` in cotal.toml: off by default, strict, `after_s` bounded with a refusal that names
the bound and the cure."""

from __future__ import annotations

from pathlib import Path

import pytest

from manager import registry
from protocol.errors import Refusal


def _load(tmp_path: Path, text: str) -> registry.FileConfig:
    (tmp_path / "cotal.toml").write_text(text)
    return registry.load_config(tmp_path)


def test_failover_is_off_by_default_with_thirty_seconds(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "")
    assert (cfg.failover.enabled, cfg.failover.after_s) == (False, 30.0)


def test_failover_reads_enabled_and_after_s(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "[failover]\nenabled = true\nafter_s = 3\n")
    assert (cfg.failover.enabled, cfg.failover.after_s) == (True, 3.0)


@pytest.mark.parametrize("after_s", ["1.5", "0", "-1", "3601"])
def test_an_after_s_out_of_bounds_is_refused_naming_the_bounds(
    tmp_path: Path, after_s: str
) -> None:
    with pytest.raises(Refusal) as caught:
        _load(tmp_path, f"[failover]\nenabled = true\nafter_s = {after_s}\n")
    assert caught.value.code == "bad-config"
    assert "outside 2 to 3600 seconds: set it between them" in caught.value.message


def test_an_unknown_failover_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as caught:
        _load(tmp_path, "[failover]\nenabled = true\nstandby_after = 3\n")
    assert "unknown field `standby_after`" in caught.value.message
