"""The jcode connector's declarations, refusals, private-home rule and wire codec.

No jcode runs here (jcode cannot be installed on this machine); `binary` points at a
placeholder. The stand-in harness is driven in tests/integration/test_jcode_connector.py.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from connectors.base import LaunchOpts, TurnOutcome
from connectors.jcode import (
    CONTINUE_REFUSED,
    RESUME_REFUSED,
    JcodeCodec,
    JcodeConnector,
    home_relparts,
    home_slug,
    private_home,
)
from connectors.jsonl_driver import Ready, Rejected, StateReported, TurnEnded
from protocol.errors import DecodeError, Refusal
from tests.harness import mode, placeholder_binary, seat_opts


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    return placeholder_binary(tmp_path, "jcode")


def opts_for(
    root: Path, binary: Path | None, *, space: str = "main", name: str = "alice", **kw: Any
) -> LaunchOpts:
    config = {"binary": str(binary)} if binary else {}
    config.update(kw.pop("config", {}))
    return seat_opts(root, "jcode", name, space=space, config=config, **kw)


def refusal(opts: LaunchOpts) -> Refusal:
    with pytest.raises(Refusal) as exc:
        JcodeConnector().build_launch(opts)
    return exc.value


# -- declarations and refusals ---------------------------------------------------------------------


def test_refuses_continuation_with_the_upstream_text(root: Path, binary: Path) -> None:
    exc = refusal(opts_for(root, binary, continue_session="standin-0123"))
    # The upstream wording is kept, so an operator sees what jcode itself would say.
    assert exc.code == "unsupported" and exc.message == CONTINUE_REFUSED
    assert "its private Harness API instance is retired with the seat" in CONTINUE_REFUSED
    assert "jcode seats are drain-only" in exc.cure
    assert not (root / ".cotal").exists()


def test_refuses_resume_with_the_upstream_text(root: Path, binary: Path) -> None:
    exc = refusal(opts_for(root, binary, resume="standin-0123"))
    assert exc.code == "unsupported" and exc.message == RESUME_REFUSED
    assert "never shares a session with another seat" in RESUME_REFUSED
    assert "without --resume" in exc.cure
    assert not (root / ".cotal").exists()


def test_unknown_config_keys_are_refused(root: Path, binary: Path) -> None:
    exc = refusal(opts_for(root, binary, config={"api_key_env": "X"}))
    assert exc.code == "bad-launch" and "config key(s) api_key_env" in exc.message
    assert "jcode honours binary, home, model" in exc.cure
    assert not (root / ".cotal").exists()


def test_missing_binary_is_refused_with_the_cure(
    root: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    exc = refusal(opts_for(root, None))
    assert exc.code == "not-installed" and "no `jcode` on the manager's PATH" in exc.message
    assert "agents.jcode.binary" in exc.cure


# -- the private home ------------------------------------------------------------------------------


def test_home_path_for_a_known_space_and_name(root: Path, binary: Path) -> None:
    spec = JcodeConnector().build_launch(opts_for(root, binary, space="main", name="alice"))
    digest = hashlib.sha256(b"main\0alice").hexdigest()[:12]
    assert digest == "46a95058fdb2"
    home = root / ".cotal" / "jcode" / "main-alice-46a95058fdb2"
    assert spec.env["JCODE_HOME"] == str(home)
    assert spec.env["COTAL_JCODE_HOME"] == str(root)
    assert [mode(root / ".cotal"), mode(root / ".cotal" / "jcode"), mode(home)] == [
        0o700,
        0o700,
        0o700,
    ]
    assert spec.argv == [str(binary), "--cotal-jsonl"]
    assert (
        spec.session_pointer_path is None
        and spec.session_store == ()
        and spec.expected_session_id is None
    )
    # The same seat gets the same home again; its mode is restored if someone loosened it.
    os.chmod(home, 0o755)
    assert JcodeConnector().build_launch(opts_for(root, binary, space="main", name="alice")).env[
        "JCODE_HOME"
    ] == str(home)
    assert mode(home) == 0o700


def test_slug_rule() -> None:
    assert home_slug("Main", "Alice_2") == "main-alice_2"
    assert home_slug("a.b c", "x") == "a-b-c-x"
    assert home_slug("-", "-") == "agent"
    long = home_slug("s" * 30, "n" * 30)
    assert len(long) == 40 and long == "s" * 30 + "-" + "n" * 9
    # A cut right after a dash leaves no trailing dash.
    assert home_slug("s" * 39, "n") == "s" * 39
    assert home_relparts("main", "alice") == (".cotal", "jcode", "main-alice-46a95058fdb2")


def test_home_config_moves_the_managed_root(root: Path, binary: Path) -> None:
    with pytest.raises(Refusal, match="cannot be opened: No such file or directory; create it"):
        JcodeConnector().build_launch(opts_for(root, binary, config={"home": "homes"}))
    (root / "homes").mkdir()
    spec = JcodeConnector().build_launch(opts_for(root, binary, config={"home": "homes"}))
    assert spec.env["JCODE_HOME"].startswith(str(root / "homes" / ".cotal" / "jcode") + "/")
    assert spec.env["COTAL_JCODE_HOME"] == str(root / "homes")


def test_a_symlink_along_the_path_is_refused(root: Path, binary: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / ".cotal").mkdir(mode=0o700)
    (root / ".cotal" / "jcode").symlink_to(outside)
    exc = refusal(opts_for(root, binary))
    assert exc.code == "unsafe-path"
    assert f"{root}/.cotal/jcode is a symlink" in exc.message
    assert f"the managed root {root}" in exc.message
    assert exc.cure.startswith(f"remove {root}/.cotal/jcode ")
    assert list(outside.iterdir()) == []


def test_a_symlinked_leaf_is_refused(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    parts = home_relparts("main", "alice")
    (root / ".cotal" / "jcode").mkdir(parents=True)
    (root.joinpath(*parts)).symlink_to(outside)
    with pytest.raises(
        Refusal, match="is a symlink; a private home must not leave the managed root"
    ):
        private_home(root, parts)
    assert mode(outside) != 0o700 or list(outside.iterdir()) == []


def test_a_path_escaping_the_managed_root_is_refused(root: Path) -> None:
    with pytest.raises(Refusal) as exc:
        private_home(root, (".cotal", "..", "..", "elsewhere"))
    assert exc.value.code == "unsafe-path"
    assert f"component '..' would escape the managed root {root}" in exc.value.message
    with pytest.raises(Refusal, match="would escape the managed root"):
        private_home(root, (".cotal", "a/../../b"))
    assert not (root / ".cotal").exists()


def test_a_file_in_the_way_is_refused(root: Path) -> None:
    (root / ".cotal").write_text("not a directory")
    with pytest.raises(Refusal, match=r"\.cotal is not a directory"):
        private_home(root, home_relparts("main", "alice"))


# -- the wire codec --------------------------------------------------------------------------------


def test_codec_round_trip() -> None:
    codec = JcodeCodec()
    assert (
        codec.encode_prompt("hi\u2028", "m1")
        == b'{"type": "prompt", "id": "m1", "text": "hi\\u2028"}'
    )
    assert codec.decode(b'{"type":"ready","session":"s1"}') == Ready("s1")
    assert codec.decode(b'{"type":"state","id":"q","session":"s1"}') == StateReported("q", "s1")
    assert codec.decode(
        b'{"type":"turn_end","id":"m1","status":"ok","reply":"Noted."}'
    ) == TurnEnded("m1", TurnOutcome("ok", "Noted."))
    assert codec.decode(b'{"type":"turn_end","id":"m1","status":"ok","reply":""}') == TurnEnded(
        "m1", TurnOutcome("unknown", detail="the harness produced no output")
    )
    assert codec.decode(
        b'{"type":"turn_end","id":"m1","status":"error","detail":"boom"}'
    ) == TurnEnded("m1", TurnOutcome("error", detail="boom"))
    assert codec.decode(b'{"type":"turn_end","id":"m1","status":"weird"}') == TurnEnded(
        "m1", TurnOutcome("unknown", detail="the harness ended the turn with status 'weird'")
    )
    assert codec.decode(b'{"type":"error","id":null,"detail":"bad"}') == Rejected(None, "bad")
    assert codec.decode(b'{"type":"something-new"}') is None
    with pytest.raises(DecodeError):
        codec.decode(b"not json")
    with pytest.raises(DecodeError):
        codec.decode(b'{"type":"ready"}')
