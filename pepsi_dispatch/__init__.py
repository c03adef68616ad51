"""pepsi-dispatch: a PostgreSQL-backed coordinator driving messages through pipeline stages."""

__version__ = "0.1.0"
