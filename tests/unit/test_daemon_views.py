"""The Manager's helpers take narrow views of it, not the Manager (issue 37).

Each helper under `manager/daemon` declares what it asks of the Manager as a small
`typing.Protocol` and the Manager satisfies it structurally (mypy checks that where the Manager
passes `self`), so no helper imports `manager.daemon.core`, not even under TYPE_CHECKING: the
seat table's owner is above its helpers, and a helper never reaches the rest of it."""

from __future__ import annotations

import ast
from pathlib import Path

import manager.daemon

DAEMON = Path(manager.daemon.__file__).parent
CORE = "manager.daemon.core"

# The composition root: it constructs the Manager, at run time, and nothing under the Manager
# imports it, so this closes no circle.
COMPOSITION_ROOT = {"serve.py"}


NARROWED = {
    "mover.py",
    "handlers/preservation.py",
    "handlers/__init__.py",
    "preserve.py",
    "resume.py",
    "delivery.py",
    "progress.py",
    "incarnation.py",
    "watchers.py",
    "teardown.py",
    "meshsend.py",
    "meshsocket.py",
    "readopt.py",
    "seatfile.py",
    "notify.py",
    "seat.py",
    "handlers/seats.py",
    "handlers/mail.py",
    "handlers/table.py",
    "handlers/metrics.py",
    "metrics.py",
    "events.py",
    "standing.py",
    "standby.py",
    "takeover.py",
    "handlers/takeover.py",
}


def _imports_core(source: str, package: list[str]) -> bool:
    """Whether the module's source imports core in any form, at run time or for types only;
    `package` is the module's package, for its relative imports."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            if any(a.name == CORE or a.name.startswith(CORE + ".") for a in node.names):
                return True
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module == CORE or module.startswith(CORE + "."):
                return True
            if any(f"{module}.{a.name}" == CORE for a in node.names):
                return True
    return False


def _importers() -> set[str]:
    found: set[str] = set()
    for path in sorted(DAEMON.rglob("*.py")):
        relative = path.relative_to(DAEMON)
        package = ["manager", "daemon", *relative.parent.parts]
        if relative.as_posix() != "core.py" and _imports_core(path.read_text(), package):
            found.add(relative.as_posix())
    return found


def test_the_finder_sees_every_form_of_import() -> None:
    daemon, handlers = ["manager", "daemon"], ["manager", "daemon", "handlers"]
    found = [
        ("import manager.daemon.core\n", daemon),
        ("from manager.daemon.core import Manager\n", daemon),
        ("from manager.daemon import core\n", handlers),
        ("if TYPE_CHECKING:\n    from .core import Manager\n", daemon),
        ("from . import core\n", daemon),
        ("from ..core import Manager\n", handlers),
    ]
    for source, package in found:
        assert _imports_core(source, package), source
    not_found = [
        ("from manager.daemon import seatfile\n", daemon),
        ("from .core import table\n", handlers),
        ("from manager.daemon.corestuff import x\n", daemon),
    ]
    for source, package in not_found:
        assert not _imports_core(source, package), source


def test_no_helper_of_the_manager_imports_it() -> None:
    importers = _importers()
    assert not importers & NARROWED
    # The composition root alone: every module of the daemon but core and serve is a helper.
    assert importers == COMPOSITION_ROOT, sorted(importers)


def test_the_allow_list_names_real_modules() -> None:
    for name in COMPOSITION_ROOT | NARROWED:
        assert (DAEMON / name).is_file(), name
