"""What each connector declares it was measured against, and the one decision a move's probe and
a restore's admission make of it (`admit.harness_refusal`)."""

from __future__ import annotations

import pytest

from connectors.base import MeasuredVersions, measured_versions
from connectors.doctorkit import HarnessCheck, Missing, Pins
from connectors.harnesses import load_pins
from connectors.scribe.connector import ScribeConnector
from manager import registry
from manager.checkpoint.admit import harness_refusal


def test_each_connector_declares_its_pin_its_own_version_or_none() -> None:
    pins = Pins.load()
    found = load_pins()
    for agent, pin in (("pi", "pi"), ("claude", "claude"), ("codex", "codex")):
        measured = measured_versions(registry.load_connector(agent), pins)
        assert measured is not None and str(measured) == found[pin].version
    scribe = measured_versions(registry.load_connector("scribe"), pins)
    assert scribe is not None and str(scribe) == ScribeConnector.builtin_version()
    assert measured_versions(registry.load_connector("jcode"), pins) is None


@pytest.mark.parametrize(
    ("version", "admitted"),
    [
        ("0.73.1", True),
        ("pi 0.73.1", True),
        ("0.74.2", True),
        ("0.75.0", True),
        ("0.75.1", False),
        ("0.74.0-rc1", False),
        ("0.73.0", False),
        ("built-in", False),
    ],
)
def test_a_declared_range_admits_plain_numbers_inside_it(version: str, admitted: bool) -> None:
    assert MeasuredVersions.of(["0.73.1", "0.74.0..0.75.0"]).admits(version) is admitted


def test_a_range_that_is_not_low_to_high_is_refused() -> None:
    with pytest.raises(ValueError):
        MeasuredVersions.of(["0.75.0..0.74.0"])


WORDS = {"where": "this host", "ran": "ran", "elsewhere": "go elsewhere", "tail": "; nothing"}
PINNED = MeasuredVersions.of(["0.73.1"])


def test_the_decision() -> None:
    ok = HarnessCheck(installed=True, path="/p", version="0.73.1", usable=True)
    assert harness_refusal("s", "pi", "0.73.1", ok, PINNED, **WORDS) is None
    # Either side unknown: nothing to compare.
    assert harness_refusal("s", "pi", None, ok, PINNED, **WORDS) is None
    unknown = HarnessCheck(installed=True, path="/p", version=None, usable=True)
    assert harness_refusal("s", "pi", "0.0.9", unknown, PINNED, **WORDS) is None

    other = HarnessCheck(installed=True, path="/p", version="0.0.9", usable=True)
    refusal = harness_refusal("s", "pi", "0.73.1", other, PINNED, **WORDS)
    assert refusal is not None and refusal.code == "harness-version"
    assert refusal.message == (
        "seat s: this host has pi 0.0.9 (/p), the seat ran 0.73.1 at the source; this build's "
        "pi connector resumes sessions of pi 0.73.1 only"
    )
    assert refusal.cure == (
        "install pi 0.73.1 at the destination (`cotal tools install`, or agents.pi.binary in "
        "its cotal.toml), or go elsewhere; nothing"
    )
    refusal = harness_refusal("s", "pi", "0.0.9", ok, PINNED, **WORDS)
    assert refusal is not None and refusal.code == "harness-version"
    assert "the seat ran 0.0.9 at the source, and this build's pi connector" in refusal.message

    # A connector that declares nothing: the two hosts' versions compared with each other.
    assert harness_refusal("s", "jcode", "jcode 1.2", other, None, **WORDS) is not None
    same = HarnessCheck(installed=True, path="/p", version="1.2", usable=True)
    assert harness_refusal("s", "jcode", "jcode 1.2", same, None, **WORDS) is None

    missing = HarnessCheck(missing=[Missing("no program", "install it")])
    refusal = harness_refusal("s", "pi", "0.73.1", missing, PINNED, **WORDS)
    assert refusal is not None and refusal.code == "agent-unavailable"
    assert refusal.message == "seat s: this host cannot run pi: no program (install it)"
