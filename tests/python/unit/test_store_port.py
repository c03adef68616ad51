"""The database port (coordinator/database/port.py), its PostgreSQL store and the
typed fake the unit tests use agree member by member (no database).

A type checker checks the same structurally; this test needs none: each
member of ``DispatchStore`` must exist on both with the same signature, down
to the annotations, so the fake cannot drift from the port the coordinator
is written against.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any, Protocol

from fake_store import FakeStore

from pepsi_dispatch.coordinator.database.port import DispatchStore
from pepsi_dispatch.coordinator.database.postgres import PostgresStore

COORDINATOR = Path(__file__).resolve().parents[3] / "pepsi_dispatch" / "coordinator"


def port_members(port: type) -> dict[str, Any]:
    """The port's methods and properties, by name."""
    return {
        name: member
        for name, member in vars(port).items()
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }


def mismatches(port: type, store: Any) -> list[str]:
    """Members of ``port`` that ``store`` (an instance) lacks or spells differently."""
    out = []
    for name, member in port_members(port).items():
        if not hasattr(store, name):
            out.append(f"{name}: missing")
        elif isinstance(member, property):
            if callable(getattr(store, name)):
                out.append(f"{name}: a method, not a value")
        elif str(inspect.signature(member)) != str(inspect.signature(getattr(type(store), name))):
            theirs = inspect.signature(getattr(type(store), name))
            out.append(f"{name}{theirs} is not {name}{inspect.signature(member)}")
    return out


def calls_on_the_store(source: str) -> set[str]:
    """Names the code reads off its store: ``db.NAME`` and ``self.db.NAME``."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "db") or (
                isinstance(owner, ast.Attribute) and owner.attr == "db"
            ):
                out.add(node.attr)
    return out


def test_the_port_lists_exactly_the_calls_the_coordinator_makes() -> None:
    """Every call of the coordinator on its store is in the port, and the port
    has no member nobody calls."""
    used: set[str] = set()
    for path in COORDINATOR.rglob("*.py"):
        if path.name not in ("port.py", "postgres.py"):
            used |= calls_on_the_store(path.read_text(encoding="utf-8"))
    assert used == set(port_members(DispatchStore))


def test_the_store_calls_are_found() -> None:
    source = "def f(db):\n    db.claim(1)\n    self.db.round_trip(2)\n    other.db_x()\n"
    assert calls_on_the_store(source) == {"claim", "round_trip"}


def test_the_postgres_store_implements_the_port() -> None:
    assert mismatches(DispatchStore, PostgresStore("postgresql:///none", False)) == []


def test_the_fake_implements_the_port() -> None:
    assert mismatches(DispatchStore, FakeStore()) == []


def test_the_check_reports_a_missing_or_different_member() -> None:
    class Port(Protocol):
        def a(self, x: int) -> int: ...

        def b(self) -> None: ...

        @property
        def c(self) -> bool: ...

    class Store:
        c = True

        def a(self, y: int) -> int:
            return y

    assert mismatches(Port, Store()) == [
        "a(self, y: 'int') -> 'int' is not a(self, x: 'int') -> 'int'",
        "b: missing",
    ]
