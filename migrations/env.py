"""Alembic environment: connects to $PEPSI_DSN through psycopg directly.

The DSN is a libpq connection string (a URI, possibly with ?host=/socket/dir,
or key=value pairs).  SQLAlchemy never parses it: the engine gets a `creator`
that hands the string to psycopg unchanged.
"""

import os
from logging.config import fileConfig

import psycopg
from alembic import context
from sqlalchemy import create_engine, pool

DEFAULT_DSN = "postgresql:///pepsi"

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def database_dsn() -> str:
    return os.environ.get("PEPSI_DSN") or DEFAULT_DSN


def run_migrations_offline() -> None:
    # Offline mode writes SQL to stdout; the dialect is all it needs.
    context.configure(
        url="postgresql+psycopg://",
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    dsn = database_dsn()
    engine = create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(dsn),
        poolclass=pool.NullPool,
    )
    with engine.connect() as connection:
        # alembic_version stays in public: downgrade base drops schema pepsi
        # entirely, and the version table must outlive it.
        context.configure(connection=connection, transactional_ddl=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
