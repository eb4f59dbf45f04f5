"""Keep the console's libraries out of every process that is not the console.

The console's web view (textual-serve) brings aiohttp, and textual brings rich. Both are
optional imports of libraries every cotal process loads: nats-py imports aiohttp, when it is
installed, for `ws://` servers (cotal never names one), and structlog's dev module imports rich
and pygments for pretty tracebacks (cotal's logs are key-value lines). Installed beside the
console, they made an interpreter that imports what the manager imports hold 61.3 MB instead
of 48.7 MB, and cost every CLI call that talks to the broker about 150 ms more CPU (measured on
this checkout: `manager.daemon.serve` imported with and without them marked absent). So a
process that is not the console marks them absent before anything looks, and the libraries take
the path they take on a machine without them.
"""

from __future__ import annotations

import sys

CONSOLE_ONLY = ("aiohttp", "rich")


def without_console_libraries() -> None:
    """Make `import aiohttp` and `import rich` fail in this process, unless one was imported
    already (then whoever did needs it, and a second import of it is free)."""
    for name in CONSOLE_ONLY:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def with_console_libraries() -> None:
    """Undo `without_console_libraries` for the console itself (a process forked from one that
    marked them absent): the libraries that already looked keep the path they took."""
    for name in CONSOLE_ONLY:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]
