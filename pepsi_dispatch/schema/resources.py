"""Where the schema files are: inside the installed package, or in the checkout.

A wheel carries ``alembic.ini``, ``migrations/`` and ``sql/`` under
``pepsi_dispatch/_data/`` (copied there by ``setup.py``'s build step). In a
checkout (an editable install, or running from the source tree) they are at the
top of the repository, next to the package, and ``_data`` does not exist. Both
layouts keep ``migrations/`` and ``sql/`` side by side, so
``migrations/sqlfiles.py`` finds ``sql/`` relative to itself in either.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["data_root", "migrations_dir"]

#: the pepsi_dispatch package directory (this module is in its schema/ folder).
_PACKAGE = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    """The directory holding ``migrations/`` and ``sql/`` (package data or checkout)."""
    packaged = _PACKAGE / "_data"
    if (packaged / "migrations" / "env.py").is_file():
        return packaged
    checkout = _PACKAGE.parent
    if (checkout / "migrations" / "env.py").is_file():
        return checkout
    raise FileNotFoundError(
        f"the schema migrations are missing: neither {packaged}/migrations nor"
        f" {checkout}/migrations exists; reinstall pepsi-dispatch"
    )


def migrations_dir() -> Path:
    return data_root() / "migrations"
