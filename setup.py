"""Build step: ship the schema (alembic.ini, migrations/, sql/), the man pages and the
systemd unit in the wheel.

The repository keeps ``alembic.ini``, ``migrations/`` and ``sql/`` at its top
level (``alembic upgrade head`` and ``pg_prove`` run from there). A wheel has no
top level, so ``build_py`` copies them into ``pepsi_dispatch/_data/`` of the
build; :mod:`pepsi_dispatch.schema.resources` looks there first, then in the checkout.
Editable installs skip the copy: they run from the checkout anyway. The man
pages go to ``share/man/man1`` and ``share/man/man5`` of the installation prefix
(a venv: ``/opt/pepsi/share/man``), the unit to
``share/pepsi-dispatch/systemd/pepsi-dispatch.service``.

Everything else is declared in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SCHEMA = ("alembic.ini", "migrations", "sql")
SHARED = {
    "share/man/man1": ["man/pepsi-dispatch.1", "man/pepsi-queue.1", "man/pepsi-httpd.1"],
    "share/man/man5": ["man/pepsi.conf.5"],
    "share/pepsi-dispatch/systemd": [
        "contrib/systemd/pepsi-dispatch.service",
        "contrib/systemd/pepsi-httpd.service",
    ],
}


class build_py_with_schema(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "pepsi_dispatch" / "_data"
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for name in SCHEMA:
            src = HERE / name
            if src.is_dir():
                shutil.copytree(src, target / name, ignore=ignore)
            else:
                shutil.copy2(src, target / name)


setup(
    cmdclass={"build_py": build_py_with_schema},
    data_files=[(d, [f for f in files if (HERE / f).is_file()]) for d, files in SHARED.items()],
)
