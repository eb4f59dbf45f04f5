"""The relocation map: the source root onto the destination root, `--map` pairs, refusals."""

# The shared temporary directories are named here as places a map refuses, never used.
# ruff: noqa: S108

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from connectors.base import Relocation, relocate_session
from connectors.claude_code import ClaudeCodeConnector
from connectors.pi import PiConnector, relocated_header
from connectors.scribe.connector import ScribeConnector
from manager.checkpoint import landing
from manager.checkpoint.landing import check_map_target, check_store, check_tree
from manager.checkpoint.relocate import check_maps, map_store, parse_maps, relocation
from protocol.errors import Refusal
from tests.gitrepo import git, init_repo, write

SRC = Path("/hostA/ws")
DST = Path("/hostB/work/ws2")


def test_the_source_root_maps_onto_the_destination_root() -> None:
    r = relocation(SRC, DST, {}, old_cwd=SRC / "sub")
    assert r.new_cwd == DST / "sub" and r.moves
    assert relocation(SRC, DST, {}, old_cwd=SRC).new_cwd == DST
    assert map_store("s", "/hostA/ws/.cotal/sessions/pi/s-u.store", r) == Path(
        "/hostB/work/ws2/.cotal/sessions/pi/s-u.store"
    )
    # Prefixes are whole path components, never string prefixes.
    assert r.map(Path("/hostA/wsx")) is None


def test_the_longest_old_prefix_wins() -> None:
    maps = {Path("/srv"): Path("/data"), Path("/srv/deep/er"): Path("/fast")}
    r = relocation(SRC, DST, maps, old_cwd=Path("/srv/deep/er/x"))
    assert r.new_cwd == Path("/fast/x")
    assert r.map(Path("/srv/deep/other")) == Path("/data/deep/other")
    # An operator's pair for a directory inside the source root beats the root's pair.
    inner = relocation(SRC, DST, {SRC / "big": Path("/disk2/big")}, old_cwd=SRC / "big/a")
    assert inner.new_cwd == Path("/disk2/big/a")
    # And one naming the source root itself overrides the implicit pair.
    assert relocation(SRC, DST, {SRC: Path("/else")}, old_cwd=SRC).new_cwd == Path("/else")


def test_a_cwd_or_store_under_no_prefix_is_refused_by_name() -> None:
    with pytest.raises(Refusal) as err:
        relocation(SRC, DST, {}, old_cwd=Path("/elsewhere/proj"))
    assert err.value.code == "cwd-unmapped"
    assert "/elsewhere/proj" in err.value.message and "--map" in (err.value.cure or "")
    r = relocation(SRC, DST, {}, old_cwd=SRC)
    with pytest.raises(Refusal) as err:
        map_store("s", "/home/op/.pi/sessions", r)
    assert err.value.code == "cwd-unmapped" and "/home/op/.pi/sessions" in err.value.message


@pytest.mark.parametrize(
    "value",
    [
        "relative/old=/new",
        "/old=relative/new",
        "/old\x00=/new",
        "/old=/new/../etc",
        "/old/./x=/new",
        "/old/=/new",
        "//old=/new",
        "/old",
    ],
)
def test_malformed_maps_are_refused(value: str) -> None:
    with pytest.raises(Refusal) as err:
        parse_maps([value])
    assert err.value.code == "bad-map"
    assert err.value.cure


def test_a_map_splits_at_the_first_equals_and_names_an_old_once() -> None:
    assert parse_maps(["/a=/b=c"]) == {Path("/a"): Path("/b=c")}
    assert parse_maps(["/a=/b", "/a=/b"]) == {Path("/a"): Path("/b")}
    with pytest.raises(Refusal) as err:
        parse_maps(["/a=/b", "/a=/c"])
    assert err.value.code == "bad-map" and "twice" in err.value.message


def test_new_is_under_the_root_or_an_existing_directory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    check_maps({Path("/x"): root / "not-yet"}, dest_root=root)
    (tmp_path / "mine").mkdir()
    check_maps({Path("/x"): tmp_path / "mine"}, dest_root=root)
    with pytest.raises(Refusal) as err:
        check_maps({Path("/x"): tmp_path / "missing"}, dest_root=root)
    assert err.value.code == "bad-map" and f"{tmp_path / 'missing'} is missing" in err.value.message
    (tmp_path / "file").write_text("x")
    with pytest.raises(Refusal) as err:
        check_maps({Path("/x"): tmp_path / "file"}, dest_root=root)
    assert err.value.code == "bad-map" and "is not a directory" in err.value.message
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    with pytest.raises(Refusal) as err:
        check_maps({Path("/x"): tmp_path / "link"}, dest_root=root)
    assert err.value.code == "map-symlink"


# -- where a map may land -----------------------------------------------------------------------

CURE_ELSEWHERE = "map /x onto a directory you keep for this work"


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _refused(new: Path, root: Path, code: str, *, tree: Path | None = None, base: str = "") -> str:
    with pytest.raises(Refusal) as err:
        check_map_target(Path("/x"), new, dest_root=root, tree=tree, base=base or None)
    assert err.value.code == code, err.value
    assert err.value.message.startswith(f"--map /x={new}: "), err.value.message
    assert err.value.cure
    return err.value.message


@pytest.mark.parametrize(
    ("new", "why"),
    [
        ("/", "the filesystem root"),
        ("/etc", "a system directory (/etc and everything beneath it)"),
        ("/etc/cotal", "a system directory (/etc and everything beneath it)"),
        ("/usr", "a system directory (/usr"),
        ("/usr/local/src", "a system directory (/usr"),
        ("/bin", "a system directory (/bin"),
        ("/sbin", "a system directory (/sbin"),
        ("/lib", "a system directory (/lib"),
        ("/lib64", "a system directory (/lib64"),
        ("/libx32/x", "a system directory (/libx32"),
        ("/boot", "a system directory (/boot"),
        ("/var", "a system directory (/var"),
        ("/var/tmp", "a system directory (/var"),
        ("/var/lib/work", "a system directory (/var"),
        ("/proc", "kernel or runtime state (/proc"),
        ("/proc/self/cwd", "kernel or runtime state (/proc"),
        ("/sys", "kernel or runtime state (/sys"),
        ("/dev", "kernel or runtime state (/dev"),
        ("/dev/shm", "kernel or runtime state (/dev"),
        ("/run", "kernel or runtime state (/run"),
        ("/run/user/0", "kernel or runtime state (/run"),
        ("/home", "a directory every user shares"),
        ("/opt", "a directory every user shares"),
        ("/srv", "a directory every user shares"),
        ("/tmp", "a directory every user shares"),
        ("/mnt", "a directory every user shares"),
        ("/root", "a directory every user shares"),
        ("/srv/other/.cotal", "a cotal control directory or inside one (/srv/other/.cotal)"),
        ("/srv/other/.cotal/auth", "a cotal control directory or inside one (/srv/other/.cotal)"),
        ("/srv/work/.git/hooks", "inside the .git directory /srv/work/.git"),
    ],
)
def test_a_map_never_lands_on_the_system(new: str, why: str) -> None:
    message = _refused(Path(new), Path("/srv/dest/root"), "map-forbidden")
    assert f"{new} is {why}" in message


def test_the_operators_home_and_what_holds_this_root_are_forbidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert landing.operator_home() == Path(os.path.expanduser(f"~{_user()}"))
    # Root's home is /root, itself refused as shared: a home of its own shows the home rule.
    home = tmp_path / "home"
    (home / "work").mkdir(parents=True)
    monkeypatch.setattr(landing, "operator_home", lambda: home)
    assert "your home directory itself" in _refused(home, tmp_path / "r", "map-forbidden")
    check_map_target(Path("/x"), home / "work", dest_root=tmp_path / "r")
    message = _refused(tmp_path, tmp_path / "a" / "r", "map-forbidden")
    assert f"a directory that holds this destination root {tmp_path / 'a' / 'r'}" in message
    # The kernel's trees stay forbidden even under a root placed there; a system tree holding
    # the destination root is the root's own to map into.
    assert check_map_target(Path("/x"), Path("/var/lib/r/new"), dest_root=Path("/var/lib/r")) == (
        "absent"
    )
    _refused(Path("/dev/shm/r/new"), Path("/dev/shm/r"), "map-forbidden")


def test_a_map_follows_no_symlink_anywhere_on_the_path(tmp_path: Path) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "hop").symlink_to(tmp_path / "real")
    message = _refused(tmp_path / "hop" / "sub", tmp_path / "r", "map-symlink")
    assert f"{tmp_path / 'hop'} is a symlink" in message
    # Beneath NEW too: the tree the restore writes.
    (tmp_path / "real" / "sub" / "in").symlink_to(tmp_path / "real")
    _refused(
        tmp_path / "real" / "sub", tmp_path / "r", "map-symlink", tree=tmp_path / "real/sub/in"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_map_lands_only_in_the_operators_own_directory(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 54321, 54321)
    message = _refused(theirs, tmp_path / "r", "map-not-owned")
    assert f"{theirs} is owned by uid 54321, not by this operator (uid 0)" in message
    mine = tmp_path / "mine"
    (mine / "deep").mkdir(parents=True)
    os.chown(mine / "deep", 54321, 54321)
    _refused(mine, tmp_path / "r", "map-not-owned", tree=mine / "deep" / "tree")


def test_a_map_never_lands_in_another_root(tmp_path: Path) -> None:
    other = tmp_path / "other"
    (other / ".cotal").mkdir(parents=True)
    root = tmp_path / "r"
    (root / ".cotal").mkdir(parents=True)
    message = _refused(other, root, "map-other-root")
    assert f"{other} is another cotal root (it holds .cotal)" in message
    (other / "sub").mkdir()
    message = _refused(other / "sub", root, "map-other-root")
    assert f"and {other / 'sub'} lies beneath it" in message
    # A root nested beneath this root is another root too; this root itself is not.
    (root / "nested" / ".cotal").mkdir(parents=True)
    _refused(root / "nested", root, "map-other-root")
    bare = tmp_path / "bare"
    (bare / ".cotal").mkdir(parents=True)
    assert check_map_target(Path("/x"), bare, dest_root=bare, tree=bare, base="0" * 40) == "empty"
    # The seat's own store under this root's control directory is the one .cotal a map onto
    # the root may reach.
    store = root / ".cotal" / "sessions" / "pi" / "s-u.store"
    check_store(store, {Path("/x"): root}, dest_root=root)
    with pytest.raises(Refusal) as err:
        check_store(
            tmp_path / "m" / ".cotal" / "auth", {Path("/x"): tmp_path / "m"}, dest_root=root
        )
    assert err.value.code == "map-forbidden" and "is inside a .cotal directory" in err.value.message


def _repo(path: Path) -> str:
    init_repo(path)
    write(path / "a.txt", f"{path.name}\n")
    git(path, "add", "a.txt")
    git(path, "commit", "-q", "-m", "a")
    return git(path, "rev-parse", "HEAD").decode().strip()


@pytest.mark.usefixtures("isolated_home")
def test_a_non_empty_tree_must_be_the_same_repository(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    new = tmp_path / "new"
    base = _repo(tmp_path / "source")
    (new / "empty").mkdir(parents=True)
    assert check_map_target(Path("/x"), new, dest_root=root, tree=new / "gone", base=base) == (
        "absent"
    )
    assert check_map_target(Path("/x"), new, dest_root=root, tree=new / "empty", base=base) == (
        "empty"
    )
    write(new / "decoy" / "keep.txt", "someone's\n")
    message = _refused(new, root, "map-occupied", tree=new / "decoy", base=base)
    assert f"{new / 'decoy'} is not empty (keep.txt)" in message and base in message
    # Another repository, even one with history, is not this one.
    _repo(new / "unrelated")
    _refused(new, root, "map-occupied", tree=new / "unrelated", base=base)
    # A clone holds the base in its history: the same repository, moved aside by the restore.
    git(tmp_path, "clone", "-q", str(tmp_path / "source"), str(new / "clone"))
    write(new / "clone" / "b.txt", "work in progress\n")
    assert check_tree(new / "clone", {Path("/x"): new}, dest_root=root, base=base) == (
        "same-repository"
    )
    # ... unless another root lives inside it, which would be moved aside with it.
    (new / "clone" / "inner" / ".cotal").mkdir(parents=True)
    message = _refused(new, root, "map-other-root", tree=new / "clone", base=base)
    assert f"holds another cotal root ({new / 'clone' / 'inner' / '.cotal'})" in message
    # The base merely present as an object, reachable from nothing, is not history.
    dangling = tmp_path / "dangling"
    init_repo(dangling)
    git(dangling, "fetch", "-q", str(tmp_path / "source"), "main")
    write(dangling / "x.txt", "x\n")
    git(dangling, "add", "x.txt")
    git(dangling, "commit", "-q", "-m", "x")
    assert git(dangling, "cat-file", "-t", base).strip() == b"commit"
    assert not landing.same_repository(dangling, base)


def test_a_tree_no_map_places_is_the_roots_own(tmp_path: Path) -> None:
    root = tmp_path / "r"
    assert check_tree(root / "sub", {Path("/x"): tmp_path / "m"}, dest_root=root, base="0") is None
    maps = {Path("/x"): tmp_path / "m", Path("/y"): tmp_path / "m" / "deep"}
    assert landing.governing(tmp_path / "m" / "deep" / "t", maps) == (
        Path("/y"),
        tmp_path / "m" / "deep",
    )


# -- per harness --------------------------------------------------------------------------------


def _reloc(cwd: str = "") -> Relocation:
    return relocation(SRC, DST, {}, old_cwd=SRC / cwd if cwd else SRC)


def test_pi_rewrites_the_header_cwd_and_nothing_else() -> None:
    r = _reloc("sub")
    line = json.dumps(
        {
            "type": "session",
            "version": 3,
            "id": "01a2278a-387f-7559-b3e4-684e516dbf2f",
            "timestamp": "t",
            "cwd": "/hostA/ws/sub",
            "parentSession": "/hostA/ws/.cotal/sessions/pi/x.store/a.jsonl",
        },
        separators=(",", ":"),
    ).encode()
    out = json.loads(relocated_header(line, r))
    assert out["cwd"] == "/hostB/work/ws2/sub"
    assert out["parentSession"] == "/hostB/work/ws2/.cotal/sessions/pi/x.store/a.jsonl"
    assert list(out) == list(json.loads(line))  # pi's key order is kept
    message = b'{"type":"message","cwd":"/hostA/ws"}'
    assert relocated_header(message, r) == message
    assert relocated_header(b"not json", r) == b"not json"
    move = relocate_session(PiConnector(), ["a_1.jsonl", "notes.txt"], r, "1")
    assert set(move.files) == {"a_1.jsonl"} and move.continuity is None


def test_claude_moves_the_project_dir_to_the_new_encoding() -> None:
    r = _reloc("sub")
    sid = "0aba288b-a1da-4a2a-8a69-b7710d665ddc"
    files = [
        f"projects/-hostA-ws-sub/{sid}.jsonl",
        "projects/-hostA-ws/memory/MEMORY.md",
        "cotal-launch.json",
    ]
    move = relocate_session(ClaudeCodeConnector(), files, r, sid)
    assert move.continuity is None
    assert move.files[files[0]].relpath == f"projects/-hostB-work-ws2-sub/{sid}.jsonl"
    assert move.files[files[1]].relpath == "projects/-hostB-work-ws2/memory/MEMORY.md"
    assert files[2] not in move.files


def test_claude_says_fresh_when_its_transcript_cannot_follow() -> None:
    sid = "0aba288b-a1da-4a2a-8a69-b7710d665ddc"
    # A name Claude Code shortened with a hash cannot be recomputed: the session is stranded.
    long_dir = "-" + "x" * 210 + "-abc123"
    move = relocate_session(
        ClaudeCodeConnector(), [f"projects/{long_dir}/{sid}.jsonl"], _reloc(), sid
    )
    assert move.continuity == "fresh" and sid in move.why


def test_scribe_and_an_unmoved_seat_change_nothing() -> None:
    assert relocate_session(ScribeConnector(), ["s.jsonl"], _reloc(), "x").files == {}
    same = relocation(SRC, SRC, {}, old_cwd=SRC)
    assert not same.moves
    assert relocate_session(PiConnector(), ["a.jsonl"], same, "x").files == {}
