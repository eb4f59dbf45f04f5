"""`[metrics] listen`: a loopback address and a port, or refused by name with the cure."""

from __future__ import annotations

from pathlib import Path

import pytest

from manager import registry
from protocol.errors import Refusal
from protocol.refusals import Code


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("127.3.2.1:1", ("127.3.2.1", 1)),
        ("[::1]:65535", ("::1", 65535)),
    ],
)
def test_loopback_addresses_are_taken(text: str, parsed: tuple[str, int]) -> None:
    assert registry.parse_listen(text) == parsed


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("0.0.0.0:9999", "0.0.0.0 is not a loopback address"),
        ("[::]:9464", ":: is not a loopback address"),
        ("10.1.2.3:9464", "10.1.2.3 is not a loopback address"),
        ("localhost:9464", "'localhost' is not an IP address"),
        ("::1:9464", "write the IPv6 address in brackets, [::1]:9464"),
        ("127.0.0.1", "'127.0.0.1' is not HOST:PORT"),
        ("127.0.0.1:", "'127.0.0.1:' is not HOST:PORT"),
        ("127.0.0.1:http", "'127.0.0.1:http' is not HOST:PORT"),
        ("127.0.0.1:0", "port 0 is not between 1 and 65535"),
        ("127.0.0.1:70000", "port 70000 is not between 1 and 65535"),
    ],
)
def test_other_addresses_are_refused_saying_why(text: str, said: str) -> None:
    with pytest.raises(ValueError) as raised:
        registry.parse_listen(text)
    assert str(raised.value) == said


def test_the_config_is_refused_by_name_with_the_cure(tmp_path: Path) -> None:
    (tmp_path / "cotal.toml").write_text('[metrics]\nlisten = "0.0.0.0:9999"\n')
    with pytest.raises(Refusal) as raised:
        registry.load_config(tmp_path)
    assert raised.value.code == Code.BAD_CONFIG
    assert "[metrics] listen = '0.0.0.0:9999': 0.0.0.0 is not a loopback address" in (
        raised.value.message
    )
    assert 'listen = "127.0.0.1:9464"' in raised.value.cure


def test_off_by_default_and_strict_about_keys(tmp_path: Path) -> None:
    assert registry.load_config(tmp_path).metrics.listen is None
    (tmp_path / "cotal.toml").write_text("[metrics]\nport = 9464\n")
    with pytest.raises(Refusal) as raised:
        registry.load_config(tmp_path)
    assert raised.value.code == Code.BAD_CONFIG
