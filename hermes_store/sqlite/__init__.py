"""SQLite backend: everything that is particular to a SQLite store file."""
