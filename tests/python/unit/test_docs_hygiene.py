"""The docs and comments stand on their own (no database).

README, docs/, man pages, code, tests, SQL and build files never cite the
tracker ("issue 7"), a specification outside the repository ("SPEC", "§3") or
files outside it: a reader of the repository has none of those, and history
belongs in commit messages. Every file of the repository they name exists
(modules move; comments must follow), and the operator's manual stays a
manual.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
THIS = Path(__file__).resolve()

#: Where citations are looked for: files, and folders searched for these suffixes.
FILES = ("README.md", "Makefile", "pyproject.toml", "setup.py", "Dockerfile", "alembic.ini")
FOLDERS = (
    "docs",
    "man",
    "pepsi_dispatch",
    "tests",
    "sql",
    "migrations",
    "scripts",
    "examples",
    "contrib",
)
SUFFIXES = {".md", ".py", ".sql", ".sh", ".1", ".5", ".conf", ".ini", ".toml", ".service"}
SUFFIXES |= {".js", ".html", ".css"}

# Built from parts so that this file does not match itself.
CITATIONS = {
    "a tracker issue": re.compile(r"\b[Ii]ssues?\s+#?\d+"),
    "the specification": re.compile(r"\b" + "SP" + r"EC\b"),
    "a section sign": re.compile("\u00a7"),
    "a file outside the repository": re.compile(r"\.\./shared\b|/work/" + "shared"),
}

OPERATIONS_MAX_LINES = 700


def _texts() -> list[Path]:
    paths = [ROOT / name for name in FILES if (ROOT / name).is_file()]
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and path.resolve() != THIS:
                paths.append(path)
    return paths


def citations(text: str) -> list[tuple[int, str, str]]:
    """(line number, kind, the line) for every citation in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for kind, pattern in CITATIONS.items():
            if pattern.search(line):
                found.append((number, kind, line.strip()))
    return found


def test_the_patterns_catch_what_they_are_for() -> None:
    cited = [
        "Unit tests of the backoff (issue 7).",
        "see Issue 8, hole 3",
        "-- the schema of " + "SP" + "EC \u00a72",
        "as in ../shared/notes.md",
    ]
    kinds = [[kind for _, kind, _ in citations(line)] for line in cited]
    assert kinds == [
        ["a tracker issue"],
        ["a tracker issue"],
        ["the specification", "a section sign"],
        ["a file outside the repository"],
    ]
    clean = "spec = payload.get('do'); a dispatcher issued 3 claims; respecting SPECIAL cases"
    assert citations(clean) == []


def test_no_doc_or_comment_cites_the_tracker_a_spec_or_outside_files() -> None:
    wrong = []
    for path in _texts():
        text = path.read_text(encoding="utf-8", errors="replace")
        where = path.relative_to(ROOT)
        wrong += [f"{where}:{n}: {kind}: {line}" for n, kind, line in citations(text)]
    assert not wrong, "say the reason instead of citing it:\n" + "\n".join(wrong)


#: A path from the repository's root to a file: docs/X.md, pepsi_dispatch/a/b.py, ...
REPO_PATH = re.compile(
    r"\b((?:docs|pepsi_dispatch|tests|sql|migrations|scripts|contrib|examples)"
    r"/[\w./-]*\w\.(?:py|sql|md|sh|conf|service))\b"
)


def named_paths(text: str) -> set[str]:
    """Repository paths named in ``text``, patterns (``*``, ``vN``, ``NAME``) left out."""
    return {
        m
        for m in REPO_PATH.findall(text)
        if "*" not in m and ".vN." not in m and "NAME" not in m and "/_data/" not in m
    }


def test_named_paths_are_found() -> None:
    text = "see docs/PROTOCOL.md and pepsi_dispatch/pipeline.py, not sql/functions/NAME.vN.sql"
    assert named_paths(text) == {"docs/PROTOCOL.md", "pepsi_dispatch/pipeline.py"}


def test_every_repository_file_named_exists() -> None:
    missing = []
    frozen = ROOT / "migrations" / "sql"  # history: its comments name the paths of their time
    for path in _texts():
        if path.is_relative_to(frozen):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        where = path.relative_to(ROOT)
        missing += [
            f"{where}: {name}" for name in sorted(named_paths(text)) if not (ROOT / name).exists()
        ]
    assert not missing, "files named that do not exist (moved?):\n" + "\n".join(missing)


def test_the_operators_manual_stays_short_and_the_benchmarks_have_a_current_run() -> None:
    lines = (ROOT / "docs" / "OPERATIONS.md").read_text(encoding="utf-8").count("\n")
    assert lines <= OPERATIONS_MAX_LINES, (
        f"docs/OPERATIONS.md has {lines} lines (at most {OPERATIONS_MAX_LINES}): "
        "measurements go to docs/BENCHMARKS.md"
    )
    benchmarks = (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert "\n## Current run\n" in benchmarks
