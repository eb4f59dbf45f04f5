"""The command line of a Python interpreter cotal starts for itself: the manager (warm or cold,
and under systemd), the scribe harness, `doctor`'s scribe probe.

`python -m pkg` puts its cwd first on `sys.path`, and these run with a workspace root or a
seat's cwd as cwd, which a seat can write: a `manager/__init__.py` planted there would run as
the manager, holding the control token and the broker seed. `PYTHONPATH`, `PYTHONHOME`,
`PYTHONSTARTUP` and the rest of the environment's `PYTHON*` settings would let anything that
shapes the environment do the same. So every such child is isolated from both (`-I`: `-E -P
-s`) and finds cotal where an install put it (site-packages, or an editable install's finder
there), never through PYTHONPATH.

The one thing it keeps from its parent is the user site: when the command that starts it has
one (cotal installed with `pip install --user` lives there), the child gets `-E -P` instead,
so it sees the same installed packages, still with neither the cwd nor `PYTHON*` on its path.
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
