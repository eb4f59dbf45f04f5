"""The console's libraries stay out of every other process (manager/lean.py): what the manager
imports, imported after the mark, loads neither aiohttp nor rich, and the console, undoing the
mark in a process that made it, imports both."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from manager import lean
lean.without_console_libraries()
import manager.daemon.serve, manager.cli.main, structlog.dev
loaded = sorted(
    {m.split(".")[0] for m, mod in sys.modules.items() if mod is not None} & {"aiohttp", "rich"}
)
print(",".join(loaded) or "-")
lean.with_console_libraries()
import aiohttp, rich
print(aiohttp.__name__, rich.__name__)
"""


def test_the_manager_imports_neither_aiohttp_nor_rich_and_the_console_gets_both() -> None:
    out = subprocess.run(
        [sys.executable, "-I", "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout
    assert out == "-\naiohttp rich\n"
