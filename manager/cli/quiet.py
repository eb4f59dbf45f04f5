"""The CLI's logging stays quiet without importing structlog up front.

A command prints for people and refuses by name; the events cotal's modules log belong to the
daemon's log file, so the CLI configures structlog to drop them (`manager.logs.quiet`). But
importing structlog (and the asyncio it imports) is about 40 ms of every command's start, and
most commands (`ps`, `send`, `spawn`, `logs`, ...) never log. So the configuration is made the
moment something imports structlog, before any of its loggers can be used: a finder placed first
on `sys.meta_path` for that one name, which lets the normal machinery load it, then configures
it and steps aside.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType


class _QuietOnLoad:
    """A meta-path finder that only answers for `structlog`: its spec as found on `sys.path`,
    with a loader that configures the quiet logging right after the module has run."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != "structlog":
            return None
        sys.meta_path.remove(self)
        spec = PathFinder.find_spec(name, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _drop_every_event(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _drop_every_event(structlog: ModuleType) -> None:
    """What `manager.logs.quiet` makes of the CLI's logging, configured from inside structlog's
    own import, where `manager.logs` (which imports structlog) may itself be half imported:
    cotal logs nothing at CRITICAL, so no event passes, and one that did would go to stderr."""
    import logging

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def when_loaded() -> None:
    """Quiet the CLI's logging now if structlog is loaded, else the moment it is. With
    `COTAL_DEBUG=1` the command's warnings go to stderr (`manager.logs.quiet`), so structlog is
    imported at once."""
    if "structlog" in sys.modules or os.environ.get("COTAL_DEBUG") == "1":
        from manager import logs

        logs.quiet()
        return
    if not any(isinstance(f, _QuietOnLoad) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietOnLoad())
