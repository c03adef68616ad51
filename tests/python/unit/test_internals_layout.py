"""docs/INTERNALS.md's layout names every module of the package (no database).

The layout is where a newcomer finds the parts; a module missing from it is a
part nobody can find. Each module must appear in the layout block under its
own file name (``dispatcher.py``) or, for a package's ``__init__``/``__main__``, its
folder (``bench/``).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def layout_block() -> str:
    text = (ROOT / "docs" / "INTERNALS.md").read_text(encoding="utf-8")
    start = text.index("## Layout")
    return text[start : text.index("\n## ", start + 1)]


def missing(block: str, root: Path) -> list[str]:
    out = []
    for path in sorted((root / "pepsi_dispatch").rglob("*.py")):
        rel = path.relative_to(root)
        name = f"{rel.parent.name}/" if path.stem in ("__init__", "__main__") else path.name
        if rel.parent == Path("pepsi_dispatch") and path.stem == "__init__":
            continue
        if name not in block:
            out.append(str(rel))
    return out


def test_the_layout_names_every_module() -> None:
    assert missing(layout_block(), ROOT) == []


def test_the_check_reports_a_module_the_layout_omits(tmp_path: Path) -> None:
    (tmp_path / "pepsi_dispatch" / "part").mkdir(parents=True)
    (tmp_path / "pepsi_dispatch" / "part" / "__init__.py").write_text("")
    (tmp_path / "pepsi_dispatch" / "part" / "known.py").write_text("")
    (tmp_path / "pepsi_dispatch" / "part" / "hidden.py").write_text("")
    assert missing("part/  known.py", tmp_path) == [
        str(Path("pepsi_dispatch", "part", "hidden.py"))
    ]
