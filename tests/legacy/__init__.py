"""Legacy Hermes session stores (schema 17 to 30) built from frozen literal DDL.

`ddl` holds the SQL the legacy application ran, `build` writes legacy store files with the
stdlib `sqlite3`, and `schema` compares databases semantically (column order ignored).
"""
