"""Render docs/cli.md's "Refusal codes" table from protocol/refusals.py.

    .venv/bin/python bench/refusal_table.py          # rewrite the table in docs/cli.md
    .venv/bin/python bench/refusal_table.py --check  # exit 1 if the table is not up to date

Only the lines between the two markers change, so the prose around the table stays the
writer's. tests/unit/test_refusal_catalogue.py checks the same agreement row by row; this is
the way to make it pass after an edit of the catalogue.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protocol.refusals import ENTRIES  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
BEGIN = "<!-- refusal-catalogue:begin"
END = "<!-- refusal-catalogue:end -->"
HEADER = ("| code | meaning | cure |", "|---|---|---|")


def table() -> list[str]:
    """The table's lines, one row per code in code order."""
    ordered = sorted(ENTRIES, key=lambda e: e.code)
    return [*HEADER, *(f"| `{e.code}` | {e.meaning} | {e.cure} |" for e in ordered)]


def render(text: str) -> str:
    """`text` with the lines between the markers replaced by the table."""
    lines = text.splitlines()
    begin = next(i for i, line in enumerate(lines) if line.startswith(BEGIN))
    end = lines.index(END, begin)
    return "\n".join([*lines[: begin + 1], *table(), *lines[end:]]) + "\n"


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    new = render(text)
    if "--check" in argv:
        if new != text:
            sys.stderr.write(f"{DOC}: the refusal table is not the catalogue's; rerun {__file__}\n")
            return 1
        return 0
    if new != text:
        DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
