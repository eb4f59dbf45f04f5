"""The CLI's conventions: one exit status per class of outcome, the subcommand's usage on a
usage error, help and examples everywhere, `--version`, a closed stdout ending quietly, and
errors on stderr (one JSON document under `--json`)."""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import pytest

from manager.cli.output import (
    EX_INTERNAL,
    EX_INTERRUPTED,
    EX_OK,
    EX_PIPE_CLOSED,
    EX_REFUSED,
    EX_USAGE,
)
from tests.conftest import cotal_env

NOT_UP = "no manager has been started in {root}; run `cotal up --detach` there"
EMPTY_PROMPT = (
    "the prompt is empty; pass the text the seat should start with, or leave --prompt out"
)
# The package re-exports main(), which shadows the module of the same name.
cli_main = importlib.import_module("manager.cli.main")
cli_health = importlib.import_module("manager.cli.health")
INTERNAL_CURE = "; report this with .cotal/logs/manager.log\n"


def cotal(
    *args: str, env: dict[str, str] | None = None, stdout: int = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "manager.cli", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        env=cotal_env(env),
    )


def refusal_of(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.stdout == "", proc.stdout
    [line] = proc.stderr.splitlines()
    doc: dict[str, object] = json.loads(line)
    return doc


# -- usage: 64 -----------------------------------------------------------------------------------


def test_an_unknown_flag_is_a_usage_error_with_the_subcommands_usage(root: Path) -> None:
    proc = cotal("ps", "--wdie", "--root", str(root))
    assert proc.returncode == EX_USAGE == 64
    assert proc.stdout == ""
    assert proc.stderr.startswith("usage: cotal ps [-h] ")
    assert proc.stderr.endswith("cotal ps: error: unrecognized arguments: --wdie\n")


@pytest.mark.parametrize(
    ("argv", "usage", "error"),
    [
        ([], "usage: cotal ", "cotal: error: the following arguments are required: COMMAND"),
        (
            ["manager", "serve"],
            "usage: cotal manager serve ",
            "cotal manager serve: error: the following arguments are required: --server",
        ),
        (
            ["send", "alice", "hi", "--timeout", "soon"],
            "usage: cotal send ",
            "cotal send: error: argument --timeout: invalid float value: 'soon'",
        ),
        (
            ["checkpoint", "verify", "d", "--bogus"],
            "usage: cotal checkpoint verify ",
            "cotal checkpoint verify: error: unrecognized arguments: --bogus",
        ),
        (["nope"], "usage: cotal ", "cotal: error: argument COMMAND: invalid choice: 'nope'"),
    ],
)
def test_every_parse_error_exits_64(argv: list[str], usage: str, error: str) -> None:
    proc = cotal(*argv)
    assert proc.returncode == EX_USAGE, proc.stderr
    assert proc.stderr.startswith(usage) and error in proc.stderr, proc.stderr


# -- refusal: 2, nothing to do: 0 ------------------------------------------------------------------


def test_a_refusal_exits_2_on_stderr_and_as_one_json_document(root: Path) -> None:
    text = cotal("spawn", "alice", "--prompt", "hello", "--root", str(root))
    assert text.returncode == EX_REFUSED == 2
    assert text.stdout == ""
    assert text.stderr == f"cotal: {NOT_UP.format(root=root)}\n"

    machine = cotal("spawn", "alice", "--prompt", "hello", "--root", str(root), "--json")
    assert machine.returncode == EX_REFUSED
    assert refusal_of(machine) == {
        "ok": False,
        "code": "not-up",
        "error": NOT_UP.format(root=root),
    }


def test_down_with_nothing_up_is_success(root: Path) -> None:
    proc = cotal("down", "--root", str(root))
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        EX_OK,
        f"nothing is up in {root}\n",
        "",
    )
    machine = cotal("down", "--root", str(root), "--json")
    assert machine.returncode == EX_OK and machine.stderr == ""
    assert json.loads(machine.stdout) == {
        "nothingUp": True,
        "root": str(root),
        "seats": [],
        "manager": None,
        "broker": None,
    }
    assert not (root / ".cotal").exists()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--since", "20261201T000000Z-0a1b2c3d"], "--since"),
        (["--include", ".env", "--session-store", "sessions"], "--include, --session-store"),
    ],
)
def test_cut_flags_without_preserve_state_are_refused(
    root: Path, flags: list[str], named: str
) -> None:
    proc = cotal("down", *flags, "--root", str(root), "--json")
    assert proc.returncode == EX_REFUSED
    assert refusal_of(proc) == {
        "ok": False,
        "code": "bad-args",
        "error": f"{named} shape a cut, and plain `cotal down` is not one; add "
        "--preserve-state, or leave them out to stop the mesh without a checkpoint",
    }


def test_down_with_a_mesh_record_but_no_token_still_refuses(root: Path) -> None:
    """`not-up` from a root whose mesh record survives may hide a running broker: not success."""
    (root / ".cotal").mkdir(mode=0o700)
    (root / ".cotal" / "mesh.json").write_text(
        '{"version": 1, "space": "main", "server": "x", "creds": null}'
    )
    proc = cotal("down", "--root", str(root))
    assert proc.returncode == EX_REFUSED, proc.stderr
    assert proc.stderr == f"cotal: {NOT_UP.format(root=root)}\n"


@pytest.mark.parametrize(
    ("prompt", "error"),
    [
        ("", EMPTY_PROMPT),
        ("  \n", EMPTY_PROMPT),
        (
            "-rf /",
            "refusing a prompt starting with '-' or '@' (the harness would parse it as an option"
            " or a file); reword the prompt so it does not start with '-' or '@'",
        ),
        (
            "@notes.md",
            "refusing a prompt starting with '-' or '@' (the harness would parse it as an option"
            " or a file); reword the prompt so it does not start with '-' or '@'",
        ),
    ],
)
def test_a_bad_prompt_is_refused_before_the_manager_is_asked(
    root: Path, prompt: str, error: str
) -> None:
    # Nothing is up in this root: had the CLI asked the manager, the refusal would be `not-up`.
    proc = cotal("spawn", "alice", f"--prompt={prompt}", "--root", str(root))
    assert proc.returncode == EX_REFUSED
    assert proc.stderr == f"cotal: {error}\n"
    machine = cotal("spawn", "alice", f"--prompt={prompt}", "--root", str(root), "--json")
    assert machine.returncode == EX_REFUSED
    assert refusal_of(machine) == {"ok": False, "code": "bad-prompt", "error": error}


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (
            ["--json"],
            "the terminal console draws a screen and prints no JSON; use `cotal console --web "
            "--json` for the web console's address, or `cotal ps --fleet --json` and `cotal "
            "events --fleet --json` for the same data",
        ),
        (
            ["--web", "--host", "0.0.0.0"],
            "--host '0.0.0.0' is not a loopback address: the web console stops, starts, sends "
            "to and moves seats, so it listens on this host alone; leave --host out "
            "(127.0.0.1), and from another machine reach it through an SSH tunnel (ssh -L "
            "PORT:127.0.0.1:PORT host)",
        ),
        (
            ["--web", "--host", "console.example.com"],
            "--host 'console.example.com' is not a loopback address: the web console stops, "
            "starts, sends to and moves seats, so it listens on this host alone; leave --host "
            "out (127.0.0.1), and from another machine reach it through an SSH tunnel (ssh -L "
            "PORT:127.0.0.1:PORT host)",
        ),
        (["--poll", "0"], "--poll 0.0 is not from 0.1 to 60 s; give --poll 2"),
    ],
    ids=["json-without-web", "any-address", "a-host-name", "poll"],
)
def test_the_console_refuses_what_it_cannot_do_by_name(
    root: Path, flags: list[str], error: str
) -> None:
    # The root has a .cotal, so the web console's refusal is its address's, not `not-up`.
    (root / ".cotal").mkdir(mode=0o700)
    proc = cotal("console", *flags, "--root", str(root), "--json")
    assert proc.returncode == EX_REFUSED, proc.stderr
    assert refusal_of(proc) == {"ok": False, "code": "bad-args", "error": error}


def test_the_terminal_console_without_a_terminal_is_refused(root: Path) -> None:
    proc = cotal("console", "--root", str(root))
    assert proc.returncode == EX_REFUSED
    assert proc.stderr == (
        "cotal: the console draws on a terminal, and stdin or stdout is not one; run it in a "
        "terminal, or `cotal console --web` and open the page\n"
    )


def test_the_web_console_of_a_root_never_up_is_refused_not_up(root: Path) -> None:
    proc = cotal("console", "--web", "--root", str(root))
    assert proc.returncode == EX_REFUSED
    assert proc.stderr == f"cotal: {NOT_UP.format(root=root)}\n"


def test_no_other_command_imports_textual() -> None:
    """The console's import is its handler's: `cotal ps` and the rest do not pay for it."""
    probe = (
        "import importlib, sys; importlib.import_module('manager.cli.main').parser(); "
        "print(sorted(k for k in sys.modules if k.split('.')[0] in "
        "('textual', 'textual_serve', 'aiohttp', 'manager')"
        " and (k.startswith('manager.console') or not k.startswith('manager'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=cotal_env()
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "[]\n"


# -- --version, help -----------------------------------------------------------------------------


def test_version() -> None:
    proc = cotal("--version")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        EX_OK,
        f"cotal {metadata.version('cotal')}\n",
        "",
    )


def _parsers(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[argparse.ArgumentParser, bool]]:
    """Every parser under `parser` (itself included), and whether it is a leaf command."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    yield parser, not subs
    for action in subs:
        for child in action.choices.values():
            yield from _parsers(child)


COMMANDS = [
    "cotal broker serve",
    "cotal broker add-host",
    "cotal broker revoke-host",
    "cotal budget lift",
    "cotal checkpoint discard",
    "cotal checkpoint list",
    "cotal checkpoint pack",
    "cotal checkpoint verify",
    "cotal console",
    "cotal doctor",
    "cotal down",
    "cotal drain",
    "cotal events",
    "cotal inbox",
    "cotal logs",
    "cotal manager serve",
    "cotal manager warm",
    "cotal metrics",
    "cotal move",
    "cotal ps",
    "cotal restart",
    "cotal rm",
    "cotal send",
    "cotal spawn",
    "cotal start",
    "cotal status",
    "cotal stop",
    "cotal takeover",
    "cotal tools install",
    "cotal trust add",
    "cotal trust list",
    "cotal trust remove",
    "cotal up",
]


def test_every_flag_has_help_and_every_command_an_example() -> None:
    parsers = list(_parsers(cli_main.parser()))
    leaves = [p.prog for p, leaf in parsers if leaf]
    # Every command an operator can type; a new one joins this list with its help and example.
    assert sorted(leaves) == sorted(COMMANDS)
    missing = [
        f"{p.prog} {'/'.join(a.option_strings) or a.dest}"
        for p, _ in parsers
        for a in p._actions
        if not (a.help or "").strip()
    ]
    assert missing == []
    no_example = [
        p.prog for p, leaf in parsers if leaf and "examples:\n  cotal " not in (p.epilog or "")
    ]
    assert no_example == []
    for p, _ in parsers:
        # Examples keep their lines: the formatter must not rewrap them.
        assert p.formatter_class is argparse.RawDescriptionHelpFormatter, p.prog
        p.format_help()


# -- stdout closed early: 141 ------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["ps", "--help"], ["--version"], ["down"]],
    ids=["help", "ps-help", "version", "down-nothing-up"],
)
def test_a_closed_stdout_ends_quietly(root: Path, argv: list[str]) -> None:
    """As `cotal ps --help | head -1`, with the reader gone before the first write: a reader
    that read one line first could have left a short output fitting in the pipe buffer, and
    then nothing here could fail."""
    r, w = os.pipe()
    os.close(r)
    # Buffered, as an operator's shell runs it: unbuffered, argparse swallows the error itself.
    env = {k: v for k, v in cotal_env().items() if k != "PYTHONUNBUFFERED"}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "manager.cli", *argv, "--root", str(root)],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        os.close(w)
    assert proc.returncode == EX_PIPE_CLOSED == 141
    assert proc.stderr == ""


@contextmanager
def closed_stdout() -> Iterator[None]:
    """sys.stdout on a pipe nobody reads. Installed inside the test body: pytest reinstalls its
    own capture between a fixture's setup and the test's call."""
    r, w = os.pipe()
    os.close(r)
    out = io.TextIOWrapper(io.FileIO(w, "w"))
    saved, sys.stdout = sys.stdout, out
    try:
        yield
    finally:
        sys.stdout = saved
        try:
            out.close()
        except BrokenPipeError:
            pass  # the descriptor is closed all the same; only the buffered rows are lost


def _command_that(
    raises: BaseException | None, lines: int = 0
) -> Callable[[argparse.Namespace], int]:
    def fn(_args: argparse.Namespace) -> int:
        for i in range(lines):
            cli_main.say(f"row {i}")
        if raises is not None:
            raise raises
        return EX_OK

    return fn


def test_a_closed_stdout_inside_a_command_ends_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_health, "run_status", _command_that(None, lines=3))
    with closed_stdout():
        assert cli_main.main(["status"]) == EX_PIPE_CLOSED
    assert capsys.readouterr().err == ""


def test_a_broken_pipe_elsewhere_is_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control socket can break too; with stdout still read, that is a failure to report."""
    boom = BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(cli_health, "run_status", _command_that(boom))
    assert cli_main.main(["status"]) == EX_INTERNAL
    assert capsys.readouterr().err == (
        "cotal: internal error: BrokenPipeError: [Errno 32] Broken pipe" + INTERNAL_CURE
    )


# -- internal error: 1, Ctrl-C: 130 --------------------------------------------------------------


def test_an_unexpected_exception_is_one_line_not_a_traceback(root: Path) -> None:
    # A file where the control directory belongs is nothing any reader of it expects.
    (root / ".cotal").write_text("")
    proc = cotal("status", "--root", str(root))
    assert proc.returncode == EX_INTERNAL == 1
    assert proc.stdout == ""
    assert proc.stderr == (
        "cotal: internal error: NotADirectoryError: [Errno 20] Not a directory: "
        f"'{root}/.cotal/auth/control.token'" + INTERNAL_CURE
    )

    debug = cotal("status", "--root", str(root), env={"COTAL_DEBUG": "1"})
    assert debug.returncode == 1
    assert debug.stderr.startswith("Traceback (most recent call last):\n")
    assert debug.stderr.endswith(f"Not a directory: '{root}/.cotal/auth/control.token'\n")


def test_an_internal_error_under_json_is_one_json_document(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_health, "run_status", _command_that(ValueError("two\nlines")))
    assert cli_main.main(["status", "--json"]) == EX_INTERNAL
    out, err = capsys.readouterr()
    assert out == ""
    assert json.loads(err) == {
        "ok": False,
        "code": "internal-error",
        "error": "ValueError: two lines" + INTERNAL_CURE.rstrip("\n"),
    }


def test_ctrl_c_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_health, "run_status", _command_that(KeyboardInterrupt()))
    assert cli_main.main(["status"]) == EX_INTERRUPTED == 130
    assert capsys.readouterr() == ("", "")
