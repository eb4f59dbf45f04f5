"""What travels from `.git` and beside it: config (credentials redacted), hooks, info/exclude,
every stash entry, declared ignored files, large status lists, and a mount-point target."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from manager import registry
from manager.checkpoint.gitstate import capture_repository, preflight_repository
from manager.checkpoint.reader import verify_seat_files
from manager.checkpoint.restore import restore_repository
from protocol.checkpoint import (
    CHECKPOINT_CAP,
    SEAT_CHECKPOINT_FORMAT,
    UNTRACKED_SELECTION,
    FileRef,
    RepositoryRecord,
    SeatCheckpoint,
    SessionRecord,
)
from protocol.codec import encode_json
from protocol.errors import Refusal
from protocol.instant import format_instant
from tests.gitrepo import (
    REMOTE_TOKEN,
    full_digest,
    git,
    git_config_list,
    init_repo,
    make_fidelity_repo,
    make_rich_repo,
    seat_dir_for,
    stash_list,
    tree_digest,
    write,
)

pytestmark = [pytest.mark.usefixtures("isolated_home"), pytest.mark.anyio]

STAMP = "20261129T140000Z"
REPO_ROOT = Path(__file__).resolve().parents[2]
STATUS = ("status", "--porcelain=v1", "-z", "--untracked-files=all", "--", ":(exclude).cotal")


def seat_bytes(seat: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(seat.iterdir()))


async def round_trip(
    tmp_path: Path, repo: Path, include: tuple[str, ...] = ()
) -> tuple[Path, RepositoryRecord, Path]:
    seat = seat_dir_for(tmp_path)
    record = await capture_repository(repo, seat, include=include)
    target = tmp_path / "dest" / "work"
    await restore_repository(seat, record, target, stamp=STAMP)
    return seat, record, target


async def test_config_travels_with_the_remote_token_redacted(tmp_path: Path) -> None:
    repo = make_fidelity_repo(tmp_path / "src")
    seat, record, target = await round_trip(tmp_path, repo)

    assert REMOTE_TOKEN not in seat_bytes(seat)
    assert record.config is not None
    assert record.config_redacted == [
        "remote.origin.url",
        "http.https://example.invalid/.extraheader",
    ]
    got = git_config_list(target)
    assert "remote.origin.url=https://alice@example.invalid/team/r.git" in got
    assert "remote.upstream.url=https://example.invalid/up/r.git" in got
    assert "branch.main.remote=origin" in got and "core.filemode=true" in got
    assert not any("extraheader" in line for line in got)
    want = [
        line
        for line in git_config_list(repo)
        if not line.startswith(("remote.origin.url=", "http."))
    ]
    assert [line for line in got if not line.startswith("remote.origin.url=")] == want
    assert not (target / ".git" / "credentials").exists()
    assert not (target / ".git" / "stale.lock").exists()


async def test_a_clean_config_travels_byte_for_byte(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "src")
    write(repo / "a.txt", "a\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a")
    git(repo, "remote", "add", "origin", "git@example.invalid:team/r.git")
    _, record, target = await round_trip(tmp_path, repo)
    assert record.config_redacted == []
    assert (target / ".git" / "config").read_bytes() == (repo / ".git" / "config").read_bytes()


async def test_hooks_come_back_with_their_bytes_and_modes_and_info_exclude_is_identical(
    tmp_path: Path,
) -> None:
    repo = make_fidelity_repo(tmp_path / "src")
    _, record, target = await round_trip(tmp_path, repo)

    assert sorted(h.name for h in record.hooks) == ["post-checkout", "pre-commit"]
    for name, mode in (("pre-commit", 0o755), ("post-checkout", 0o640)):
        src, dst = repo / ".git/hooks" / name, target / ".git/hooks" / name
        assert dst.read_bytes() == src.read_bytes()
        assert stat.S_IMODE(os.lstat(dst).st_mode) == mode
    assert os.access(target / ".git/hooks/pre-commit", os.X_OK)
    assert not (target / ".git/hooks/pre-push.sample").exists()
    exclude = target / ".git/info/exclude"
    assert exclude.read_bytes() == (repo / ".git/info/exclude").read_bytes()


async def test_every_stash_entry_travels_and_the_oldest_applies(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "src")
    write(repo / "f.txt", "base\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    for n in range(3):
        write(repo / "f.txt", f"stash {n}\n")
        git(repo, "stash", "push", "-q", "-m", f"entry {n}")
    git(repo, "checkout", "-q", "-b", "other")
    write(repo / "g.txt", "on other\n")
    git(repo, "add", "g.txt")
    git(repo, "stash", "push", "-q")  # the default "WIP on other: ..." message
    git(repo, "checkout", "-q", "main")
    _, record, target = await round_trip(tmp_path, repo)

    assert len(record.stash) == 4
    assert stash_list(target) == stash_list(repo)
    fmt = "--format=%H %gd %gs"
    assert git(target, "stash", "list", fmt) == git(repo, "stash", "list", fmt)
    git(target, "stash", "apply", "-q", "stash@{3}")
    assert (target / "f.txt").read_text() == "stash 0\n"


async def test_declared_ignored_files_travel_and_undeclared_ones_do_not(tmp_path: Path) -> None:
    repo = make_fidelity_repo(tmp_path / "src")
    write(repo / ".env", b"API_KEY=local\n", 0o600)
    write(repo / "config/app.local", b"local=1\n", 0o640)
    write(repo / "config/deeper/.gitignore", "*.local\n")
    write(repo / "config/deeper/x.local", b"ignored, not matched by a one-level glob\n")
    write(repo / "build.log", "ignored, undeclared\n")
    write(repo / "scratch/notes.txt", "ignored by info/exclude\n")
    _, record, target = await round_trip(tmp_path, repo, include=(".env", "config/*.local"))

    assert record.include == [".env", "config/*.local"]
    assert record.untracked_selection == (
        UNTRACKED_SELECTION + "; plus declared ignored: .env, config/*.local"
    )
    for rel, mode in ((".env", 0o600), ("config/app.local", 0o640)):
        assert (target / rel).read_bytes() == (repo / rel).read_bytes()
        assert stat.S_IMODE(os.lstat(target / rel).st_mode) == mode
    for rel in ("build.log", "scratch/notes.txt", "config/deeper/x.local"):
        assert not (target / rel).exists()
    assert git(target, *STATUS) == git(repo, *STATUS)


async def test_a_declared_path_outside_the_rules_is_refused(tmp_path: Path) -> None:
    repo = make_fidelity_repo(tmp_path / "src")
    for n, bad in enumerate(("../x", "/etc/passwd", ".git/config", ".cotal/auth", "a[b]")):
        with pytest.raises(Refusal) as exc:
            await capture_repository(repo, seat_dir_for(tmp_path, f"s{n}"), include=(bad,))
        assert exc.value.code == "bad-include" and bad in exc.value.message


def test_carry_include_in_the_root_config(tmp_path: Path) -> None:
    (tmp_path / "cotal.toml").write_text('[carry]\ninclude = [".env", "config/*.local"]\n')
    cfg = registry.load_config(tmp_path)
    assert registry.carry_includes(cfg, [".env", "extra.key"]) == [
        ".env",
        "config/*.local",
        "extra.key",
    ]
    (tmp_path / "cotal.toml").write_text('[carry]\ninclude = ["../outside"]\n')
    with pytest.raises(Refusal) as exc:
        registry.load_config(tmp_path)
    assert exc.value.code == "bad-config" and "../outside" in exc.value.message
    (tmp_path / "cotal.toml").write_text('[carry]\nexclude = [".env"]\n')
    with pytest.raises(Refusal):
        registry.load_config(tmp_path)


async def test_a_submodule_not_absorbed_passes_the_preflight(tmp_path: Path) -> None:
    """A nested clone `git add` made a gitlink of keeps its `.git` directory: it travels as a
    submodule (tests/integration/test_repo_shapes.py has the round trip); its files with no
    `.git` at all cannot, and refuse by name with the cure."""
    inner = init_repo(tmp_path / "inner")
    write(inner / "i.txt", "inner\n")
    git(inner, "add", "-A")
    git(inner, "commit", "-q", "-m", "inner")
    repo = init_repo(tmp_path / "src")
    write(repo / "a.txt", "a\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a")
    git(repo, "clone", "-q", str(inner), "libs/sub")
    git(repo, "add", "libs/sub")
    git(repo, "commit", "-q", "-m", "sub")
    await preflight_repository(repo)
    shutil.rmtree(repo / "libs" / "sub" / ".git")
    with pytest.raises(Refusal) as exc:
        await preflight_repository(repo)
    assert exc.value.code == "submodule" and "libs/sub" in exc.value.message
    assert "files but no .git" in exc.value.message
    assert "git submodule update --init libs/sub" in exc.value.cure


async def test_twenty_thousand_changed_paths_round_trip(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "src")
    write(repo / "keep.txt", "k\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    many = repo / "many"
    for d in range(20):
        (many / f"d{d:02d}").mkdir(parents=True)
        for n in range(1000):
            (many / f"d{d:02d}" / f"file-{n:04d}.txt").write_bytes(b"%d\n" % n)
    git(repo, "add", "many")
    _, record, target = await round_trip(tmp_path, repo)

    assert record.status == "" and record.status_file is not None
    assert record.intent_to_add_file is not None
    assert len(encode_json(record)) < CHECKPOINT_CAP // 4
    assert git(target, *STATUS) == git(repo, *STATUS)
    assert git(target, *STATUS).count(b"\0") == 20000


def seat_checkpoint(record: RepositoryRecord) -> SeatCheckpoint:
    return SeatCheckpoint(
        format=SEAT_CHECKPOINT_FORMAT,
        entry={"space": "main", "name": "default"},
        space="main",
        name="default",
        lifecycle_uid="0123456789abcdefghijklmnop",
        generation=1,
        captured_at=format_instant(datetime.now(UTC)),
        profile=hashlib.sha256(b"profile").hexdigest(),
        repository=record,
        session=SessionRecord(continuity="fresh"),
    )


@pytest.mark.parametrize("which", ["hook", "config", "info_exclude", "status"])
async def test_a_tampered_carried_file_refuses_at_integrity(tmp_path: Path, which: str) -> None:
    repo = make_fidelity_repo(tmp_path / "src")
    many = repo / "many"
    many.mkdir()
    for n in range(4000):
        (many / f"f{n:05d}-with-a-long-enough-name.txt").write_bytes(b"x\n")
    seat = seat_dir_for(tmp_path)
    record = await capture_repository(repo, seat)
    checkpoint = seat_checkpoint(record)
    verify_seat_files(seat, checkpoint)

    refs: dict[str, FileRef | None] = {
        "hook": record.hooks[0].file,
        "config": record.config,
        "info_exclude": record.info_exclude,
        "status": record.status_file,
    }
    ref = refs[which]
    assert ref is not None
    path = seat / ref.file
    os.chmod(path, 0o600)
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01
    path.write_bytes(bytes(data))

    with pytest.raises(Refusal) as exc:
        verify_seat_files(seat, checkpoint)
    assert exc.value.code == "integrity" and ref.file in exc.value.message
    target = tmp_path / "dest" / "work"
    with pytest.raises(Refusal) as exc:
        await restore_repository(seat, record, target, stamp=STAMP)
    assert exc.value.code == "integrity"
    assert not target.exists() and not target.with_name("work.incoming").exists()


# -- a target that is a mount point -------------------------------------------------------------

_MOUNTED = r"""
import anyio, json, msgspec, os, sys
from pathlib import Path
from manager.checkpoint.restore import restore_repository
from protocol.checkpoint import RepositoryRecord
from protocol.errors import Refusal
from tests.gitrepo import full_digest, git, tree_digest, write

seat, record_path, target, bad_path = map(Path, sys.argv[1:5])
record = msgspec.json.decode(record_path.read_bytes(), type=RepositoryRecord)
bad = msgspec.json.decode(bad_path.read_bytes(), type=RepositoryRecord)
STATUS = ("status", "--porcelain=v1", "-z", "--untracked-files=all", "--", ":(exclude).cotal",
          ":(exclude).cotal-superseded-*")
out = {"mount": os.stat(target).st_dev != os.stat(target.parent).st_dev}
write(target / "old.txt", "the old tree\n")
write(target / ".cotal" / "keep.txt", "control dir\n")
before = full_digest(target)

async def main():
    try:
        await restore_repository(seat, bad, target, stamp="20261129T140000Z")
        out["bad"] = "restored"
    except Refusal as exc:
        out["bad"] = exc.code
    leftover = target / ".cotal-incoming-20261129T140000Z"
    out["evidence"] = leftover.is_dir()
    after = {k: v for k, v in full_digest(target).items() if not k.startswith(leftover.name)}
    out["unchanged"] = after == before
    os.system(f"rm -rf '{leftover}'")
    result = await restore_repository(seat, record, target, stamp="20261129T140001Z")
    out["superseded"] = str(result.superseded.relative_to(target)) if result.superseded else None
    out["status"] = git(target, *STATUS).decode()
    out["tree"] = {k: list(v) for k, v in tree_digest(target).items()
                   if not k.startswith(".cotal-superseded-")}
    out["old_kept"] = (result.superseded / "old.txt").read_text() if result.superseded else None
    out["control"] = (target / ".cotal" / "keep.txt").read_text()

anyio.run(main)
print(json.dumps(out))
"""


async def test_a_mount_point_target_restores_and_a_failed_restore_leaves_it(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("a private mount namespace needs root")
    repo = make_rich_repo(tmp_path / "src")
    seat = seat_dir_for(tmp_path)
    record = await capture_repository(repo, seat)
    record_path = tmp_path / "record.json"
    record_path.write_bytes(encode_json(record))
    bad_path = tmp_path / "bad.json"
    bad = json.loads(encode_json(record))
    bad["status"] = bad["status"] + "?? invented.txt\0"
    bad_path.write_text(json.dumps(bad))
    target = tmp_path / "dest" / "work"
    target.mkdir(parents=True)
    script = tmp_path / "mounted.py"
    script.write_text(_MOUNTED)
    shell = (
        f'mount -t tmpfs tmpfs "{target}" && exec "{sys.executable}" "{script}" '
        f'"{seat}" "{record_path}" "{target}" "{bad_path}"'
    )
    proc = await anyio.run_process(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    out = json.loads(proc.stdout)
    assert out["mount"] is True
    assert out["bad"] == "restore-mismatch" and out["evidence"] and out["unchanged"]
    assert out["superseded"] == ".cotal-superseded-20261129T140001Z"
    assert out["old_kept"] == "the old tree\n" and out["control"] == "control dir\n"
    assert out["status"].encode() == git(repo, *STATUS)
    want = {k: list(v) for k, v in tree_digest(repo).items()}
    # Ignored files do not travel unless declared.
    for ignored in (".env", "build.log"):
        want.pop(ignored)
    assert out["tree"] == want
    assert full_digest(target) == {}  # the tmpfs lived only in the namespace
