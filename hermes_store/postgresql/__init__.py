"""PostgreSQL backend: everything that is particular to a PostgreSQL store."""
