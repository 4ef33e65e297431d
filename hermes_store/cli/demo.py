"""The demo command."""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from sqlalchemy import Connection, Engine, inspect

from hermes_store import migrate
from hermes_store.backend import backend_for, backend_of
from hermes_store.cli.common import operator_errors
from hermes_store.cli.output import emit_records, emit_view, say
from hermes_store.cli.progress import progress_lines
from hermes_store.copy import copy_store
from hermes_store.demo import corpus as corpus_mod
from hermes_store.engine import create_store_engine, display_url, make_private_dirs, resolve_url
from hermes_store.errors import (
    NotOnThisDatabase,
    StoreError,
)
from hermes_store.maintenance import human_bytes
from hermes_store.revisions import LAST_APP_VERSION
from hermes_store.search import search_messages
from hermes_store.sqlite.engine import side_files
from hermes_store.sqlite.storage import StorageReport, report_of

#: The database the demo's own store is in (a file): --db names another one.
DEMO_STORE_URL = "sqlite:///demo.db"

DEMO_QUERIES = ("error", "import json", "TODO: fix", "def*", "terminal OR docker", "数据库")


#: The corpus is generated in memory before it is written: a bound that stays a demo.
DEMO_MAX_MESSAGES = 1_000_000


@click.command()
@click.option(
    "--messages",
    "n_messages",
    default=5000,
    show_default=True,
    type=click.IntRange(1, DEMO_MAX_MESSAGES),
)
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write demo.db (default: a new temporary directory). It is kept, and the "
    "last line says how to remove it.",
)
@click.option("--seed", default=0, show_default=True, help="Corpus seed.")
@click.option(
    "--db",
    "db",
    metavar="URL",
    default=None,
    help="Also copy the upgraded store into this empty PostgreSQL database "
    "(postgresql+psycopg://...) and compare the searches on both.",
)
def demo(n_messages: int, directory: Path | None, seed: int, db: str | None) -> None:
    """Build a realistic legacy store, upgrade it, optimize it and compare search results.

    Generates a newest-schema store in the legacy inline layout (never under Alembic), runs
    the real upgrade (adoption, then in-place conversion), `optimize`, and prints the
    storage report before and after and a few searches, each compared hit for hit (every
    hit, snippets included) before and after. With --db URL (an empty PostgreSQL
    database) the upgraded store is then copied into it at head, its storage report
    shown, and the same searches compared on both databases (every hit's id). The store
    is kept: the last line says where, and how to remove it. A failed demo removes what
    it wrote.

    \b
    Examples:
      hermes-store demo --messages 20000 --dir /tmp/hermes-demo
      hermes-store demo --db postgresql+psycopg://hermes@localhost/hermes_demo
    """
    with operator_errors():
        target = _demo_target(db)
        made, path = _demo_files(directory)
        try:
            run_demo(n_messages, path, seed)
            if target is not None:
                run_demo_on_server(path, target)
        except BaseException:
            _remove_demo(made, path)
            raise
    say(f"\n{_demo_files_line(made, path)}", style="bold")


def _demo_files(directory: Path | None) -> tuple[Path | None, Path]:
    """Where the demo writes: ``(the directory it makes, or None, demo.db's path)``.

    Without --dir, a new temporary directory; a --dir that does not exist is made (with
    its missing parents, 0700), and the top-most directory made is returned.
    """
    if directory is None:
        made = Path(tempfile.mkdtemp(prefix="hermes-demo-"))
        return made, made / "demo.db"
    directory = directory.expanduser().absolute()
    top: Path | None = None
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            break
        top = candidate
    path = directory / "demo.db"
    if path.exists():
        raise click.ClickException(f"{path} exists; pass another --dir or remove it")
    if top is not None:
        make_private_dirs(directory)
    return top, path


def _remove_demo(made: Path | None, path: Path) -> None:
    """A failed demo leaves nothing: the directory it made, or its own demo.db files."""
    import shutil

    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        return
    for name in (path, *side_files(path)):
        with contextlib.suppress(FileNotFoundError):
            name.unlink()


def _demo_files_line(made: Path | None, path: Path) -> str:
    """Where the demo's store is, its size, and the command that removes what it wrote."""
    import shlex

    size = sum(name.stat().st_size for name in (path, *side_files(path)) if name.exists())
    removal = (
        f"rm -r {shlex.quote(str(made))}" if made is not None else (f"rm {shlex.quote(str(path))}")
    )
    return f"== the demo store is kept: {path} ({human_bytes(size)}); remove it with `{removal}`"


def _demo_target(db: str | None) -> str | None:
    """The PostgreSQL database the demo copies into: given explicitly, and empty."""
    if db is None:
        return None
    url = resolve_url(db, create_home=False)
    # The demo compares its SQLite store with another database: not with a second file.
    if backend_for(url) is backend_for(DEMO_STORE_URL):
        raise NotOnThisDatabase(
            "demo --db takes a PostgreSQL URL (postgresql+psycopg://...); the SQLite demo "
            "store is written to --dir"
        )
    engine = create_store_engine(url, create=False)
    try:
        with engine.connect() as conn:
            tables = sorted(inspect(conn).get_table_names())
    finally:
        engine.dispose()
    if tables:
        raise StoreError(
            f"{display_url(url)} already holds tables ({', '.join(tables[:5])}"
            f"{', ...' if len(tables) > 5 else ''}); the demo writes into an empty database "
            "only. Nothing was changed"
        )
    return url


def run_demo_on_server(path: Path, url: str) -> None:
    """The demo's PostgreSQL part: copy the store into the empty database, compare."""
    step = progress_lines()
    step(f"copying the upgraded store into {display_url(url)} (hermes-store copy)")
    # The demo compares the searches itself, on every demo query: no sample-search check.
    copied = copy_store(str(path), url, verify=False).rows
    engine = create_store_engine(url, create=False)
    try:
        backend = backend_of(engine)
        backend.optimize(engine)  # the planner's statistics, as an operator would
        report = backend.storage_report(engine)
        say(
            f"\n== copied into PostgreSQL ({display_url(url)}): {copied.get('sessions', 0)} "
            f"sessions, {copied.get('messages', 0)} messages",
            style="bold",
        )
        emit_view(report.view())
        with engine.connect() as conn:
            server_hits = {q: _demo_search(conn, q) for q in DEMO_QUERIES}
    finally:
        engine.dispose()
    sqlite_engine = create_store_engine(str(path), create=False)
    try:
        with sqlite_engine.connect() as conn:
            sqlite_hits = {q: _demo_search(conn, q) for q in DEMO_QUERIES}
    finally:
        sqlite_engine.dispose()
    records = [
        {
            "query": query,
            "sqlite": len(sqlite_hits[query]),
            "postgresql": len(server_hits[query]),
            "result": "same messages" if sqlite_hits[query] == server_hits[query] else "DIFFERENT",
        }
        for query in DEMO_QUERIES
    ]
    emit_records(
        "text",
        records,
        ["query", "sqlite", "postgresql", "result"],
        title="\n== the same searches on SQLite and PostgreSQL (every hit)",
        right=["sqlite", "postgresql"],
    )
    different = [record["query"] for record in records if record["result"] != "same messages"]
    if different:
        raise click.ClickException(
            f"PostgreSQL finds other messages than SQLite for {', '.join(map(repr, different))}"
        )


def _demo_search(conn: Connection, query: str) -> list[int]:
    """The ids of every hit of a query, newest first (rank order differs between the two
    databases, the hit set does not)."""
    return [hit["id"] for hit in search_messages(conn, query, limit=-1, sort="newest")]


def run_demo(n_messages: int, path: Path, seed: int) -> None:
    """The demo's steps (see `demo`), writing the store at ``path`` (which must not exist)."""
    step = progress_lines()
    step(f"generating {n_messages} messages (seed {seed})")
    data = corpus_mod.generate(n_messages, seed)
    step(
        f"writing a legacy schema-{LAST_APP_VERSION} store (inline FTS5, as the Hermes agent "
        "leaves it)"
    )
    migrate.upgrade(str(path), str(LAST_APP_VERSION))
    with contextlib.closing(sqlite3.connect(path)) as raw:
        corpus_mod.populate(raw, data)
        # A store the legacy application wrote was never under Alembic.
        raw.execute("DROP TABLE alembic_version")
        raw.commit()
    engine = create_store_engine(str(path))
    backend = backend_of(engine)
    before = _storage_of(engine)
    with engine.connect() as conn:
        before_hits = {q: _every_hit(conn, q) for q in DEMO_QUERIES}
    say(f"\n== legacy store: {path}", style="bold")
    emit_view(before.view())
    step("upgrading (adopt, then convert in place)")
    started = time.perf_counter()
    upgrade_result = migrate.upgrade(str(path))
    upgraded = time.perf_counter() - started
    step("optimizing (merge, checkpoint, VACUUM)")
    result = backend.optimize(engine, vacuum=True, progress=step).as_dict()
    after = _storage_of(engine)
    with engine.connect() as conn:
        after_hits = {q: _every_hit(conn, q) for q in DEMO_QUERIES}
    engine.dispose()
    say(
        f"\n== upgraded {upgrade_result.from_revision or '(unversioned)'} -> "
        f"{upgrade_result.to_revision} in {upgraded:.2f} s; "
        f"optimize: {human_bytes(result['bytes_before'])} -> {human_bytes(result['bytes_after'])}",
        style="bold",
    )
    emit_view(after.view())
    ratio = after.file_bytes / before.file_bytes if before.file_bytes else 1.0
    say(
        f"\n== size: {human_bytes(before.file_bytes)} -> {human_bytes(after.file_bytes)} "
        f"({ratio:.3f}x)\n",
        style="bold",
    )
    records = [
        {
            "query": query,
            "hits": len(after_hits[query]),
            "result": "identical" if before_hits[query] == after_hits[query] else "DIFFERENT",
        }
        for query in DEMO_QUERIES
    ]
    emit_records(
        "text",
        records,
        ["query", "hits", "result"],
        title="== searches before and after the upgrade (every hit, in order, snippets included)",
        right=["hits"],
    )
    for record in records:
        if record["result"] != "identical":
            raise click.ClickException(f"search results differ for {record['query']!r}")


def _storage_of(engine: Engine) -> StorageReport:
    """The storage report of the demo's own store, the SQLite file it wrote (its file size
    is what the demo compares before and after)."""
    return report_of(engine)


def _every_hit(conn: Connection, query: str) -> list[Any]:
    """Every hit of a query, in rank order (a negative limit is no limit)."""
    return list(search_messages(conn, query, limit=-1))
