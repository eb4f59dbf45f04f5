"""The CLI registers its commands: every command module adds its own parser and handler, `main`
only collects them, and no module under manager/cli or manager/coord imports another in a
circle (read with `ast`, imports inside functions included) or reaches up into `main`. The
coordinators sit below the CLI and the daemon: they import neither, and the daemon never names
the CLI, not even as a child process's module (`python -m manager.cli`)."""

from __future__ import annotations

import argparse
import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

from manager.cli.args import top

# The package re-exports main(), which shadows the module of the same name.
cli_main = importlib.import_module("manager.cli.main")

MANAGER = Path(__file__).resolve().parents[2] / "manager"
CLI = MANAGER / "cli"
COORD = MANAGER / "coord"
# The entry points: they import main, and nothing under manager/cli imports them.
ENTRY = {"manager.cli", "manager.cli.__main__"}


def _leaves(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield parser
    for action in subs:
        for child in action.choices.values():
            yield from _leaves(child)


def _top_commands(parser: argparse.ArgumentParser) -> list[str]:
    [subs] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(subs.choices)


def test_every_command_module_registers_at_least_one_command_of_its_own() -> None:
    seen: list[str] = []
    for module in cli_main.COMMAND_MODULES:
        p, sub = top()
        module.register(sub)
        names = _top_commands(p)
        assert names, module.__name__
        assert not set(names) & set(seen), module.__name__
        seen += names
    assert seen == _top_commands(cli_main.parser())
    assert seen == [
        "up",
        "down",
        "manager",
        "broker",
        "spawn",
        "ps",
        "send",
        "stop",
        "start",
        "restart",
        "rm",
        "budget",
        "move",
        "takeover",
        "drain",
        "inbox",
        "status",
        "doctor",
        "metrics",
        "logs",
        "events",
        "console",
        "tools",
        "checkpoint",
        "trust",
    ]


def test_every_command_has_a_handler_from_the_module_that_registered_it() -> None:
    for module in cli_main.COMMAND_MODULES:
        p, sub = top()
        module.register(sub)
        leaves = list(_leaves(p))
        assert leaves
        for leaf in leaves:
            handler = leaf.get_default("run")
            assert callable(handler), leaf.prog
            assert handler.__module__ == module.__name__, leaf.prog


def _module_name(path: Path) -> str:
    rel = path.relative_to(CLI.parents[1]).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path, packages: tuple[str, ...] = ("manager.cli", "manager.coord")) -> set[str]:
    """The modules of `packages` that `path` imports anywhere in it (a function's import counts:
    it is the same dependency, taken later)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith(packages)}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in packages:
                out |= {f"{node.module}.{a.name}" for a in node.names}
            elif node.module.startswith(tuple(f"{p}." for p in packages)):
                out.add(node.module)
    return out


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in [*CLI.glob("*.py"), *COORD.glob("*.py")]}
    # `from manager.cli import main` names the function the package re-exports, from main.
    return {
        name: {m for m in _imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }


def test_no_module_under_manager_cli_imports_another_in_a_circle() -> None:
    graph = _graph()
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str], done: set[str]) -> None:
        for dep in sorted(graph[node]):
            if dep in stack:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in done:
                visit(dep, [*stack, dep], done)
        done.add(node)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name], done)
    assert cycles == []


def test_only_the_entry_points_import_main() -> None:
    graph = _graph()
    importers = sorted(name for name, deps in graph.items() if "manager.cli.main" in deps)
    assert set(importers) == ENTRY


def test_the_scan_sees_a_function_level_import() -> None:
    # cut.py takes offline.py only on the recovery path, inside a function.
    assert "manager.coord.offline" in _graph()["manager.coord.cut"]


def test_the_coordinators_import_neither_the_cli_nor_the_daemon() -> None:
    upward = {
        p.name: sorted(_imports(p, ("manager.cli", "manager.daemon")))
        for p in COORD.glob("*.py")
        if _imports(p, ("manager.cli", "manager.daemon"))
    }
    assert upward == {}


def test_the_daemon_never_calls_the_cli() -> None:
    # Neither an import nor a child process: `python -m manager.cli` named in a string is the
    # daemon calling the top floor as surely as an import is.
    named = sorted(
        str(p.relative_to(MANAGER))
        for p in (MANAGER / "daemon").rglob("*.py")
        if "manager.cli" in p.read_text()
    )
    assert named == []
