"""Whatever an operator types as a URL, a path or an option value: one line, never a traceback.

Every way a store is named (`--db`, `copy --from` / `--to`, `HERMES_STORE_URL`, alembic's
`-x db=`) and every option value of every command is run through click's runner (alembic
through its command API, and a few real `alembic` processes). A refusal is one `Error: ...`
line (click's own usage errors: its short usage message), a password typed in a URL never
shows, and a refused command creates nothing: no store, no HERMES_HOME, no side file.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from alembic.config import Config
from alembic.util import CommandError
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from alembic import command as alembic_command
from hermes_store.cli import every_command, main
from hermes_store.demo import corpus
from hermes_store.engine import ENV_URL, to_url
from hermes_store.errors import StoreError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ALEMBIC_INI = PROJECT_ROOT / "alembic.ini"
#: A password no message may show; it is typed into URLs only.
PASSWORD = "Pw0nlyHere"

#: URLs and paths that once ended in a traceback, or in a message that did not say what to
#: do, and the words their one line must hold.
MALFORMED = {
    "postgresql://u@127.0.0.1:notaport/db": "port",
    "postgresql://u@[::1/x": "port",
    f"postgresql://u:{PASSWORD}@127.0.0.1:notaport/db": "port",
    "postgresql://u@127.0.0.1:99999/db": "port",
    "sqlite:///state.db?timeout=soon": "timeout",
    "sqlite:///state.db?check_same_thread=maybe": "check_same_thread",
    "sqlite+nosuchdriver:///state.db": "sqlite:///",
    "://": "URL",
    "mysql://root@h/db": "runs on SQLite",
    "state\udcff.db": "UTF-8",
    "sqlite:///state\udcfe.db": "UTF-8",
}


# --------------------------------------------------------------------------------------
# What a clean refusal looks like
# --------------------------------------------------------------------------------------


def is_usage_error(lines: list[str]) -> bool:
    """click's own refusal of an option: `Usage: ...`, `Try ... for help.`, `Error: ...`."""
    return len(lines) <= 4 and lines[0].startswith("Usage: ") and lines[-1].startswith("Error: ")


def assert_clean(result: Result, *, password: str | None = PASSWORD) -> list[str]:
    """No traceback, a short stderr, and no password in anything printed; the lines back."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    if password:
        assert password not in output, output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.exit_code != 0:
        assert lines, "a failed command says why"
        assert (len(lines) == 1 and lines[0].startswith("Error: ")) or is_usage_error(lines), (
            result.stderr
        )
    return lines


def assert_one_line(result: Result, *fragments: str) -> str:
    """Exit 1 and exactly one `Error: ...` line naming what is wrong."""
    lines = assert_clean(result)
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def files_under(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


@contextlib.contextmanager
def sandbox() -> Iterator[Path]:
    """A new, empty working directory, and a HERMES_HOME in it that does not exist yet."""
    directory = Path(tempfile.mkdtemp(prefix="hermes-input-"))
    try:
        with contextlib.chdir(directory):
            yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def invoke(args: list[str], env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(main, args, env=env)


# --------------------------------------------------------------------------------------
# The URLs that once ended in a traceback
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_url_is_one_line_that_says_what_to_fix(url: str) -> None:
    with sandbox() as directory:
        home = directory / "home"
        env: dict[str, str | None] = {"HERMES_HOME": str(home)}
        for args, variables in (
            (["current", "--db", url], env),
            (["stats"], {**env, ENV_URL: url}),
            (["copy", "--from", url, "--to", str(directory / "copy.db")], env),
            (["copy", "--from", str(directory / "missing.db"), "--to", url], env),
        ):
            line = assert_one_line(invoke(args, variables))
            if args[0] != "copy" or args[2] == url:  # copy names the missing source first
                assert MALFORMED[url].lower() in line.lower(), (url, line)
        assert files_under(directory) == []


def test_the_library_raises_a_domain_error_for_a_bad_port() -> None:
    with pytest.raises(StoreError, match="notaport") as raised:
        to_url(f"postgresql://u:{PASSWORD}@127.0.0.1:notaport/db")
    assert PASSWORD not in str(raised.value)


@pytest.mark.parametrize("option", ["mode=bogus", "vfs=nosuchvfs", "cache=sometimes"])
def test_a_uri_option_sqlite_refuses_is_one_line_naming_it(option: str, tmp_path: Path) -> None:
    store = tmp_path / "state.db"
    assert invoke(["upgrade", "--create", "--db", str(store)]).exit_code == 0
    before = files_under(tmp_path)
    url = f"sqlite:///file:{store}?{option}&uri=true"
    for command in (["current"], ["stats"], ["optimize"]):
        assert_one_line(invoke([*command, "--db", url]), option.split("=")[1], "drop")
    assert files_under(tmp_path) == before


def test_an_empty_db_option_is_refused_rather_than_read_as_the_default() -> None:
    with sandbox() as directory:
        result = invoke(["current", "--db", ""], {"HERMES_HOME": str(directory / "home")})
        lines = assert_clean(result)
        assert result.exit_code == 2
        assert is_usage_error(lines)
        assert "--db" in lines[-1]
        assert "empty" in lines[-1]
        assert files_under(directory) == []


# --------------------------------------------------------------------------------------
# alembic -x db=...
# --------------------------------------------------------------------------------------


def alembic_config(url: str) -> Config:
    """What `alembic -c alembic.ini -x db=URL` builds, without reconfiguring logging."""
    config = Config(str(ALEMBIC_INI))
    config.cmd_opts = argparse.Namespace(x=[f"db={url}"])
    config.attributes["configure_logging"] = False
    return config


def assert_alembic_refuses_cleanly(url: str) -> str | None:
    """`alembic current` either answers or raises CommandError (one `FAILED: ...` line
    from the alembic command); anything else would be a traceback."""
    try:
        alembic_command.current(alembic_config(url))
    except CommandError as exc:
        message = str(exc)
        assert "\n" not in message.strip(), message
        assert PASSWORD not in message
        return message
    return None


@pytest.mark.parametrize("url", MALFORMED, ids=range(len(MALFORMED)))
def test_alembic_x_db_refuses_a_malformed_url_in_one_line(url: str) -> None:
    with sandbox() as directory, _home(directory / "home"):
        message = assert_alembic_refuses_cleanly(url)
        assert message is not None
        assert files_under(directory) == []


@contextlib.contextmanager
def _home(path: Path) -> Iterator[None]:
    old = {name: os.environ.get(name) for name in ("HERMES_HOME", ENV_URL)}
    os.environ["HERMES_HOME"] = str(path)
    os.environ.pop(ENV_URL, None)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.mark.parametrize(
    "url", ["postgresql://u@127.0.0.1:notaport/db", "sqlite:///state.db?timeout=soon"]
)
def test_alembic_in_a_real_process_says_failed_in_one_line(url: str, tmp_path: Path) -> None:
    tmp_path = tmp_path / "work"
    tmp_path.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ALEMBIC_INI), "-x", f"db={url}", "current"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HERMES_HOME": str(tmp_path / "home")},
        timeout=120,
        check=False,
    )
    # alembic's own way: `FAILED: <message>` (and its logger's ERROR line on stderr), exit 255.
    assert done.returncode != 0, done
    assert "Traceback" not in done.stderr + done.stdout
    printed = (done.stdout + done.stderr).splitlines()
    failed = [line for line in printed if line.startswith("FAILED: ")]
    assert len(failed) == 1, printed
    message = failed[0].removeprefix("FAILED: ")
    others = [line for line in printed if line.strip() and line != failed[0]]
    assert all(line.endswith(message) for line in others), printed
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------
# Any URL, any option value (hypothesis)
# --------------------------------------------------------------------------------------

#: What argv and the environment can carry: any character but NUL, and the lone surrogates
#: U+DC80..U+DCFF that stand for bytes that are not UTF-8 (Python's surrogateescape).
ARGV_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF),
    ),
    max_size=24,
)
SCHEMES = st.sampled_from(
    [
        "sqlite",
        "sqlite+pysqlite",
        "sqlite+nosuch",
        "postgresql",
        "postgres",
        "postgresql+psycopg",
        "postgresql+psycopg2",
        "mysql",
        "SQLite",
        "file",
        "",
    ]
)
#: Local or malformed hosts only: a test must not wait on name resolution.
HOSTS = st.sampled_from(["127.0.0.1", "localhost", "[::1]", "[::1", "::1]", "", "a b", "%zz"])
PORTS = st.one_of(
    st.none(),
    st.sampled_from(["notaport", "", "-1", "0", "1", "99999", "5432", "١٢"]),
    ARGV_TEXT,
)
QUERY_KEYS = st.sampled_from(
    [
        "timeout",
        "check_same_thread",
        "uri",
        "mode",
        "vfs",
        "immutable",
        "cache",
        "sslmode",
        "connect_timeout",
        "options",
        "application_name",
        "foo",
    ]
)
QUERY_VALUES = st.one_of(
    st.sampled_from(["", "ro", "rw", "rwc", "memory", "1", "0", "true", "yes", "-5", "1e999"]),
    ARGV_TEXT,
)


@st.composite
def store_names(draw: st.DrawFn) -> str:
    """A URL made of plausible and broken parts, or any text as a path (relative: it stays
    in the sandbox)."""
    if draw(st.booleans()):
        path = draw(ARGV_TEXT)
        return path.lstrip("/~") or "x"
    scheme = draw(SCHEMES)
    user = draw(st.sampled_from(["", "u", "postgres", "u:", f"u:{PASSWORD}", "%zz"]))
    host = draw(HOSTS)
    port = draw(PORTS)
    authority = f"{user}@{host}" if user else host
    if port is not None:
        authority += f":{port}"
    database = draw(ARGV_TEXT).lstrip("/")
    query = draw(st.lists(st.tuples(QUERY_KEYS, QUERY_VALUES), max_size=3))
    url = f"{scheme}://{authority}/{database}"
    if query:
        url += "?" + "&".join(f"{key}={value}" for key, value in query)
    return url


INPUT_SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@INPUT_SETTINGS
@given(name=store_names())
@example(name="postgresql://u@127.0.0.1:notaport/db")
@example(name="postgresql://u@[::1/x")
@example(name="sqlite:///x.db?timeout=soon")
@example(name="state\udcff.db")
def test_any_store_name_is_answered_in_one_line_and_creates_nothing(name: str) -> None:
    with sandbox() as directory:
        env: dict[str, str | None] = {"HERMES_HOME": str(directory / "home")}
        for args, variables in (
            (["current", "--db", name], env),
            (["stats", "--json"], {**env, ENV_URL: name}),
            (["copy", "--from", name, "--to", str(directory / "copy.db")], env),
            (["copy", "--from", str(directory / "missing.db"), "--to", name], env),
        ):
            result = invoke(args, variables)
            assert_clean(result)
            # Nothing here names an existing store: every command refuses.
            assert result.exit_code != 0, (args, result.output)
        assert_alembic_refuses_cleanly_in(directory, name)
        assert files_under(directory) == []


def assert_alembic_refuses_cleanly_in(directory: Path, url: str) -> None:
    with _home(directory / "home"):
        assert_alembic_refuses_cleanly(url)


def _option_names() -> dict[str, list[click.Option]]:
    """Each command's options that take a value (flags take none), by command name."""
    options: dict[str, list[click.Option]] = {}
    for name, command in every_command().items():
        options[name] = [
            param
            for param in command.params
            if isinstance(param, click.Option) and not param.is_flag and not param.hidden
        ]
    return options


OPTIONS = _option_names()
#: Arguments each command needs; the store they name never exists, so every command
#: refuses after parsing its options, before it does anything.
REQUIRED = {
    "search": ["some words"],
    "downgrade": ["21", "--yes"],
    "stamp": ["head"],
    "copy": ["--from", "missing.db", "--to", "target.db"],
}


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    """A command, one to three of its options with any value, and a store that is missing."""
    name = draw(st.sampled_from(sorted(OPTIONS)))
    args = [name, *REQUIRED.get(name, [])]
    choices = [option for option in OPTIONS[name] if option.name != "db"]
    for option in draw(st.lists(st.sampled_from(choices), max_size=3)) if choices else []:
        value = draw(st.one_of(ARGV_TEXT, st.integers().map(str), st.sampled_from(["-1", "0"])))
        args += [option.opts[-1], value]
    if (
        name == "demo" or name != "copy"
    ):  # demo makes its own store: --db only names a server to copy to
        args += ["--db", "missing.db"]
    return args


@INPUT_SETTINGS
@given(args=command_lines())
@example(args=["search", "x", "--limit", "abc", "--db", "missing.db"])
@example(args=["demo", "--messages", "0", "--db", "missing.db"])
@example(args=["upgrade", "--app-version", "x", "--db", "missing.db"])
def test_any_option_value_is_answered_in_one_line_and_creates_nothing(args: list[str]) -> None:
    with sandbox() as directory:
        result = invoke(args, {"HERMES_HOME": str(directory / "home")})
        assert_clean(result)
        if args[0] != "history":  # history lists the revisions without a store
            assert result.exit_code != 0, (args, result.output)
        assert files_under(directory) == []


#: Commands that only read a store, and the flags they may take here (--repair writes).
READING = ("current", "stats", "storage", "check", "search", "history")


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store at head with a few hundred messages, which the reading commands only read."""
    path = tmp_path_factory.mktemp("input") / "state.db"
    assert invoke(["upgrade", "--create", "--db", str(path)]).exit_code == 0
    with contextlib.closing(sqlite3.connect(path)) as conn:
        corpus.populate(conn, corpus.generate(120, 3))
        conn.commit()
    return path


@st.composite
def reading_command_lines(draw: st.DrawFn) -> list[str]:
    """A reading command with any values (and flags) of its options."""
    name = draw(st.sampled_from(READING))
    command = every_command()[name]
    args = [name, *(["some words"] if name == "search" else [])]
    params = [
        param
        for param in command.params
        if isinstance(param, click.Option) and param.name not in ("db", "repair_")
    ]
    for option in draw(st.lists(st.sampled_from(params), max_size=4)):
        args.append(option.opts[-1])
        if not option.is_flag:
            args.append(draw(st.one_of(ARGV_TEXT, st.integers().map(str))))
    return args


@INPUT_SETTINGS
@given(args=reading_command_lines())
@example(args=["search", "-docker", "--limit", "0"])
@example(args=["search", "some words", "--sort", "sideways"])
@example(args=["check", "--backup", "x.db"])
def test_any_option_value_of_a_reading_command_changes_nothing(
    args: list[str], small_store: Path
) -> None:
    before = (small_store.read_bytes(), files_under(small_store.parent))
    result = invoke([*args, "--db", str(small_store)])
    assert_clean(result)
    assert (small_store.read_bytes(), files_under(small_store.parent)) == before


# --------------------------------------------------------------------------------------
# A password typed into a URL never shows
# --------------------------------------------------------------------------------------


@pytest.mark.postgresql
def test_a_password_in_a_url_shows_nowhere(
    pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The test server trusts every login, so the password is sent and ignored; every
    command through a URL that holds it, logging at DEBUG, and what copy records."""
    caplog.set_level(logging.DEBUG)
    with_password = make_url(pg_url).set(password=PASSWORD).render_as_string(hide_password=False)
    source = tmp_path / "source.db"
    assert invoke(["upgrade", "--create", "--db", str(source)]).exit_code == 0
    back = tmp_path / "back.db"
    runs = [
        invoke(["-vv", "copy", "--from", str(source), "--to", with_password]),
        invoke(["-vv", "current", "--db", with_password]),
        invoke(["-vv", "stats", "--db", with_password, "--json"]),
        invoke(["-vv", "copy", "--from", with_password, "--to", str(back), "--json"]),
        invoke(["-vv", "check", "--db", with_password]),
    ]
    for result in runs:
        assert result.exit_code == 0, result.output
        assert_clean(result)
    said = [record.getMessage() for record in caplog.records]
    assert said, "the commands log at DEBUG"
    assert not [message for message in said if PASSWORD in message]
    with contextlib.closing(sqlite3.connect(back)) as conn:
        recorded = conn.execute("SELECT key, value FROM state_meta").fetchall()
    assert recorded
    assert not [row for row in recorded if PASSWORD in str(row)]


@pytest.mark.parametrize(
    "args",
    [
        ["downgrade", "21", "--yes", "--backup", "-0", "--backup", "\r", "--db", "missing.db"],
        ["search", "--limit", "x\ny", "words"],
        ["current", "--db", "a.db", "extra\u2028argument"],
    ],
)
def test_a_usage_error_stays_on_one_line_whatever_was_typed(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """click quotes what was typed in its usage errors; a line break in it is escaped."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = invoke(args)
    assert result.exit_code == 2
    lines = assert_clean(result)
    assert is_usage_error(lines)
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("command", [["upgrade", "--revision"], ["downgrade", "--yes"], ["stamp"]])
@pytest.mark.parametrize("name", ["", " "])
def test_an_empty_revision_is_refused_in_one_line(
    command: list[str], name: str, small_store: Path
) -> None:
    before = small_store.read_bytes()
    result = invoke([*command, name, "--db", str(small_store)])
    assert result.exit_code in (1, 2)
    [line] = assert_clean(result)
    assert "hermes-store history" in line
    assert small_store.read_bytes() == before
