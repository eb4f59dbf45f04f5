"""The command line of a Python interpreter cotal starts for itself (manager, scribe, doctor).

Isolated (`-I`) so that a package planted in a seat-writable cwd or `PYTHONPATH` never runs
as the manager (docs/design.md, "The harness connectors, in detail").
"""

from __future__ import annotations

import site
import sys

__all__ = ["isolation_flags", "own_python"]


def isolation_flags() -> list[str]:
    """`-I`, or `-E -P` when this interpreter has a user site its child must also see."""
    # None when site never ran (-S): nothing to keep either way.
    return ["-E", "-P"] if site.ENABLE_USER_SITE is True else ["-I"]


def own_python(module: str) -> list[str]:
    """`python -I -m module` with this interpreter: the module's arguments follow it."""
    return [sys.executable, *isolation_flags(), "-m", module]
