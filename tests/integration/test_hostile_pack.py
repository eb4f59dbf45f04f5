"""A packed checkpoint is bounded by what it is (issue 21, item 4): only regular files and
directories of the attempt, with sizes the file itself holds. Every hostile archive here is a
real tar (Python's tarfile, GNU tar's own sparse output, or raw ustar headers) and is refused by
its exact code and message, naming the member, before a byte is written: the destination's tree,
inodes, mtimes and disk usage are compared before and after.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from manager.checkpoint import archive, packfile
from manager.coord import checkpoints
from manager.workspace.layout import Layout
from protocol.errors import Refusal
from tests.ckpt import snapshot
from tests.conftest import Cli

pytestmark = pytest.mark.usefixtures("isolated_home")

A = "20261129T140000Z-0a1b2c3d"
INCOMING = Path(".cotal/maintenance/v1/incoming")
GIB = 1 << 30


def _dir(name: str) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o700
    return info, None


def _file(
    name: str, data: bytes = b"content\n", mode: int = 0o600
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    return info, data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, None


def _with(
    member: tuple[tarfile.TarInfo, bytes | None], **fields: object
) -> tuple[tarfile.TarInfo, bytes | None]:
    info, data = member
    for name, value in fields.items():
        setattr(info, name, value)
    return info, data


def write_tar(out: Path, *members: tuple[tarfile.TarInfo, bytes | None], fmt: int) -> Path:
    with tarfile.open(out, "w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out


def ustar(out: Path, *members: tuple[tarfile.TarInfo, bytes | None]) -> Path:
    return write_tar(out, *members, fmt=tarfile.USTAR_FORMAT)


def raw_headers(out: Path, *blocks: bytes) -> Path:
    """Headers and data laid down as given, then the zero trailer: sizes that lie included."""
    out.write_bytes(b"".join(blocks) + bytes(2 * 512))
    return out


def header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")


def gnu_tar(tmp: Path, out: Path, fmt: str) -> Path:
    """A real sparse archive as GNU tar writes one: a 1 GiB file with one byte of data."""
    tree = tmp / f"tree-{fmt}"
    (tree / A).mkdir(parents=True)
    with open(tree / A / "big", "wb") as f:
        f.truncate(GIB)
        f.seek(100_000)
        f.write(b"x")
    subprocess.run(
        [
            "tar",
            "--sparse",
            f"--format={fmt}",
            # GNU tar's pax format stamps times on every member; here only the sparse one's
            # own headers remain.
            *(["--pax-option=delete=atime,delete=ctime"] if fmt == "posix" else []),
            "--mtime=@0",
            "-cf",
            str(out),
            A,
        ],
        cwd=tree,
        check=True,
    )
    shutil.rmtree(tree)
    assert out.stat().st_size < 64 * 1024
    return out


def usage(root: Path) -> int:
    """Blocks allocated under `root`: what a sparse or lying member would have written."""
    total = 0
    for dirpath, dirnames, files in os.walk(root):
        for name in dirnames + files:
            total += os.lstat(Path(dirpath) / name).st_blocks
    return total


def destination(root: Path) -> Layout:
    """A root that already has an incoming directory, with an earlier unpacking of another
    attempt in it, so a write anywhere under `.cotal` shows."""
    other = root / INCOMING / "20261129T130000Z-00000000"
    other.mkdir(parents=True)
    for rel in (".cotal", ".cotal/maintenance", ".cotal/maintenance/v1", str(INCOMING)):
        os.chmod(root / rel, 0o700)
    (other / "kept.txt").write_text("an earlier unpacking\n")
    return Layout.at(root)


def refused_unchanged(root: Path, act: Callable[[], object], code: str, message: str) -> Refusal:
    before, blocks = snapshot(root), usage(root)
    with pytest.raises(Refusal) as err:
        act()
    assert err.value.code == code, err.value.text
    assert err.value.message == message
    assert err.value.cure
    assert snapshot(root) == before
    assert usage(root) == blocks
    return err.value


Case = Callable[[Path], Path]

CASES: dict[str, tuple[Case, str, str]] = {
    "gnu-sparse": (
        lambda d: gnu_tar(d, d / "gnu-sparse.tar", "gnu"),
        "unsafe-archive",
        f"member '{A}/big' is a GNU sparse file",
    ),
    "pax-sparse": (
        lambda d: gnu_tar(d, d / "pax-sparse.tar", "posix"),
        "unsafe-archive",
        f"member '{A}/big' is a sparse file (PAX GNU.sparse.* headers)",
    ),
    "pax-sparse-0.1": (
        lambda d: write_tar(
            d / "pax01.tar",
            _dir(A),
            _with(
                _file(f"{A}/big", b"x"),
                pax_headers={
                    "GNU.sparse.size": str(GIB),
                    "GNU.sparse.numblocks": "1",
                    "GNU.sparse.offset": str(GIB - 1),
                    "GNU.sparse.numbytes": "1",
                },
            ),
            fmt=tarfile.PAX_FORMAT,
        ),
        "unsafe-archive",
        f"member '{A}/big' is a sparse file (PAX GNU.sparse.* headers)",
    ),
    "pax-path": (
        lambda d: write_tar(
            d / "pax.tar", _dir(A), _file(f"{A}/" + "n" * 120), fmt=tarfile.PAX_FORMAT
        ),
        "unsafe-archive",
        f"member '{A}/{'n' * 120}' carries PAX extended headers (path)",
    ),
    "gnu-long-name": (
        lambda d: write_tar(
            d / "long.tar", _dir(A), _file(f"{A}/" + "n" * 120), fmt=tarfile.GNU_FORMAT
        ),
        "unsafe-archive",
        f"member '{A}/{'n' * 120}' carries a GNU long name header",
    ),
    "dot-first": (
        lambda d: ustar(d / "dot.tar", _dir(".")),
        "unsafe-archive",
        "member './' is not a plain relative name (an empty or '.' step, or a backslash)",
    ),
    "dot-inside": (
        lambda d: ustar(d / "dot2.tar", _dir(A), _file(f"{A}/./checkpoint.json")),
        "unsafe-archive",
        f"member '{A}/./checkpoint.json' is not a plain relative name (an empty or '.' step, "
        "or a backslash)",
    ),
    "dot-dir": (
        lambda d: ustar(d / "dot3.tar", _dir(A), _dir(f"{A}/.")),
        "unsafe-archive",
        f"member '{A}/./' is not a plain relative name (an empty or '.' step, or a backslash)",
    ),
    "empty-step": (
        lambda d: ustar(d / "slash.tar", _dir(A), _file(f"{A}//x")),
        "unsafe-archive",
        f"member '{A}//x' is not a plain relative name (an empty or '.' step, or a backslash)",
    ),
    "dotdot": (
        lambda d: ustar(d / "dotdot.tar", _dir(A), _file(f"{A}/../evil")),
        "unsafe-archive",
        f"member '{A}/../evil' climbs out of the attempt with '..'",
    ),
    "absolute": (
        lambda d: ustar(d / "abs.tar", _dir(A), _file(f"/{A}/evil")),
        "unsafe-archive",
        f"member '/{A}/evil' is an absolute name",
    ),
    "duplicate": (
        lambda d: ustar(d / "dup.tar", _dir(A), _file(f"{A}/x"), _file(f"{A}/x", b"again\n")),
        "unsafe-archive",
        f"member '{A}/x' appears twice",
    ),
    "outside": (
        lambda d: ustar(d / "out.tar", _dir(A), _dir("20261129T140000Z-ffffffff")),
        "unsafe-archive",
        f"member '20261129T140000Z-ffffffff/' is outside {A}/",
    ),
    "before-its-directory": (
        lambda d: ustar(d / "order.tar", _dir(A), _file(f"{A}/sub/x")),
        "unsafe-archive",
        f"member '{A}/sub/x' comes before (or without) its directory '{A}/sub'",
    ),
    "not-an-attempt": (
        lambda d: ustar(d / "top.tar", _dir("etc.d")),
        "unsafe-archive",
        "its top directory 'etc.d' is not an attempt id",
    ),
    "hardlink": (
        lambda d: ustar(
            d / "hard.tar", _dir(A), _special(f"{A}/h", tarfile.LNKTYPE, "/etc/passwd")
        ),
        "unsafe-archive",
        f"member '{A}/h' is a hard link to '/etc/passwd'",
    ),
    "symlink": (
        lambda d: ustar(d / "sym.tar", _dir(A), _special(f"{A}/s", tarfile.SYMTYPE, "/etc")),
        "unsafe-archive",
        f"member '{A}/s' is a symlink to '/etc'",
    ),
    "chardev": (
        lambda d: ustar(d / "chr.tar", _dir(A), _special(f"{A}/null", tarfile.CHRTYPE)),
        "unsafe-archive",
        f"member '{A}/null' is a character device",
    ),
    "blockdev": (
        lambda d: ustar(d / "blk.tar", _dir(A), _special(f"{A}/sda", tarfile.BLKTYPE)),
        "unsafe-archive",
        f"member '{A}/sda' is a block device",
    ),
    "fifo": (
        lambda d: ustar(d / "fifo.tar", _dir(A), _special(f"{A}/p", tarfile.FIFOTYPE)),
        "unsafe-archive",
        f"member '{A}/p' is a fifo",
    ),
    "contiguous": (
        lambda d: ustar(d / "cont.tar", _dir(A), _special(f"{A}/c", tarfile.CONTTYPE)),
        "unsafe-archive",
        f"member '{A}/c' is a contiguous file",
    ),
    "declares-more-than-it-holds": (
        lambda d: raw_headers(
            d / "liar.tar",
            header(_dir(A)[0]),
            header(_with(_file(f"{A}/big", b""), size=GIB)[0]),
            b"x" * 512,
        ),
        "unsafe-archive",
        f"member '{A}/big' declares {GIB} bytes, but only 1536 bytes of the file follow its header",
    ),
    "dir-with-data": (
        lambda d: raw_headers(d / "dirdata.tar", header(_with(_dir(A), size=512)[0]), bytes(512)),
        "unsafe-archive",
        f"directory member '{A}/' declares 512 bytes of data",
    ),
}


def _expected(src: Path, tail: str) -> str:
    return f"packed checkpoint {src}: {tail}"


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_hostile_member_is_refused_by_name_with_nothing_written(
    tmp_path: Path, root: Path, kind: str
) -> None:
    build, code, tail = CASES[kind]
    src = build(tmp_path)
    layout = destination(root)
    err = refused_unchanged(
        root, lambda: checkpoints.unpack(src, layout), code, _expected(src, tail)
    )
    assert "nothing was written" in err.cure


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        pytest.param(
            lambda b: b[: 512 + 148] + b"0000000\x00" + b[512 + 156 :],
            "the header at byte 512 fails its checksum",
            id="checksum",
        ),
        pytest.param(
            lambda b: b[: 1536 + 100], "it ends inside the header at byte 1536", id="cut-short"
        ),
        pytest.param(
            lambda b: b[:1024] + b"content\nX" + b[1033:],
            f"the padding after '{A}/x' is not zero",
            id="padding",
        ),
        pytest.param(
            lambda b: b[:-1] + b"\x01",
            "bytes after the last member are not the zero trailer",
            id="trailer",
        ),
    ],
)
def test_a_damaged_archive_is_bad_archive(
    tmp_path: Path, root: Path, corrupt: Callable[[bytes], bytes], message: str
) -> None:
    good = ustar(tmp_path / "good.tar", _dir(A), _file(f"{A}/x"), _file(f"{A}/y"))
    src = tmp_path / "damaged.tar"
    src.write_bytes(corrupt(good.read_bytes()))
    layout = destination(root)
    refused_unchanged(
        root,
        lambda: checkpoints.unpack(src, layout),
        "bad-archive",
        f"packed checkpoint {src} is damaged: {message}",
    )


@pytest.mark.parametrize("leftover", ["symlink-to-dir", "dangling-symlink", "file"])
def test_a_leftover_at_the_staging_path_refuses_by_name(
    tmp_path: Path, root: Path, leftover: str
) -> None:
    src = ustar(tmp_path / "ok.tar", _dir(A), _file(f"{A}/x"))
    layout = destination(root)
    staged = root / INCOMING / A
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("not cotal's\n")
    if leftover == "symlink-to-dir":
        os.symlink(elsewhere, staged)
        kind = f"a symlink (to {str(elsewhere)!r})"
    elif leftover == "dangling-symlink":
        os.symlink(tmp_path / "nowhere", staged)
        kind = f"a symlink (to {str(tmp_path / 'nowhere')!r})"
    else:
        staged.write_text("a file\n")
        kind = "a regular file"
    outside = snapshot(elsewhere)
    err = refused_unchanged(
        root,
        lambda: checkpoints.unpack(src, layout),
        "staging-occupied",
        f"cannot unpack {src}: {staged} is {kind}, not a directory this root unpacked",
    )
    assert f"rm {staged}" in err.cure and "nothing was written" in err.cure
    assert snapshot(elsewhere) == outside
    assert not (tmp_path / "nowhere").exists()


def test_a_genuine_pack_unpacks_exactly_and_replaces_an_earlier_unpacking(
    tmp_path: Path, root: Path
) -> None:
    attempt = tmp_path / "src" / A
    (attempt / "seat" / "hooks").mkdir(parents=True)
    (attempt / "manifest.json").write_bytes(b"{}\n")
    (attempt / "seat" / "bundle").write_bytes(os.urandom(3 * 512 + 7))
    (attempt / "seat" / "empty").write_bytes(b"")
    hook = attempt / "seat" / "hooks" / "hook-pre-commit"
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    packed = tmp_path / "packed.tar"
    archive.write_archive(attempt, packed)
    layout = destination(root)
    staged = root / INCOMING / A
    # A directory there is this root's own earlier unpacking: replaced whole.
    (staged / "stale").mkdir(parents=True)
    assert checkpoints.unpack(packed, layout) == staged
    assert not (staged / "stale").exists()
    got = sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*"))
    want = sorted(p.relative_to(attempt).as_posix() for p in attempt.rglob("*"))
    assert got == want
    for rel in want:
        if (attempt / rel).is_file():
            assert (staged / rel).read_bytes() == (attempt / rel).read_bytes(), rel
    assert (staged / "seat/hooks/hook-pre-commit").stat().st_mode & 0o777 == 0o700
    assert (staged / "seat/bundle").stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(root / INCOMING)) == sorted([A, "20261129T130000Z-00000000"])
    with packfile.open_pack(packed) as pack:
        plan = pack.plan()
    assert plan.attempt == A
    assert plan.data_bytes == sum(p.stat().st_size for p in attempt.rglob("*") if p.is_file())
    assert plan.data_bytes <= plan.archive_bytes


@pytest.mark.parametrize("kind", ["gnu-sparse", "dot-first", "declares-more-than-it-holds"])
def test_up_restore_refuses_a_hostile_pack_and_leaves_a_fresh_root_empty(
    tmp_path: Path, cli: Cli, kind: str
) -> None:
    build, code, tail = CASES[kind]
    src = build(tmp_path)
    proc = cli.run("up", "--restore", str(src), "--json", check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    doc = json.loads(proc.stderr.splitlines()[-1])
    assert doc["code"] == code and _expected(src, tail) in doc["error"], doc
    assert "Traceback" not in proc.stderr
    assert list(cli.root.iterdir()) == []


def test_up_restore_refuses_a_staging_symlink_without_an_internal_error(
    tmp_path: Path, cli: Cli
) -> None:
    src = ustar(tmp_path / "ok.tar", _dir(A), _file(f"{A}/x"))
    destination(cli.root)
    staged = cli.root / INCOMING / A
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, staged)
    before, blocks = snapshot(cli.root), usage(cli.root)
    proc = cli.run("up", "--restore", str(src), "--json", check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    doc = json.loads(proc.stderr.splitlines()[-1])
    assert doc["code"] == "staging-occupied", doc
    assert f"{staged} is a symlink (to {str(elsewhere)!r})" in doc["error"]
    assert "Traceback" not in proc.stderr
    assert snapshot(cli.root) == before and usage(cli.root) == blocks
    assert list(elsewhere.iterdir()) == []
