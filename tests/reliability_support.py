"""Helpers shared by the fault, reliability and hostile-input tests.

Stores are written with the frozen legacy DDL and the corpus, read back with the stdlib
`sqlite3` (independent of the code under test), and judged by what a user would notice:
the schema, the integrity checks and the answers of the indexes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
from click.testing import CliRunner
from legacy.build import build_legacy_store

from hermes_store.cli import main
from hermes_store.demo import corpus
from hermes_store.revisions import FTS_EXTERNAL_REVISION, fts_head_revision

WORD, TRIGRAM = "messages_fts", "messages_fts_trigram"
INDEXES = (WORD, TRIGRAM)
#: Terms the probes look up in both indexes (all occur in the corpus).
PROBE_TERMS = ("error", "docker", "import", "json", "test", "数据库")


# --------------------------------------------------------------------------------------
# Building stores
# --------------------------------------------------------------------------------------


def build_corpus_store(
    path: Path, messages: int, *, seed: int = 7, max_chars: int | None = 400
) -> Path:
    """A long-lived legacy schema-21 store (inline FTS5, never under Alembic) with a corpus.

    ``max_chars`` caps each message's text so that large message counts stay quick to
    write and copy; the rows keep the corpus's mix of roles, tools, CJK and JSON.
    """
    build_legacy_store(path, 21)
    data = corpus.generate(messages, seed)
    if max_chars is not None:
        for message in data.messages:
            content = message.get("content")
            if isinstance(content, str) and len(content) > max_chars:
                message["content"] = content[:max_chars]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, data)
        conn.commit()
    return path


def drift(path: Path) -> None:
    """Write messages while the FTS triggers are missing: the legacy indexes drift.

    The inline indexes stay consistent with their own copies (their integrity checks
    pass) but no longer match `messages`, so revision 22 must take the rebuild path.
    """
    with contextlib.closing(sqlite3.connect(path)) as conn:
        triggers = conn.execute(
            "SELECT name, sql FROM sqlite_master "
            "WHERE type = 'trigger' AND name LIKE 'messages_fts%'"
        ).fetchall()
        for name, _sql in triggers:
            conn.execute(f"DROP TRIGGER {name}")
        conn.execute("UPDATE messages SET content = content || ' driftword' WHERE id % 97 = 0")
        conn.execute("DELETE FROM messages WHERE id % 101 = 0")
        for _name, sql in triggers:
            conn.execute(sql)
        conn.commit()


def copy_store(source: Path, target: Path) -> Path:
    """Copy a self-contained store file (no -wal) over ``target`` and remove its sidecars."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            Path(f"{target}{suffix}").unlink()
    shutil.copyfile(source, target)
    target.chmod(0o600)
    return target


# --------------------------------------------------------------------------------------
# Reading stores back (plain sqlite3)
# --------------------------------------------------------------------------------------


def rows(path: Path, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Rows of one statement, read with the stdlib driver."""
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
        return conn.execute(sql, params).fetchall()


def scalar(path: Path, sql: str, params: Sequence[Any] = ()) -> Any:
    return rows(path, sql, params)[0][0]


def schema(path: Path) -> frozenset[tuple[str, str, str | None]]:
    """Every schema object as (type, name, sql), rootpages left out."""
    return frozenset(
        (kind, name, sql)
        for kind, name, sql in rows(path, "SELECT type, name, sql FROM sqlite_master")
        if "alembic_version" not in name
    )


def fts_problems(path: Path) -> dict[str, str]:
    """PRAGMA integrity_check plus the FTS5 integrity check (rank 1) of each index."""
    problems: dict[str, str] = {}
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
        result = [row[0] for row in conn.execute("PRAGMA integrity_check")]
        if result != ["ok"]:
            problems["database"] = "; ".join(map(str, result[:5]))
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for index in INDEXES:
            if index not in names:
                continue
            try:
                conn.execute(f"INSERT INTO {index}({index}, rank) VALUES ('integrity-check', 1)")
            except sqlite3.DatabaseError as exc:
                problems[index] = str(exc)
    return problems


def probe(path: Path) -> dict[str, Any]:
    """What the indexes answer (ids per term and index) and what the table holds."""
    answers: dict[str, Any] = {}
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
        answers["messages"] = conn.execute("SELECT count(*), total(id) FROM messages").fetchone()
        for index in INDEXES:
            for term in PROBE_TERMS:
                if index == WORD and not term.isascii():
                    continue
                ids = [
                    r[0]
                    for r in conn.execute(
                        f"SELECT rowid FROM {index} WHERE {index} MATCH ? ORDER BY rowid",
                        (json.dumps(term),),
                    )
                ]
                answers[f"{index}:{term}"] = hashlib.sha256(repr(ids).encode()).hexdigest()
    return answers


@dataclass(frozen=True)
class Snapshot:
    """A store at one revision: what `whole_revision` compares a store with."""

    schema: frozenset[tuple[str, str, str | None]]
    answers: dict[str, Any]


def snapshot(path: Path) -> Snapshot:
    return Snapshot(schema(path), probe(path))


#: The upgrade's change log (see sqlite.migration.verify_ahead), with its triggers' prefix.
CHANGE_LOG = "hermes_store_conversion_changes"

#: The revisions of a schema-21 store in the legacy inline layout: unversioned, or 21.
INLINE_21_REVISIONS = ([], ["21"])
#: The revisions of a schema-21 store converted to external content: 21 with the
#: conversion (fts1), or with the search layout's head (fts2, which on SQLite changes
#: nothing: the same schema), as `upgrade --app-version 21` leaves it.
EXTERNAL_21_REVISIONS = (
    sorted(["21", FTS_EXTERNAL_REVISION]),
    sorted(["21", fts_head_revision()]),
)


def whole_revision(path: Path, at_21: Snapshot, at_22: Snapshot) -> str:
    """Say whether a schema-21 store is wholly inline or wholly converted (else fail).

    'inline': unversioned or at revision 21, the legacy layout; 'external': at revisions 21
    and fts1 (or 21 and the search layout's head, fts2, the same schema on SQLite), the
    converted layout (the search branch never changes schema_version, which stays 21 either
    way); any other set of revisions fails. Wholly: the schema is exactly that state's (tables, FTS
    declarations, shadow tables, view, triggers), both FTS5 integrity checks and PRAGMA
    integrity_check pass, and the indexes answer as that state's reference store does.
    """
    version = scalar(path, "SELECT version FROM schema_version")
    tables = {name for _, name, _ in schema(path)}
    revisions = (
        sorted(r[0] for r in rows(path, "SELECT version_num FROM alembic_version"))
        if "alembic_version" in {r[0] for r in rows(path, "SELECT name FROM sqlite_master")}
        else []
    )
    assert version == 21, f"schema_version is {version}"
    assert revisions in (*INLINE_21_REVISIONS, *EXTERNAL_21_REVISIONS), (
        f"at {revisions}: neither inline 21's revisions nor external's"
    )
    state = "external" if revisions in EXTERNAL_21_REVISIONS else "inline"
    expected = at_21 if state == "inline" else at_22
    found = schema(path)
    if state == "external":  # copies set aside by the conversion, not freed yet: consistent
        found = {item for item in found if not item[1].endswith("_content_retired")}
    else:  # a kill between the verification and the conversion leaves its change log (the
        # next upgrade or optimize removes it): the store is wholly inline all the same
        found = {item for item in found if not item[1].startswith(CHANGE_LOG)}
    assert found == expected.schema, (
        f"at {revisions or 'no revision'} but the schema is neither inline 21's nor external's: "
        f"extra {sorted(found - expected.schema)[:3]}, "
        f"missing {sorted(expected.schema - found)[:3]}"
    )
    if state == "inline":
        assert {f"{WORD}_content", f"{TRIGRAM}_content"} <= tables
    else:
        assert not {f"{WORD}_content", f"{TRIGRAM}_content"} & tables
    assert fts_problems(path) == {}
    assert probe(path) == expected.answers
    return state


# --------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str | Path, env: dict[str, str] | None = None, timeout: float = 120) -> Proc:
    """`python -m hermes_store.cli ...` as a real process."""
    done = subprocess.run(
        [sys.executable, "-m", "hermes_store.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )
    return Proc(done.returncode, done.stdout, done.stderr)


def cli(*args: str | Path, env: dict[str, str] | None = None) -> Proc:
    """The command in this process (click's runner): what a real process would print.

    Anything but click's own exit (an uncaught exception: a traceback for the user) is
    raised here, so the test fails showing it.
    """
    result = CliRunner().invoke(main, [str(a) for a in args], env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Proc(result.exit_code, result.stdout, result.stderr)


def assert_clean_failure(proc: Proc, *fragments: str) -> str:
    """Exit 1 with one `Error: ...` line on stderr that names the problem; no traceback."""
    assert proc.returncode == 1, proc
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def fingerprint(path: Path) -> str:
    """SHA-256 of a file's bytes: proof that a refused command left it alone."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------
# File systems (root only: CI runs as root; elsewhere these tests skip and say why)
# --------------------------------------------------------------------------------------


#: Set (to 1) by CI: a fault test that cannot mount or chattr here fails instead of
#: skipping (as HERMES_REQUIRE_PG does for the PostgreSQL tests).
REQUIRE_FAULTS_ENV = "HERMES_REQUIRE_FAULTS"


def skip_fault_test(reason: str) -> NoReturn:
    """Skip a test that needs a file system fault this machine cannot make, saying why; a
    failure when HERMES_REQUIRE_FAULTS is set."""
    if os.environ.get(REQUIRE_FAULTS_ENV, "") not in ("", "0"):
        pytest.fail(f"{reason} ({REQUIRE_FAULTS_ENV} is set)", pytrace=False)
    pytest.skip(reason)


def _root_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "needs Linux mounts"
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs (CI runs as root)"
    return None


@contextlib.contextmanager
def tmpfs(directory: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted at ``directory`` for the block; skip if impossible."""
    reason = _root_reason()
    if reason:
        skip_fault_test(reason)
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        skip_fault_test(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False, capture_output=True)


def remount_read_only(directory: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True, capture_output=True)


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[Path]:
    """`chattr +i`: not even root may write the file (or create files in the directory)."""
    reason = _root_reason()
    if reason:
        skip_fault_test(reason.replace("mount a tmpfs", "set the immutable attribute"))
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        skip_fault_test(f"chattr +i is not supported here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False, capture_output=True)


@contextlib.contextmanager
def sqlite_temp_directory(directory: Path) -> Iterator[Path]:
    """SQLite's temporary files (savepoint journals, sorts, VACUUM's copy) go to
    ``directory`` in this process for the block.

    `PRAGMA temp_store_directory` sets it process-wide, as SQLITE_TMPDIR does for a process
    that starts with it (SQLite reads the variable once, at start).
    """
    directory.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        conn.execute(f"PRAGMA temp_store_directory = '{directory}'")
        try:
            yield directory
        finally:
            conn.execute("PRAGMA temp_store_directory = ''")


def leave_free(directory: Path, free_bytes: int) -> Path:
    """Fill a file system with one file until about ``free_bytes`` are left."""
    filler = directory / "filler"
    with contextlib.suppress(FileNotFoundError):
        filler.unlink()
    stat = os.statvfs(directory)
    available = stat.f_bavail * stat.f_frsize
    size = max(0, available - free_bytes)
    with filler.open("wb") as handle:
        chunk = b"\0" * (1 << 20)
        while size > 0:
            handle.write(chunk[: min(size, len(chunk))])
            size -= min(size, len(chunk))
    return filler


def free_bytes(directory: Path) -> int:
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize
