"""checks.program_problem: what keeps a PROGRAM (or its #! interpreter) from running."""

from __future__ import annotations

from pathlib import Path

from pepsi_dispatch.coordinator.checks import program_problem


def script(tmp_path: Path, shebang: str) -> Path:
    p = tmp_path / "stage"
    p.write_text(f"#!{shebang}\nexit 0\n")
    p.chmod(0o755)
    return p


def test_interpreter_in_a_missing_directory_is_said_to_be_missing(tmp_path: Path) -> None:
    # It said "directory .../nodir is not searchable": a permission hint for a typo.
    missing = tmp_path / "nodir" / "python3"
    problem = program_problem(str(script(tmp_path, str(missing))))
    assert problem is not None
    assert f"interpreter {missing} of PROGRAM" in problem
    assert f"it does not exist (no directory {tmp_path / 'nodir'})" in problem
    assert "searchable" not in problem


def test_program_in_a_missing_directory(tmp_path: Path) -> None:
    problem = program_problem(str(tmp_path / "a" / "b" / "stage"))
    assert problem is not None and "searchable" not in problem
    assert f"no directory {tmp_path / 'a'}" in problem


def test_missing_interpreter_file(tmp_path: Path) -> None:
    missing = tmp_path / "python9"
    problem = program_problem(str(script(tmp_path, str(missing))))
    assert problem is not None and problem.endswith("it does not exist"), problem


def test_runnable_script(tmp_path: Path) -> None:
    assert program_problem(str(script(tmp_path, "/bin/sh"))) is None
