"""Code shape: no function or method over 60 lines (no database).

Modules are split by job, not by length: there is no module line cap.

A function's length runs from its ``def`` line to its last line (decorators not
counted); nested functions and methods are measured on their own too.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

MAX_FUNCTION_LINES = 60

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
PACKAGE = ROOT / "pepsi_dispatch"

#: Developer tooling (the benchmark, the demo): scripts, not held to the product's shape.
EXCLUDED_DIRS = ("pepsi_dispatch/devtools/",)

#: Known offenders, each being split elsewhere right now. An entry must still offend:
#: once a file is in shape the test fails until its entry is removed here. (Empty:
#: every module is in shape.)
ALLOWLIST: dict[str, str] = {}


def offences(source: str, path: str) -> list[str]:
    """``path:line`` and length of every function over the limit."""
    found = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > MAX_FUNCTION_LINES:
            found.append(
                f"{path}:{node.lineno}: {node.name}() is {length} lines (max {MAX_FUNCTION_LINES})"
            )
    return sorted(found, key=lambda line: int(line.split(":")[1]))


def problems(found: Mapping[str, list[str]], allowlist: Mapping[str, str]) -> list[str]:
    """What is wrong: offenders not allowlisted, and allowlisted files no longer offending."""
    out = []
    for path, lines in sorted(found.items()):
        if lines and path not in allowlist:
            out.extend(lines)
    for path in sorted(allowlist):
        if not found.get(path):
            out.append(f"{path}: in shape now; remove it from ALLOWLIST in {Path(__file__).name}")
    return out


def package_offences() -> dict[str, list[str]]:
    found = {}
    for file in sorted(PACKAGE.rglob("*.py")):
        path = file.relative_to(ROOT).as_posix()
        if not path.startswith(EXCLUDED_DIRS):
            found[path] = offences(file.read_text(encoding="utf-8"), path)
    return found


def test_package_shape() -> None:
    wrong = problems(package_offences(), ALLOWLIST)
    assert not wrong, "split these:\n" + "\n".join(wrong)


def _function(name: str, body_lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x = {i}\n" for i in range(body_lines))
    return f"{indent}def {name}():\n{body}"


def test_function_of_exactly_the_limit_passes() -> None:
    assert offences(_function("f", MAX_FUNCTION_LINES - 1), "m.py") == []


def test_long_function_is_named_with_line_and_length() -> None:
    source = "import os\n\n" + _function("f", MAX_FUNCTION_LINES)
    assert offences(source, "pkg/m.py") == ["pkg/m.py:3: f() is 61 lines (max 60)"]


def test_decorators_are_not_counted_but_methods_and_nested_functions_are() -> None:
    decorated = "@a\n@b\n" + _function("ok", MAX_FUNCTION_LINES - 1)
    method = "class C:\n" + _function("m", MAX_FUNCTION_LINES, indent="    ")
    nested = "async def outer():\n" + _function("inner", MAX_FUNCTION_LINES, indent="    ")
    found = offences(decorated + method + nested, "m.py")
    assert [line.split(": ")[1] for line in found] == [
        "m() is 61 lines (max 60)",
        "outer() is 62 lines (max 60)",
        "inner() is 61 lines (max 60)",
    ]


def test_a_long_module_is_no_offence() -> None:
    """Modules are split by job, not by length."""
    assert offences("x = 1\n" * 2000, "m.py") == []


@pytest.mark.parametrize(
    ("found", "allowlist", "expected"),
    [
        ({"a.py": [], "b.py": ["b.py:3: f() is 61 lines (max 60)"]}, {}, ["b.py:3: f() is 61"]),
        ({"b.py": ["b.py:3: f() is 61 lines (max 60)"]}, {"b.py": "being split"}, []),
        # An allowlisted file that is now in shape (or gone) fails: the list only shrinks.
        ({"a.py": []}, {"a.py": "was long"}, ["a.py: in shape now; remove it from ALLOWLIST"]),
        ({}, {"gone.py": "was long"}, ["gone.py: in shape now; remove it from ALLOWLIST"]),
    ],
)
def test_problems(
    found: dict[str, list[str]], allowlist: dict[str, str], expected: list[str]
) -> None:
    wrong = problems(found, allowlist)
    assert len(wrong) == len(expected)
    for line, start in zip(wrong, expected, strict=True):
        assert line.startswith(start)


def test_allowlisted_file_brought_into_shape_fails() -> None:
    """The whole path: real source through offences() into problems()."""
    in_shape = _function("f", 10)
    too_long = _function("f", MAX_FUNCTION_LINES + 5)
    allow = {"pkg/w.py": "being split"}
    assert problems({"pkg/w.py": offences(too_long, "pkg/w.py")}, allow) == []
    assert problems({"pkg/w.py": offences(in_shape, "pkg/w.py")}, allow) == [
        "pkg/w.py: in shape now; remove it from ALLOWLIST in test_code_shape.py"
    ]
