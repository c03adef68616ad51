"""The database schema from an installed wheel: migrations and where their files are."""
