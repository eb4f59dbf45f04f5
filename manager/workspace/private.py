"""Private-file primitives: 0600 files in 0700 directories, written atomically, read safely.

They are defined once, in `connectors.privatefs`, because connectors write private files too and
may not import the manager; this module keeps the manager's imports where they were.
"""

from __future__ import annotations

from connectors.privatefs import (
    DIR_MODE,
    FILE_MODE,
    StableRead,
    UnsafeDirectory,
    UnsafeFile,
    create_private_exclusive,
    create_private_new,
    ensure_private_dir,
    file_identity,
    fsync_dir,
    make_private_dirs,
    open_parent_below,
    open_regular,
    read_stable,
    stream_stable,
    walk_below,
    write_private_atomic,
)

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "StableRead",
    "UnsafeDirectory",
    "UnsafeFile",
    "create_private_exclusive",
    "create_private_new",
    "ensure_private_dir",
    "file_identity",
    "fsync_dir",
    "make_private_dirs",
    "open_parent_below",
    "open_regular",
    "read_stable",
    "stream_stable",
    "walk_below",
    "write_private_atomic",
]
