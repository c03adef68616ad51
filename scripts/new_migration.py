"""Freeze the live SQL that changed into a new alembic migration (`make migration NAME=…`).

``sql/`` holds the one live copy of each database object; ``migrations/sql/``
holds every revision a migration ever installed, frozen.  After editing live
files, this script compares each ``sql/functions/NAME.sql`` and
``sql/schema/NAME.sql`` with its newest frozen revision and, for each that
differs (or is new):

* writes the frozen copy ``migrations/sql/<kind>/NAME.v(N+1).sql`` (once:
  never edit it after; the next change is the next revision);
* writes ``migrations/versions/NNNN_<name>.py`` whose upgrade installs those
  revisions (functions first, then schema scripts, grants last) and whose
  downgrade installs the previous revisions again, or drops a function that
  is new.

What it cannot know, the author adds by hand in the generated file: a changed
signature or result type (``DROP FUNCTION`` before the new revision), a table
change (a one-shot ``migrations/sql/schema`` script), a dropped function, and
the docstring's *why*.  Then ``make schema-dump`` refreshes the committed
schema dump of head.

``--check`` writes nothing and exits 1 when a live file's statements differ
from its newest frozen revision's (a change with no migration yet); header
comments are not compared.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIVE = ROOT / "sql"
FROZEN = ROOT / "migrations" / "sql"
VERSIONS = ROOT / "migrations" / "versions"
KINDS = ("functions", "schema")
REVISION_FILE = re.compile(r"^(?P<rev>[0-9]{4})_.+\.py$")


@dataclass(frozen=True)
class Change:
    """One live file whose text is not its newest frozen revision."""

    kind: str  # "functions" or "schema"
    name: str
    old: int  # newest frozen revision, 0 when there is none
    text: str

    @property
    def new(self) -> int:
        return self.old + 1


def newest_revision(kind: str, name: str) -> int:
    """N of the newest migrations/sql/KIND/NAME.vN.sql, 0 when none exists."""
    pattern = re.compile(rf"^{re.escape(name)}\.v(?P<n>[0-9]+)\.sql$")
    found = [
        int(m["n"]) for p in (FROZEN / kind).glob(f"{name}.v*.sql") if (m := pattern.match(p.name))
    ]
    return max(found, default=0)


def statements(text: str) -> str:
    """The SQL a file runs: its text without the comment lines at column 0 (the header).

    A header edit alone changes nothing in the database, so it needs no
    migration; the next revision frozen carries it.
    """
    return "\n".join(line for line in text.splitlines() if not line.startswith("--")).strip()


def frozen_path(kind: str, name: str, version: int) -> Path:
    return FROZEN / kind / f"{name}.v{version}.sql"


def pending_changes() -> list[Change]:
    """Every live file that differs from its newest frozen revision, functions first."""
    out: list[Change] = []
    for kind in KINDS:
        for live in sorted((LIVE / kind).glob("*.sql")):
            name = live.stem
            old = newest_revision(kind, name)
            text = live.read_text(encoding="utf-8")
            frozen = frozen_path(kind, name, old)
            if old and statements(frozen.read_text(encoding="utf-8")) == statements(text):
                continue
            out.append(Change(kind, name, old, text))
    return out


def head_revision() -> str:
    revs = [m["rev"] for p in VERSIONS.glob("*.py") if (m := REVISION_FILE.match(p.name))]
    if not revs:
        raise SystemExit("error: no migration in migrations/versions/")
    return max(revs)


def _ordered(changes: list[Change]) -> list[Change]:
    """Functions, then schema scripts, grants last (they name the functions)."""
    return sorted(changes, key=lambda c: (c.kind != "functions", c.name == "grants"))


def _upgrade_lines(changes: list[Change]) -> list[str]:
    call = {"functions": "install", "schema": "run"}
    lines = [f'{call[c.kind]}(op, "{c.name}", {c.new})' for c in _ordered(changes)]
    new_function = any(c.kind == "functions" and not c.old for c in changes)
    grants = newest_revision("schema", "grants")
    if new_function and grants and not any(c.name == "grants" for c in changes):
        # A new function is executable by PUBLIC until the grants run again.
        lines.append(f'run(op, "grants", {grants})')
    return lines


def _downgrade_lines(changes: list[Change]) -> list[str]:
    """Functions back first (reversed), then schema scripts, grants last: the
    previous grants name the previous functions, so they run once those exist."""
    lines = []
    undo = sorted(reversed(changes), key=lambda c: (c.kind != "functions", c.name == "grants"))
    for c in undo:
        if c.old:
            call = "install" if c.kind == "functions" else "run"
            lines.append(f'{call}(op, "{c.name}", {c.old})')
        elif c.kind == "functions":
            lines.append(f'op.execute("DROP FUNCTION pepsi.{c.name}")')
        else:
            lines.append(f"# TODO by hand: undo migrations/sql/schema/{c.name}.v1.sql")
    return lines


def migration_text(title: str, revision: str, down: str, changes: list[Change]) -> str:
    listing = "\n".join(
        f"* {c.name} v{c.new}" + (f" (was v{c.old})" if c.old else " (new)")
        for c in _ordered(changes)
    )
    up_lines, down_lines = _upgrade_lines(changes), _downgrade_lines(changes)
    calls = {line.split("(")[0] for line in [*up_lines, *down_lines]}
    uses = sorted(calls & {"install", "run"})
    body_up = "\n    ".join(up_lines)
    body_down = "\n    ".join(down_lines)
    return f'''"""{title}

Why: (say what this changes for users and why.)

{listing}

Revision ID: {revision}
Revises: {down}
"""

from alembic import op

from migrations.sqlfiles import {", ".join(uses)}

revision = "{revision}"
down_revision = "{down}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    {body_up}


def downgrade() -> None:
    {body_down}
'''


def slug(name: str) -> str:
    out = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    if not out:
        raise SystemExit(
            "error: NAME must contain a letter or digit,"
            " e.g. make migration NAME=claim_skips_locked_rows"
        )
    return out


def write_migration(name: str, changes: list[Change]) -> Path:
    down = head_revision()
    revision = f"{int(down) + 1:04d}"
    for c in changes:
        target = frozen_path(c.kind, c.name, c.new)
        target.write_text(c.text, encoding="utf-8")
        print(f"froze {target.relative_to(ROOT)}")
    path = VERSIONS / f"{revision}_{slug(name)}.py"
    path.write_text(
        migration_text(name.replace("_", " "), revision, down, changes), encoding="utf-8"
    )
    print(
        f"wrote {path.relative_to(ROOT)}: edit its docstring (why), run make schema-dump,"
        f" and set SCHEMA_FLOOR in pepsi_dispatch/contract.py to {revision}"
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "name", nargs="?", help="what the migration does, e.g. claim_skips_locked_rows"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a live file has no migration yet"
    )
    args = parser.parse_args(argv)
    changes = pending_changes()
    if args.check:
        for c in changes:
            print(
                f"sql/{c.kind}/{c.name}.sql differs from its newest frozen revision"
                f" (v{c.old}): make migration NAME=…"
            )
        return 1 if changes else 0
    if not args.name:
        parser.error("give the migration a name: make migration NAME=what_it_does")
    if not changes:
        print(
            "nothing to freeze: every live file in sql/ is its newest revision in migrations/sql/"
        )
        return 0
    write_migration(args.name, changes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
