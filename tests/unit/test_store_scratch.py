"""A connector's scratch entries in its session store: passed over by the cut's planning and its
capture, never followed; every other entry, and every store of a connector that declares none,
still refuses a symlink (`unsafe-store`).

The connectors are the real ones the registry loads: Codex declares `tmp` and `.tmp` (where it
keeps links to its own binary and its lock files while it runs), pi declares nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from connectors.base import store_scratch
from connectors.codex import CodexConnector
from manager.checkpoint.cut import _capture_session, has_files, store_scratch_of
from manager.workspace.layout import Layout
from protocol.errors import Refusal
from protocol.inventory import Agent, Identity, Launch
from protocol.refusals import Code

DIGEST = "0" * 64
UID = "jkj95k8hxohi94a1sj5mclchz8m1wbb"


def codex_like_store(root: Path) -> Path:
    """A store as a running Codex leaves it outside $TMPDIR: a rollout, and links to a binary
    under `tmp/`, a lock under `.tmp/`."""
    store = root / ".cotal" / "sessions" / "codex" / f"default-{UID}.home"
    day = store / "sessions" / "2026" / "01" / "01"
    day.mkdir(parents=True)
    (day / "rollout-1.jsonl").write_text('{"type":"session_meta"}\n')
    (store / "config.toml").write_text('model = "m"\n')
    binary = root / "codex-binary"
    binary.write_text("#!/bin/sh\n")
    arg0 = store / "tmp" / "arg0-linux" / "codex-arg0AbCdEf"
    arg0.mkdir(parents=True)
    for name in ("apply_patch", "applypatch", "codex-linux-sandbox"):
        (arg0 / name).symlink_to(binary)
    (store / ".tmp").mkdir()
    (store / ".tmp" / "plugins.sync.lock").write_text("")
    return store


def agent(root: Path, connector: str, store: Path) -> Agent:
    return Agent(
        name="default",
        space="main",
        identity=Identity(mode="open", lifecycle_uid=UID, owner="local"),
        launch=Launch(
            connector=connector,
            cwd=str(root),
            unresolved_launch_option_keys=[],
            profile_sha256=DIGEST,
            session_stores=[str(store)],
        ),
        dependencies=[],
        generation=0,
        started_at="2025-01-01T00:00:00Z",
    )


def capture(root: Path, connector: str, store: Path, extra: tuple[Path, ...] = ()) -> list[str]:
    seat_dir = root / "seat"
    seat_dir.mkdir(mode=0o700)
    layout = Layout.at(root)
    _, files, _ = _capture_session(
        layout,
        agent(layout.root, connector, store),
        seat_dir,
        root / "no-pointer.json",
        extra,
        None,
    )
    return [f.relpath for f in files]


def test_codex_declares_tmp_and_dot_tmp() -> None:
    assert store_scratch(CodexConnector()) == {"tmp", ".tmp"}
    assert store_scratch_of("codex") == {"tmp", ".tmp"}
    assert store_scratch_of("pi") == frozenset()
    # A connector this build does not know declares nothing: its store is walked whole.
    assert store_scratch_of("no-such-harness") == frozenset()


def test_declared_scratch_plans_and_captures_without_it(tmp_path: Path) -> None:
    store = codex_like_store(tmp_path)
    assert has_files(store, scratch=store_scratch_of("codex")) is True
    relpaths = capture(tmp_path, "codex", store)
    rel = f".cotal/sessions/codex/default-{UID}.home"
    assert relpaths == [f"{rel}/config.toml", f"{rel}/sessions/2026/01/01/rollout-1.jsonl"]
    # The links were passed over, not followed or removed.
    assert (store / "tmp" / "arg0-linux" / "codex-arg0AbCdEf" / "apply_patch").is_symlink()


def test_undeclared_scratch_still_refuses_the_symlink(tmp_path: Path) -> None:
    store = codex_like_store(tmp_path)
    link = store / "tmp" / "arg0-linux" / "codex-arg0AbCdEf" / "apply_patch"
    # has_files' default is the walk of a connector that declares nothing.
    for plan in (lambda: has_files(store), lambda: has_files(store, scratch=frozenset())):
        with pytest.raises(Refusal) as planned:
            plan()
        assert planned.value.code == Code.UNSAFE_STORE
        assert planned.value.message == f"session store entry {link} is a symlink"
    with pytest.raises(Refusal) as captured:
        capture(tmp_path, "pi", store)
    assert captured.value.code == Code.UNSAFE_STORE
    assert captured.value.message == f"session store entry {link} is a symlink"


def test_scratch_is_top_level_only(tmp_path: Path) -> None:
    store = codex_like_store(tmp_path)
    nested = store / "sessions" / "tmp"
    nested.mkdir()
    (nested / "link").symlink_to(tmp_path / "codex-binary")
    with pytest.raises(Refusal) as planned:
        has_files(store, scratch=store_scratch_of("codex"))
    assert planned.value.code == Code.UNSAFE_STORE
    assert planned.value.message == f"session store entry {nested / 'link'} is a symlink"


def test_a_scratch_entry_that_is_itself_a_link_is_not_followed(tmp_path: Path) -> None:
    store = codex_like_store(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("never carried\n")
    os.rename(store / ".tmp", tmp_path / "old-dot-tmp")
    (store / ".tmp").symlink_to(outside)
    rel = f".cotal/sessions/codex/default-{UID}.home"
    assert capture(tmp_path, "codex", store) == [
        f"{rel}/config.toml",
        f"{rel}/sessions/2026/01/01/rollout-1.jsonl",
    ]


def test_an_added_store_is_carried_whole(tmp_path: Path) -> None:
    store = codex_like_store(tmp_path)
    # The operator's `--session-store` is not the connector's: its `tmp/` refuses as before.
    added = tmp_path / "added"
    (added / "tmp").mkdir(parents=True)
    (added / "tmp" / "link").symlink_to(tmp_path / "codex-binary")
    with pytest.raises(Refusal) as captured:
        capture(tmp_path, "codex", store, (added,))
    assert captured.value.code == Code.UNSAFE_STORE
    assert captured.value.message == f"session store entry {added / 'tmp' / 'link'} is a symlink"


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\x00"])
def test_a_scratch_name_must_be_one_entry_of_the_top_level(name: str) -> None:
    class Bad:
        store_scratch = ("tmp", name)

    with pytest.raises(ValueError, match="is not one name of its store's top level"):
        store_scratch(Bad())
