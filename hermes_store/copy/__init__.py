"""Copy a whole store to another database (SQLite <-> PostgreSQL), resumably, and verify it.

`copy_store(source, target)` brings the target to what the source holds, table by table
in foreign-key order, keeping every id. The source is only ever read: a SQLite source is
opened through a ``file:...?mode=ro`` URI, a PostgreSQL one in a read-only transaction;
a whole run reads one snapshot of it.

Each run compares before it writes (``hermes_store.copy.rows``): both sides are read in key
order and compared row by row by checksum, so the run knows which source rows the target
lacks, which it holds with other values and which target rows the source no longer
has, and every source value is checked (type, UTF-8, NOT NULL, foreign keys) before the
first write. Then it writes only those, in batches, each committed together with the
progress marker (``state_meta`` ``hermes_store.copy.source``). A first copy writes every
row; a run after a kill -9, Ctrl-C or a lost server, or after the source changed (an
agent writing to it meanwhile), writes what differs: rows added, edited or deleted since
included, whatever their keys. So the same command always converges, and the final pass
of a live move (the agent stopped) writes only what changed since the last run.

Writing order (``hermes_store.copy.write``). Inserts and updates go parents first, table by
table in foreign-key order; deletes go children first, in the reverse order, after the
unique titles and parent links of the rows they replace are cleared; the sessions whose
display order the target's triggers rewrote are compared and written again.

The source, named (``hermes_store.copy.marker``). The marker records the source's name and
what identifies it beyond its name: the file (device and inode) of a SQLite store, the
cluster's system identifier and the database's oid on PostgreSQL, and a sample of rows it
held (keys and the values a row keeps for life). A target holding a copy of another store,
or of another file now at the same path, is refused in one line that names the command
making it a copy of this source (``--restart``).

What the target keeps of its own. `alembic_version` and `schema_version` are written by
the target's own upgrade to the source's revision, not copied. The `state_meta` keys that
describe a database's own search index (`hermes_store.fts_layout`: 'external' on SQLite,
'expression' on PostgreSQL; the deferred-backfill markers; `fts_optimize_available`) keep
the value the target's upgrade wrote; every other key is copied.

Verification (``hermes_store.copy.verify``) reads the target again and compares it with the
snapshot the copy read: checksums of every table and sample searches chosen from the
source's text.

The modules: ``run`` (one run's steps and whose copy the target holds), ``source`` and
``target`` (each side opened and classified before any write), ``marker``, ``rows`` (the
comparison and the checks of the source's values), ``write``, ``verify`` and ``tablesum``.
What reading and writing need on each database (opening the source read-only in one
snapshot, what a target path must be, the message id sequence, key collation, what a
refused batch is called, ANALYZE after a large copy) is asked of the backend: see the
"copy endpoints" of ``hermes_store.backend`` and ``hermes_store/{sqlite,postgresql}/copy.py``.
"""

from hermes_store.copy.rows import CopyProgress, CopyRefused, copied_table, copied_tables
from hermes_store.copy.run import BATCH_ROWS, CopyResult, copy_store
from hermes_store.copy.source import open_source, same_store
from hermes_store.copy.verify import Verification, verify_copy

__all__ = [
    "BATCH_ROWS",
    "CopyProgress",
    "CopyRefused",
    "CopyResult",
    "Verification",
    "copied_table",
    "copied_tables",
    "copy_store",
    "open_source",
    "same_store",
    "verify_copy",
]
